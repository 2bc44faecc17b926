"""The TCP connection: a :class:`~hpcsched.core.comm.base.Comm` over a non-blocking socket.

See :mod:`hpcsched.core.comm.tcp` for how sending, receiving and closing work.
Socket reads, TLS and the selector registration belong to the I/O thread
(:mod:`~hpcsched.core.comm.tcp_io`); user threads only queue bytes to send
(writing them at once when nothing else is queued) and take decoded messages.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections import deque
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm import tcp_io
from hpcsched.core.comm.base import Comm, CommClosedError, Inbox
from hpcsched.core.comm.tcp_frames import FrameDecoder, FrameError, encode_header, frame_nbytes
from hpcsched.core.comm.tcp_io import READ, WRITE
from hpcsched.core.comm.tcp_security import WIRE_CHUNK, TLSCodec
from hpcsched.core.protocol import serialize
from hpcsched.core.settings import CommSettings

logger = logging.getLogger("hpcsched.comm")

SMALL_MESSAGE = 64 * 1024  # below this, header + frames are joined into one buffer
IOV_MAX = 512  # buffers per sendmsg call (the kernel limit is 1024)
READS_PER_EVENT = 16  # then let other sockets have a turn
CLOSE_LINGER = 5.0  # seconds a closed comm keeps sending what was queued


def _as_bytes_view(frame: Any) -> memoryview:
    v = frame if isinstance(frame, memoryview) else memoryview(frame)
    return v if v.format == "B" and v.ndim == 1 else v.cast("B")


class TCPComm(Comm):
    """One framed connection. ``send`` from any thread; ``recv`` from one reader, or
    ``deliver_to`` an inbox. Socket reads happen on the I/O thread only."""

    def __init__(self, io: tcp_io.IOThread, sock: socket.socket, tls: TLSCodec | None,
                 local: str, peer: str, leftover: bytes = b"", unsent: bytes = b""):
        self._io = io
        self._sock = sock
        self._tls = tls
        self.local_address = local
        self.peer_address = peer
        settings = config.read(CommSettings)
        self._max_frames = int(settings.max_frames)
        self._max_frame_bytes = int(settings.max_frame_bytes)
        self._max_queued = int(settings.max_send_queue_bytes)
        self._message_timeout = float(settings.message_timeout)
        self._decoder = FrameDecoder(self._max_frames, self._max_frame_bytes)
        self._leftover = leftover
        # sending, under _send_lock: plain -> wire bytes; TLS -> plaintext to encrypt
        self._send_lock = threading.Lock()
        self._out: deque[memoryview] = deque()
        self._out_bytes = 0
        self._writing = False  # the I/O thread is flushing _out (watching for WRITE)
        self._wire = bytearray()  # TLS: encrypted, not yet written (I/O thread)
        if unsent:  # the end of the handshake, already encoded for the wire
            if tls is None:
                self._out.append(memoryview(unsent))
                self._out_bytes = len(unsent)
            else:
                self._wire += unsent
            self._writing = True
        # receiving, under _recv_cond
        self._recv_cond = threading.Condition(threading.Lock())
        self._inq: deque = deque()
        self._target: tuple[Any, Any, Any] | None = None
        self._marker_sent = False
        # state
        self._closed = False  # for the user: no more send / recv
        self._closed_by_us = False
        self._reason = ""
        self._gone = False  # socket closed and the I/O thread released (I/O thread)
        self._draining = False  # closed by us, write side shut: wait for the peer's EOF
        self._events = 0
        self._timer: tcp_io.Timer | None = None  # message timeout
        self._linger: tcp_io.Timer | None = None

    # ------------------------------------------------------------ state
    @property
    def closed(self) -> bool:
        return self._closed

    def _mark_closed(self, reason: str, by_us: bool = False) -> bool:
        """Close for the user (any thread); False if it already was."""
        with self._send_lock:
            if self._closed:
                return False
            self._closed = True
            self._closed_by_us = by_us
            self._reason = reason
        with self._recv_cond:
            self._recv_cond.notify_all()
            target = self._target
            if target is None or self._marker_sent:
                return True
            self._marker_sent = True
            # nothing is delivered after the marker: let go of the inbox and the source,
            # which name this comm as a rule (a worker's inbox for a peer does); kept, the
            # cycle would hold every closed comm, its buffers and its socket object, until
            # the collector's next full pass, and a worker of a large cluster closes peer
            # comms all the time
            self._target = None
        if self._io.on_thread():  # after the messages handed over in this round
            self._io.deliver(target[0], (target[1], target[2]))
        else:
            target[0].put((target[1], target[2]))
        return True

    def close(self) -> None:
        if self._mark_closed("closed", by_us=True):
            self._io.call_soon(self._shutdown)

    def _fail(self, reason: str, log: bool = False) -> CommClosedError:
        """The connection is unusable: close now, dropping what was queued (any thread)."""
        if log:
            logger.warning("closing comm with %s: %s", self.peer_address, reason)
        self._mark_closed(reason)
        if self._io.on_thread():
            self._teardown()
        else:
            self._io.call_soon(self._teardown)
        return CommClosedError(f"{self!r}: {reason}")

    def _closed_error(self) -> CommClosedError:
        if self._closed_by_us:
            return CommClosedError(f"{self!r} is closed")
        return CommClosedError(f"{self!r}: {self._reason}")

    # ------------------------------------------------------------ I/O thread: lifecycle
    def start(self) -> None:
        """Register with the I/O thread (on it); called once by whoever created the comm."""
        if self._closed and not self._closed_by_us:
            self._teardown()
            return
        self._events = READ | (WRITE if self._wire or self._writing else 0)
        self._io.register(self._sock, self._events, self)
        if self._leftover:
            data, self._leftover = self._leftover, b""
            self._received(data)
        if self._tls is not None:
            self._on_readable()  # plaintext may already wait in the codec
        if self._closed_by_us:
            self._shutdown()

    def _set_events(self, events: int) -> None:
        if events != self._events and not self._gone:
            self._events = events
            self._io.modify(self._sock, events, self)

    def _shutdown(self) -> None:
        """After ``close``: flush what is queued, then shut the write side."""
        if self._gone or self._draining:
            return
        if self._linger is None:
            self._linger = self._io.call_later(CLOSE_LINGER, self._teardown)
        with self._send_lock:
            pending = bool(self._out) or bool(self._wire)
            if pending:
                self._writing = True
        if pending:
            self._set_events(READ | WRITE)
            self._on_writable()
            return
        self._draining = True
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._teardown()

    def _teardown(self) -> None:
        if self._gone:
            return
        self._gone = True
        for t in (self._timer, self._linger):
            if t is not None:
                t.cancel()
        self._io.unregister(self._sock)
        self._sock.close()
        with self._send_lock:
            self._out.clear()
            self._out_bytes = 0
        self._io.release()

    def on_event(self, mask: int) -> None:
        if mask & WRITE and not self._gone:
            self._on_writable()
        if mask & READ and not self._gone:
            self._on_readable()

    # ------------------------------------------------------------ sending
    def send(self, msg: Any) -> None:
        frames = serialize.dumps(msg)  # SerializationError leaves the comm usable
        lengths = [frame_nbytes(f) for f in frames]
        header = encode_header(lengths, self._max_frames, self._max_frame_bytes)
        total = len(header) + sum(lengths)
        if total <= SMALL_MESSAGE:
            bufs = [memoryview(header + b"".join(frames))]
        else:
            bufs = [memoryview(header), *(_as_bytes_view(f) for f in frames if len(f))]
        error: OSError | None = None
        too_much = 0
        with self._send_lock:
            if self._closed:
                raise self._closed_error()
            if self._out_bytes > self._max_queued:
                too_much = self._out_bytes
            else:
                self._out.extend(bufs)
                self._out_bytes += total
                if self._writing:
                    return  # the I/O thread is flushing: it takes these too, in order
                if self._tls is None:
                    try:
                        if self._write_some():
                            return
                    except OSError as e:
                        error = e
                if error is None:
                    self._writing = True
        if too_much:
            raise self._fail(f"{too_much} bytes are queued for a peer that is not reading "
                             f"(limit comm.max-send-queue-bytes={self._max_queued})", log=True)
        if error is not None:
            raise self._fail(f"send failed: {error}")
        self._io.call_soon(self._start_writing)

    def _write_some(self) -> bool:
        """Write queued plain bytes without blocking (under _send_lock); True when all went."""
        out = self._out
        sock = self._sock
        while out:
            bufs = list(itertools.islice(out, IOV_MAX))
            try:
                sent = sock.sendmsg(bufs)
            except (BlockingIOError, InterruptedError):
                return False
            self._out_bytes -= sent
            short = sent < sum(b.nbytes for b in bufs)
            while sent:
                n = out[0].nbytes
                if sent >= n:
                    sent -= n
                    out.popleft()
                else:
                    out[0] = out[0][sent:]
                    sent = 0
            if short:
                return False  # the kernel's buffer is full
        return True

    def _start_writing(self) -> None:
        if not self._gone:
            self._set_events(READ | WRITE)
            self._on_writable()

    def _on_writable(self) -> None:
        try:
            done = self._flush_plain() if self._tls is None else self._flush_tls()
        except OSError as e:
            self._fail(f"connection lost: {e}")
            return
        if done:
            self._set_events(READ)
            if self._closed_by_us and not self._gone:
                self._shutdown()

    def _flush_plain(self) -> bool:
        with self._send_lock:
            done = self._write_some()
            if done:
                self._writing = False
            return done

    def _flush_tls(self) -> bool:
        tls = self._tls
        assert tls is not None
        while True:
            if self._wire:
                try:
                    n = self._sock.send(self._wire)
                except (BlockingIOError, InterruptedError):
                    return False
                del self._wire[:n]
                if self._wire:
                    return False
            with self._send_lock:
                if not self._out:
                    self._writing = False
                    return True
                chunk = self._out.popleft()
                self._out_bytes -= chunk.nbytes
            try:
                tls.write(chunk)
            except Exception as e:  # ssl.SSLError: the session is broken
                raise OSError(f"TLS write failed: {e}") from e
            self._wire += tls.wire_out()

    # ------------------------------------------------------------ receiving
    def _on_readable(self) -> None:
        if self._tls is not None:
            self._read_tls()
            return
        decoder = self._decoder
        sock = self._sock
        eof = False
        for _ in range(READS_PER_EVENT):
            buf = decoder.get_buffer()
            try:
                n = sock.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self._lost(f"connection lost: {e}")
                return
            if n == 0:
                eof = True
                break
            try:
                decoder.buffer_updated(n)
            except FrameError as e:
                self._fail(str(e), log=True)
                return
            if n < buf.nbytes:
                break
        self._after_read(eof)

    def _read_tls(self) -> None:
        tls = self._tls
        assert tls is not None
        eof = False
        try:
            data = self._sock.recv(WIRE_CHUNK)
        except (BlockingIOError, InterruptedError):
            data = None
        except OSError as e:
            self._lost(f"connection lost: {e}")
            return
        if data is not None:
            tls.feed(data)
        try:
            while True:
                n = tls.read_into(self._decoder.get_buffer())
                if n is None:
                    break
                if n == 0:
                    eof = True
                    break
                self._decoder.buffer_updated(n)
        except FrameError as e:
            self._fail(str(e), log=True)
            return
        except Exception as e:  # ssl.SSLError: a corrupted or forged record
            self._fail(f"TLS error: {e}", log=True)
            return
        out = tls.wire_out()  # records a read produced (TLS 1.3 tickets, key updates)
        if out:
            self._wire += out
            with self._send_lock:
                self._writing = True
            self._set_events(READ | WRITE)
        self._after_read(eof or data == b"")

    def _received(self, data: bytes) -> None:
        try:
            self._decoder.feed(data)
        except FrameError as e:
            self._fail(str(e), log=True)
            return
        self._after_read(False)

    def _after_read(self, eof: bool) -> None:
        msgs = self._decoder.take()
        if msgs and not self._closed:
            self._deliver(msgs)
        if self._gone:
            return
        if msgs or not self._decoder.in_message:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self._decoder.in_message and self._timer is None and not eof:
            self._timer = self._io.call_later(self._message_timeout, self._message_too_slow)
        if eof:
            if self._draining or self._closed_by_us:
                self._teardown()
            else:
                self._lost("peer closed the connection")

    def _message_too_slow(self) -> None:
        self._timer = None
        self._fail(f"a message started more than {self._message_timeout}s ago is still "
                   f"incomplete (limit comm.timeouts.message={self._message_timeout})", log=True)

    def _lost(self, reason: str) -> None:
        self._mark_closed(reason)
        self._teardown()

    def _deliver(self, msgs: list) -> None:
        with self._recv_cond:
            target = self._target
            if target is None:
                self._inq.extend(msgs)
                self._recv_cond.notify()
                return
        inbox, source, _ = target
        for frames in msgs:
            try:
                msg = serialize.loads(frames)
            except serialize.SerializationError as e:
                self._fail(f"undecodable message: {e}", log=True)
                return
            self._io.deliver(inbox, (source, msg))

    def recv(self, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._recv_cond:
            while True:
                if self._closed_by_us:
                    raise self._closed_error()
                if self._inq:
                    frames = self._inq.popleft()
                    break
                if self._closed:
                    raise self._closed_error()
                if deadline is None:
                    self._recv_cond.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"no message on {self!r} within {timeout}s")
                    self._recv_cond.wait(left)
        try:
            return serialize.loads(frames)
        except serialize.SerializationError as e:
            raise self._fail(f"undecodable message: {e}", log=True) from e

    def deliver_to(self, inbox: Inbox, source: Any, closed_marker: Any) -> None:
        """From now on the I/O thread unpickles each message and hands it to ``inbox``
        with ``offer_batch``, batched per round of events (sends never block it: they
        are queued per connection); messages queued before go first."""
        with self._recv_cond:
            pending = list(self._inq)
            self._inq.clear()
            error: serialize.SerializationError | None = None
            for i, frames in enumerate(pending):
                try:
                    inbox.put((source, serialize.loads(frames)))
                except serialize.SerializationError as e:
                    error = e
                    self._inq.extend(pending[i + 1:])  # dropped with the comm
                    break
            ended = self._closed and not self._marker_sent
            if ended:
                self._marker_sent = True
            elif not self._closed:  # a closed comm delivers nothing more (_mark_closed)
                self._target = (inbox, source, closed_marker)
        if error is not None:
            self._fail(f"undecodable message: {error}", log=True)
        elif ended:
            inbox.put((source, closed_marker))


def format_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
