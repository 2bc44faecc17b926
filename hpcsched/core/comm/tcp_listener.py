"""The TCP listener: accepts peers and authenticates them on the I/O thread.

A listener accepts without limit but keeps at most ``comm.max-pending-handshakes``
unauthenticated peers: when full, the oldest pending one is dropped. Each must
finish within ``comm.timeouts.handshake``. A legitimate peer answers the
greeting in one round trip, so a flood of idle or reconnecting sockets cannot
keep it out for long (and the client retries a handshake cut short); the flood
costs sockets, not threads. Refusals are logged on ``hpcsched.comm``, at a
bounded rate.

Once a peer is authenticated its socket becomes a
:class:`~hpcsched.core.comm.tcp_comm.TCPComm` and ``on_connect(comm)`` runs on the
I/O thread, so it must not block: servers hand the comm's messages to their loop
(``deliver_to``) and read the peer's introduction there. A registration storm of
thousands of peers then costs sockets and messages, never a thread each. The
kernel queues up to ``comm.socket-backlog`` connections not yet accepted.

A process that listens takes peers by the thousand (a scheduler its workers and
clients, a worker the peers that fetch from it), one file descriptor each, where many
systems give a process 1,024 unless it asks for more. The first listener of a process
raises its soft limit on descriptors to the hard one (:func:`raise_descriptor_limit`),
as servers commonly do; a process that only connects (a client) is left as it was.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm import tcp_io
from hpcsched.core.comm.base import Comm, Listener, Security, parse_address, parse_host_port
from hpcsched.core.comm.hosts import contact_host
from hpcsched.core.comm.tcp_comm import TCPComm, format_hostport
from hpcsched.core.comm.tcp_io import READ, WRITE
from hpcsched.core.comm.tcp_security import (
    WIRE_CHUNK,
    Refused,
    ServerHandshake,
    server_context,
    tune,
)
from hpcsched.core.settings import CommSettings

logger = logging.getLogger("hpcsched.comm")

ACCEPTS_PER_EVENT = 64  # then let pending handshakes answer before accepting more
ACCEPT_PAUSE = 0.1  # seconds without accepting once accept() failed (out of descriptors)


def raise_descriptor_limit() -> tuple[int, int] | None:
    """Raise this process's soft limit on open files to its hard limit, once per process.

    The soft limit is what a process may use without privileges, often 1,024: at a
    thousand workers the scheduler needs a descriptor per worker, and a worker one per
    peer it serves. Where the hard limit is unlimited, the kernel's own ceiling
    (``/proc/sys/fs/nr_open``) is asked for instead. Returns the (soft, hard) limits now
    in force, None where they cannot be read (no ``resource`` module).
    """
    global _raised
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if _raised:
        return soft, hard
    _raised = True
    wanted = [hard] if hard != resource.RLIM_INFINITY else []
    try:
        with open("/proc/sys/fs/nr_open") as f:
            wanted.append(int(f.read()))
    except (OSError, ValueError):
        pass
    wanted.append(10240)  # macOS refuses more than OPEN_MAX whatever the hard limit
    for target in wanted:
        if soft != resource.RLIM_INFINITY and soft < target and (
                hard == resource.RLIM_INFINITY or target <= hard):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (ValueError, OSError):
                continue
            logger.debug("open file limit raised from %d to %d", soft, target)
            return target, hard
    return soft, hard


_raised = False


def descriptor_limit() -> str:
    """This process's limit on open files, for a message about running out of them."""
    try:
        import resource
    except ImportError:
        return "unknown"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return str(soft) if soft == hard else f"{soft} (hard limit {hard})"


class _Pending:
    """An accepted peer that has not authenticated yet (lives on the I/O thread)."""

    __slots__ = ("listener", "sock", "peer", "deadline", "hs", "out", "events")

    def __init__(self, listener: TCPListener, sock: socket.socket, peer: str, deadline: float,
                 hs: ServerHandshake):
        self.listener = listener
        self.sock = sock
        self.peer = peer
        self.deadline = deadline
        self.hs = hs
        self.out = bytearray()
        self.events = READ  # what the selector watches for it

    def on_event(self, mask: int) -> None:
        self.listener._advance(self, mask)


