"""``tcp://host:port`` (and ``tls://``): authenticated, framed messages over TCP sockets.

Wire format of one message (all integers little-endian)::

    b"HSm1"  nframes:uint32  len_0:uint64 ... len_{n-1}:uint64  frame_0 ... frame_{n-1}

where the frames are :func:`hpcsched.core.serialize.dumps` of the message.
Large frames are sent straight from the sender's buffers (``sendmsg`` of
memoryviews) and received with ``recv_into`` into a fresh buffer per frame,
so a numpy array unpickles on top of the bytes the kernel wrote: no copies.
Small messages go out in one ``sendall`` and are parsed out of a reusable
receive buffer, so a round trip costs few system calls.

Every connection starts with a handshake, bounded by ``comm.timeouts.handshake``:

1. server -> client, in clear: ``b"HPCS" version flags nonce[32]``; ``flags``
   says whether TLS follows and whether a shared secret is required, so a
   client whose settings differ fails at once with a clear message.
2. (TLS handshake, if the flag is set.)
3. client -> server: ``b"HPCS" version flags client_nonce[32] mac[32]`` with
   ``mac = HMAC-SHA256(secret, b"client" + nonce + client_nonce)``.
4. server -> client: ``accepted:uint8 proof[32]`` with
   ``proof = HMAC-SHA256(secret, b"server" + client_nonce + nonce)``; the client
   checks it, so both sides prove they hold the secret without sending it.

Without a secret the macs are zeros and only the flags are compared. A peer
that fails the handshake, stays silent, or later sends a malformed frame is
dropped and logged on ``hpcsched.comm``; the listener keeps serving.

TLS uses :class:`ssl.SSLObject` over memory BIOs rather than ``SSLSocket``:
one thread reads while others write, and an OpenSSL connection must not be
used by two threads at once, so every use of it is under a lock.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from hpcsched.core import config, serialize
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import (
    Backend,
    Comm,
    CommClosedError,
    HandshakeError,
    Listener,
    Security,
    parse_address,
    parse_host_port,
)
from hpcsched.core.comm.tcp_security import (  # noqa: F401
    BUFFER_SIZE,
    IOV_MAX,
    _client_context,
    _client_handshake,
    _PlainStream,
    _Refused,
    _server_context,
    _server_handshake,
    _TLSStream,
    _tune,
)

logger = logging.getLogger("hpcsched.comm")

MSG_MAGIC = b"HSm1"  # message magic; the last byte is the framing version
_MSG_HEAD = struct.Struct("<4sI")

SMALL_MESSAGE = 64 * 1024  # below this, header + frames are joined and sent in one call
COPY_LIMIT = 64 * 1024  # frames up to this size are copied out of the receive buffer
MAX_PENDING_HANDSHAKES = 256  # more concurrent unauthenticated peers are turned away

_lengths_structs: dict[int, struct.Struct] = {}


def _lengths_struct(n: int) -> struct.Struct:
    s = _lengths_structs.get(n)
    if s is None:
        s = struct.Struct(f"<{n}Q")
        if n <= 64:
            _lengths_structs[n] = s
    return s



def _format_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------- the comm
class TCPComm(Comm):
    """One framed connection; ``send`` from any thread, ``recv`` from one reader."""

    def __init__(self, sock: socket.socket, stream: _PlainStream | _TLSStream, local: str,
                 peer: str):
        self._sock = sock
        self._stream = stream
        self._tls = isinstance(stream, _TLSStream)
        self.local_address = local
        self.peer_address = peer
        self._send_lock = stream.send_lock if isinstance(stream, _TLSStream) else threading.Lock()
        self._state_lock = threading.Lock()
        self._closed = False
        self._users = 0  # threads inside send/recv: the fd is closed when the last leaves
        self._timeout: float | None = None
        self._buf = bytearray(BUFFER_SIZE)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._max_frames = int(config.get("comm.max-frames"))
        self._max_frame_bytes = int(config.get("comm.max-frame-bytes"))
        sock.settimeout(None)

    # -- bookkeeping
    @property
    def closed(self) -> bool:
        return self._closed

    def _enter(self) -> None:
        with self._state_lock:
            if self._closed:
                raise CommClosedError(f"{self!r} is closed")
            self._users += 1

    def _leave(self) -> None:
        with self._state_lock:
            self._users -= 1
            release = self._closed and self._users == 0
        if release:
            self._sock.close()

    def close(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            idle = self._users == 0
        try:  # wakes a thread blocked in recv/send; bypasses SSLSocket-level state
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
        except OSError:
            pass
        if idle:  # otherwise the last thread inside send/recv closes the fd
            self._sock.close()

    def _abort(self, problem: str) -> CommClosedError:
        """Log a misbehaving peer, close, and return the error for recv to raise."""
        logger.warning("closing comm with %s: %s", self.peer_address, problem)
        self.close()
        return CommClosedError(f"{self!r}: {problem}")

    # -- sending
    def send(self, msg: Any) -> None:
        frames = serialize.dumps(msg)  # SerializationError leaves the comm usable
        lengths = [f.nbytes if isinstance(f, memoryview) else len(f) for f in frames]
        n = len(frames)
        header = _MSG_HEAD.pack(MSG_MAGIC, n) + _lengths_struct(n).pack(*lengths)
        self._enter()
        try:
            with self._send_lock:
                if sum(lengths) <= SMALL_MESSAGE:
                    self._stream.sendall(header + b"".join(frames))
                else:
                    views = [memoryview(header)]
                    views += [f if isinstance(f, memoryview) else memoryview(f) for f in frames]
                    self._stream.sendv([v.cast("B") if v.format != "B" else v for v in views])
        except (OSError, ValueError, ssl.SSLError) as e:
            closed_by_us = self._closed
            self.close()
            if closed_by_us:
                raise CommClosedError(f"{self!r} is closed") from e
            raise CommClosedError(f"{self!r}: send failed: {e}") from e
        finally:
            self._leave()

    # -- receiving
    def _set_timeout(self, timeout: float | None) -> None:
        if timeout != self._timeout:
            self._sock.settimeout(timeout)
            self._timeout = timeout

    def _recv_into(self, view: memoryview, first: bool = False) -> int:
        """Read some bytes; only the first read of a message honours recv's timeout."""
        while True:
            try:
                k = self._stream.recv_into(view)
            except (TimeoutError, BlockingIOError):
                if first:
                    raise
                self._set_timeout(None)  # a message has started: wait for the rest of it
                continue
            except (OSError, ValueError, ssl.SSLError) as e:
                if self._closed:
                    raise CommClosedError(f"{self!r} is closed") from e
                self.close()
                raise CommClosedError(f"{self!r}: connection lost: {e}") from e
            if k == 0:
                self.close()
                raise CommClosedError(f"{self!r}: peer closed the connection")
            return k

    def _ensure(self, n: int) -> None:
        """At least ``n`` bytes buffered from ``self._start``."""
        avail = self._end - self._start
        if avail >= n:
            return
        if self._start + n > len(self._buf):
            if n > len(self._buf):  # a header of many frames: grow the buffer
                new = bytearray(max(n, 2 * len(self._buf)))
                new[:avail] = self._view[self._start : self._end]
                self._buf, self._view = new, memoryview(new)
            else:
                self._view[:avail] = self._view[self._start : self._end]
            self._start, self._end = 0, avail
        while self._end - self._start < n:
            self._end += self._recv_into(self._view[self._end :])

    def recv(self, timeout: float | None = None) -> Any:
        self._enter()
        try:
            return self._recv(timeout)
        finally:
            self._leave()

    def _recv(self, timeout: float | None) -> Any:
        if self._start == self._end:
            self._start = self._end = 0
            self._set_timeout(timeout)
            try:
                self._end = self._recv_into(self._view, first=True)
            except (TimeoutError, BlockingIOError):
                raise TimeoutError(f"no message on {self!r} within {timeout}s") from None
        self._ensure(_MSG_HEAD.size)
        magic, n = _MSG_HEAD.unpack_from(self._buf, self._start)
        if magic != MSG_MAGIC:
            raise self._abort(f"bad frame header (magic {magic!r}): not an hpcsched peer or a corrupted stream")
        if n == 0 or n > self._max_frames:
            raise self._abort(f"message announces {n} frames (limit comm.max-frames={self._max_frames})")
        self._start += _MSG_HEAD.size
        self._ensure(8 * n)
        lengths = _lengths_struct(n).unpack_from(self._buf, self._start)
        self._start += 8 * n
        for length in lengths:
            if length > self._max_frame_bytes:
                raise self._abort(f"frame of {length} bytes announced (limit comm.max-frame-bytes={self._max_frame_bytes})")
        frames: list[bytes | bytearray] = []
        for length in lengths:
            if length <= COPY_LIMIT:
                self._ensure(length)
                frames.append(bytes(self._view[self._start : self._start + length]))
                self._start += length
                continue
            out = bytearray(length)  # the frame's own buffer: arrays unpickle on top of it
            view = memoryview(out)
            got = min(self._end - self._start, length)
            view[:got] = self._view[self._start : self._start + got]
            self._start += got
            while got < length:
                got += self._recv_into(view[got:])
            frames.append(out)
        if self._start == self._end:
            self._start = self._end = 0
        try:
            return serialize.loads(frames)
        except serialize.SerializationError as e:
            raise self._abort(f"undecodable message: {e}") from e