class TCPListener(Listener):
    def __init__(self, address: str, on_connect: Callable[[Comm], None],
                 security: Security | None):
        scheme, loc = parse_address(address)
        host, port = parse_host_port(loc, default_port=0)
        self._scheme = scheme
        self._on_connect = on_connect
        self._secret = security.secret if security else None
        self._ctx = server_context(security)
        if scheme == "tls" and self._ctx is None:
            raise ValueError(f"{address}: a tls:// listener needs security.tls_cert (and tls_key)")
        settings = config.read(CommSettings)
        self._handshake_timeout = float(settings.handshake_timeout)
        self._max_pending = max(1, int(settings.max_pending_handshakes))
        raise_descriptor_limit()
        sockaddr: tuple[Any, ...]  # (host, port), or IPv6's (host, port, flowinfo, scope)
        if host in ("", "0.0.0.0"):
            family, sockaddr = socket.AF_INET, ("0.0.0.0", port)
        else:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, sockaddr = info[0][0], info[0][4]
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(sockaddr)
            self._sock.listen(int(settings.socket_backlog))
        except OSError as e:
            self._sock.close()
            raise OSError(e.errno, f"cannot listen on {address}: {e.strerror}") from e
        self._sock.setblocking(False)
        port = self._sock.getsockname()[1]
        self.address = f"{scheme}://{format_hostport(contact_host(host), port)}"
        self._pending: OrderedDict[socket.socket, _Pending] = OrderedDict()
        self._timer: tcp_io.Timer | None = None
        self._stopped = False
        self._stopped_event = threading.Event()
        self._resume: tcp_io.Timer | None = None  # accepting paused until then
        self._refusals = _LogLimit()
        self._io = tcp_io.acquire()
        self._io.call_soon(self._io.register, self._sock, READ, self)

    def __repr__(self) -> str:
        return f"<TCPListener {self.address}>"

    # ------------------------------------------------------------ I/O thread
    def on_event(self, mask: int) -> None:
        for _ in range(ACCEPTS_PER_EVENT):
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:  # out of file descriptors or the like
                self._refusals.log("%r: accept failed: %s%s", self, e,
                                   f"; this process may open {descriptor_limit()} files "
                                   "(`ulimit -Hn`: only an administrator raises the hard "
                                   "limit)" if e.errno == errno.EMFILE else "")
                self._pause_accepting()
                return
            self._admit(conn, f"{self._scheme}://{format_hostport(*addr[:2])}")

    def _pause_accepting(self) -> None:
        """``accept()`` failed (out of file descriptors, or of kernel memory): the peer
        stays queued and the socket readable, so watching it would call ``accept()`` again
        at once, in a loop holding the I/O thread (and every comm of the process on it).
        The socket is left alone for :data:`ACCEPT_PAUSE`; comms closing meanwhile free
        descriptors, and the queued peers wait in the kernel's backlog."""
        if self._resume is None and not self._stopped:
            self._io.unregister(self._sock)
            self._resume = self._io.call_later(ACCEPT_PAUSE, self._resume_accepting)

    def _resume_accepting(self) -> None:
        self._resume = None
        if not self._stopped:
            self._io.register(self._sock, READ, self)

    def _admit(self, conn: socket.socket, peer: str) -> None:
        while len(self._pending) >= self._max_pending:
            _, oldest = self._pending.popitem(last=False)
            self._refusals.log("%s: %d handshakes pending, dropping the oldest (%s)",
                               self.address, self._max_pending, oldest.peer)
            self._drop(oldest)
        try:
            conn.setblocking(False)
            tune(conn)
        except OSError:
            conn.close()
            return
        p = _Pending(self, conn, peer, time.monotonic() + self._handshake_timeout,
                     ServerHandshake(self._secret, self._ctx))
        self._pending[conn] = p
        self._io.register(conn, READ, p)
        self._send_pending(p)
        if self._timer is None:
            self._timer = self._io.call_later(self._handshake_timeout, self._expire)

    def _drop(self, p: _Pending) -> None:
        self._pending.pop(p.sock, None)
        self._io.unregister(p.sock)
        p.sock.close()

    def _refuse(self, p: _Pending, problem: str, verdict: bytes = b"") -> None:
        what = "authentication failed" if self._secret else "handshake failed"
        self._refusals.log("%s for peer %s on %s: %s", what, p.peer, self.address, problem)
        if verdict:
            try:
                p.sock.send(bytes(p.out) + verdict)
            except OSError:
                pass
        self._drop(p)

    def _send_pending(self, p: _Pending) -> bool:
        p.out += p.hs.data_to_send()
        if p.out:
            try:
                n = p.sock.send(p.out)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._refuse(p, f"connection lost: {e}")
                return False
            del p.out[:n]
            events = READ | (WRITE if p.out else 0)
            if events != p.events:  # a greeting is written at once: nothing to change
                p.events = events
                self._io.modify(p.sock, events, p)
        return True

    def _advance(self, p: _Pending, mask: int) -> None:
        if mask & READ:
            try:
                data = p.sock.recv(WIRE_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError as e:
                self._refuse(p, f"connection lost: {e}")
                return
            if data is not None:
                try:
                    p.hs.receive(data)
                except Refused as e:
                    self._refuse(p, str(e), e.verdict)
                    return
        if not self._send_pending(p) or not p.hs.done:
            return
        # authenticated: the socket becomes a comm
        self._pending.pop(p.sock, None)
        self._io.unregister(p.sock)
        try:
            local = f"{self._scheme}://{format_hostport(*p.sock.getsockname()[:2])}"
        except OSError:
            p.sock.close()
            return
        comm = TCPComm(tcp_io.acquire(), p.sock, p.hs.tls, local, p.peer, p.hs.leftover,
                       unsent=bytes(p.out))
        comm.start()
        if self._stopped:
            comm.close()
            return
        try:
            self._on_connect(comm)
        except Exception:
            logger.exception("%r: on_connect failed for %s; closing it", self, comm.peer_address)
            comm.close()

    def _expire(self) -> None:
        self._timer = None
        now = time.monotonic()
        while self._pending:
            p = next(iter(self._pending.values()))
            if p.deadline > now:
                self._timer = self._io.call_later(p.deadline - now, self._expire)
                return
            self._refuse(p, f"no complete handshake within {self._handshake_timeout}s")

    def _stop_now(self) -> None:
        try:
            self._io.unregister(self._sock)
            self._sock.close()
            for p in list(self._pending.values()):
                self._drop(p)
            if self._timer is not None:
                self._timer.cancel()
            if self._resume is not None:
                self._resume.cancel()
        finally:
            self._stopped_event.set()
            self._io.release()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._io.on_thread():
            self._stop_now()
            return
        self._io.call_soon(self._stop_now)
        self._stopped_event.wait(10)


class _LogLimit:
    """Warnings about refused peers, at most ``burst`` per ``period`` seconds: a flood of
    bad connections must not flood the log (nor cost the I/O thread its time)."""

    def __init__(self, burst: int = 20, period: float = 10.0):
        self.burst = burst
        self.period = period
        self.window = 0.0
        self.count = 0
        self.suppressed = 0

    def log(self, fmt: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.window > self.period:
            if self.suppressed:
                logger.warning("... and %d more refused or dropped peers", self.suppressed)
            self.window, self.count, self.suppressed = now, 0, 0
        self.count += 1
        if self.count <= self.burst:
            logger.warning(fmt, *args)
        else:
            self.suppressed += 1