# ---------------------------------------------------------------- connect
def _connect(address: str, timeout: float | None, security: Security | None) -> Comm:
    scheme, loc = parse_address(address)
    host, port = parse_host_port(loc)
    timeout = float(config.get("comm.timeouts.connect", timeout))
    handshake_timeout = float(config.get("comm.timeouts.handshake"))
    ctx = _client_context(security, force=scheme == "tls")
    deadline = time.monotonic() + timeout
    delay = 0.01
    last: Exception | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"could not connect to {address} within {timeout}s: {last}")
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout=remaining)
            _tune(sock)
            stream = _client_handshake(sock, address, host, security, ctx, handshake_timeout)
            local = f"{scheme}://{_format_hostport(*sock.getsockname()[:2])}"
            return TCPComm(sock, stream, local, address)
        except socket.gaierror as e:
            raise OSError(f"cannot resolve the host of {address}: {e}") from e
        except HandshakeError:
            if sock is not None:
                sock.close()
            raise
        except (ConnectionError, TimeoutError, OSError) as e:
            # refused, reset, unreachable: the scheduler may not be up yet
            if sock is not None:
                sock.close()
            last = e
        time.sleep(max(min(delay, deadline - time.monotonic()), 0))
        delay = min(delay * 2, 0.5)


# ---------------------------------------------------------------- listen
def _contact_host(host: str) -> str:
    """A host peers can reach when we bound to every interface."""
    if host not in ("", "0.0.0.0", "::"):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class TCPListener(Listener):
    def __init__(self, address: str, on_connect: Callable[[Comm], None],
                 security: Security | None):
        scheme, loc = parse_address(address)
        host, port = parse_host_port(loc, default_port=0)
        self._scheme = scheme
        self._on_connect = on_connect
        self._secret = security.secret if security else None
        self._ctx = _server_context(security)
        if scheme == "tls" and self._ctx is None:
            raise ValueError(f"{address}: a tls:// listener needs security.tls_cert (and tls_key)")
        self._handshake_timeout = float(config.get("comm.timeouts.handshake"))
        if host in ("", "0.0.0.0"):
            family, sockaddr = socket.AF_INET, ("0.0.0.0", port)
        else:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, sockaddr = info[0][0], info[0][4]
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(sockaddr)
            self._sock.listen(1024)
        except OSError as e:
            self._sock.close()
            raise OSError(e.errno, f"cannot listen on {address}: {e.strerror}") from e
        self._sock.setblocking(False)
        self.address = f"{scheme}://{_format_hostport(_contact_host(host), self._sock.getsockname()[1])}"
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._stopped = False
        self._handshaking: dict[threading.Thread, socket.socket] = {}
        self._threads: set[threading.Thread] = set()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"hpcsched-accept {self.address}")
        self._thread.start()

    def __repr__(self) -> str:
        return f"<TCPListener {self.address}>"

    def _accept_loop(self) -> None:
        while not self._stopped:
            for key, _ in self._selector.select():
                if key.fileobj is self._wake_r:
                    return
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError as e:
                if self._stopped:
                    return
                # out of file descriptors or the like: back off instead of spinning
                logger.error("%r: accept failed: %s", self, e)
                time.sleep(0.1)
                continue
            peer = f"{self._scheme}://{_format_hostport(*addr[:2])}"
            with self._lock:
                if len(self._handshaking) >= MAX_PENDING_HANDSHAKES:
                    logger.warning("%r: %d handshakes in progress, dropping %s",
                                   self, len(self._handshaking), peer)
                    conn.close()
                    continue
                t = threading.Thread(target=self._admit, args=(conn, peer), daemon=True,
                                     name=f"hpcsched-handshake {peer}")
                self._handshaking[t] = conn
                self._threads.add(t)
            t.start()

    def _admit(self, conn: socket.socket, peer: str) -> None:
        me = threading.current_thread()
        try:
            try:
                conn.setblocking(True)
                _tune(conn)
                stream = _server_handshake(conn, self._secret, self._ctx, self._handshake_timeout)
            except Exception as e:  # whatever a hostile peer provokes, the listener lives on
                if isinstance(e, TimeoutError):
                    e = _Refused(f"no complete handshake within {self._handshake_timeout}s")
                what = "authentication failed" if self._secret else "handshake failed"
                logger.warning("%s for peer %s on %s: %s", what, peer, self.address, e)
                conn.close()
                return
            with self._lock:
                del self._handshaking[me]
                stopped = self._stopped
            local = f"{self._scheme}://{_format_hostport(*conn.getsockname()[:2])}"
            comm = TCPComm(conn, stream, local, peer)
            if stopped:
                comm.close()
                return
            try:
                self._on_connect(comm)
            except Exception:
                logger.exception("%r: on_connect failed for %s; closing it", self, peer)
                comm.close()
        finally:
            with self._lock:
                self._handshaking.pop(me, None)
                self._threads.discard(me)

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            pending = list(self._handshaking.values())
            threads = list(self._threads)
        self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        self._selector.close()
        self._sock.close()
        self._wake_r.close()
        self._wake_w.close()
        for conn in pending:  # abort handshakes in progress: nobody will take them now
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(timeout=5)


def _listen(address: str, on_connect: Callable[[Comm], None], security: Security | None) -> Listener:
    return TCPListener(address, on_connect, security)


registry.register("tcp", Backend(connect=_connect, listen=_listen))
registry.register("tls", Backend(connect=_connect, listen=_listen))
