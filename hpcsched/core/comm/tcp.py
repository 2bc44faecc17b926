"""``tcp://host:port`` (and ``tls://``): authenticated, framed messages over TCP sockets.

Every socket of a process is served by one I/O thread
(:mod:`~hpcsched.core.comm.tcp_io`); the handshake is in
:mod:`~hpcsched.core.comm.tcp_security`, the framing in
:mod:`~hpcsched.core.comm.tcp_frames`. This module joins them:

* **Connecting.** :func:`_connect` blocks its thread (the scheduler's peers connect
  once); :func:`_connect_soon` connects on the I/O thread and calls back: a worker
  reaching a new peer for nearly every fetch (hundreds of workers) costs no
  thread hand-off and no waiting thread per connection. Both retry a refused or
  interrupted attempt, with jittered backoff, until the connect timeout; both
  run the one client handshake (:class:`~.tcp_security.ClientHandshake`).
* **Accepting.** A listener accepts without limit but keeps at most
  ``comm.max-pending-handshakes`` unauthenticated peers: when full, the oldest
  pending one is dropped. Each must finish within ``comm.timeouts.handshake``.
  A legitimate peer answers the greeting in one round trip, so a flood of idle
  or reconnecting sockets cannot keep it out; and the flood costs sockets, not
  threads. ``on_connect(comm)`` runs on the I/O thread once a peer is
  authenticated (it must not block: servers read the peer's first message on
  their loop).
* **Sending.** ``send`` serializes in the caller's thread and queues the bytes
  on the connection; when nothing is queued it first tries a non-blocking write
  itself (no thread hand-off for the common small message), and the I/O thread
  writes the rest as the peer reads. ``send`` never waits for the peer, so two
  processes that send to each other while neither reads cannot deadlock: each
  I/O thread keeps reading whatever its process is doing. A peer that stops
  reading gets at most ``comm.max-send-queue-bytes`` queued (and one message more);
  past that its comm is closed with an error naming the setting. Large frames
  are queued as views of the sender's buffers (``sendmsg``): no copies.
* **Receiving.** The I/O thread decodes frames (memory grows only as bytes
  arrive; a message that started must finish within ``comm.timeouts.message``)
  and either queues them for ``recv`` or, after :meth:`TCPComm.deliver_to`,
  unpickles them and hands ``(source, message)`` to the receiver's inbox. It
  hands them over once per round of socket events, all the messages of the
  round for one inbox together (``Inbox.offer_batch``): an
  idle server then handles everything that arrived at once, from every peer,
  in one iteration on the I/O thread, without a thread hand-off -- safe
  because ``send`` never blocks -- and batched, so it flushes one message per
  destination for all of them.
* **Closing.** ``close`` stops both directions for the user at once; what was
  already queued still goes out (within a linger timeout), then the write side
  is shut and the socket closed once the peer has closed too, so data sent just
  before closing is not lost to a reset. A peer that sends a malformed frame is
  logged on ``hpcsched.comm`` and dropped; the listener and other peers are
  unaffected.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import time
from collections.abc import Callable
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm import tcp_io
from hpcsched.core.comm.base import (
    Backend,
    Comm,
    HandshakeError,
    Listener,
    Security,
    parse_address,
    parse_host_port,
)
from hpcsched.core.comm.hosts import route_source
from hpcsched.core.comm.tcp_comm import TCPComm, format_hostport
from hpcsched.core.comm.tcp_io import READ, WRITE
from hpcsched.core.comm.tcp_listener import TCPListener
from hpcsched.core.comm.tcp_security import (
    WIRE_CHUNK,
    ClientHandshake,
    client_context,
    client_handshake,
    tune,
)
from hpcsched.core.settings import CommSettings

__all__ = ["TCPComm", "TCPListener"]


def _connect(address: str, timeout: float | None, security: Security | None) -> Comm:
    scheme, loc = parse_address(address)
    host, port = parse_host_port(loc)
    settings = config.read(CommSettings, connect_timeout=timeout)
    timeout, handshake_timeout = float(settings.connect_timeout), float(settings.handshake_timeout)
    ctx = client_context(security, force=scheme == "tls")
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
            tune(sock)
            tls, leftover = client_handshake(sock, address, host, security, ctx,
                                             min(handshake_timeout, max(remaining, 0.1)))
            local = f"{scheme}://{format_hostport(*sock.getsockname()[:2])}"
            sock.setblocking(False)
            io = tcp_io.acquire()
            comm = TCPComm(io, sock, tls, local, address, leftover)
            io.call_soon(comm.start)
            return comm
        except socket.gaierror as e:
            raise OSError(f"cannot resolve the host of {address}: {e}") from e
        except HandshakeError:
            if sock is not None:
                sock.close()
            raise
        except (ConnectionError, TimeoutError, OSError) as e:
            # refused, reset, unreachable, evicted, not greeted in time: the scheduler may
            # be busy (thousands of workers connecting at once) or not up yet
            if sock is not None:
                sock.close()
            last = e
        # jittered, so that peers refused together do not come back together
        time.sleep(max(min(delay * random.uniform(0.5, 1.5), deadline - time.monotonic()), 0))
        delay = min(delay * 2, 0.5)


Done = Callable[[Comm | None, BaseException | None], None]


def _connect_soon(address: str, timeout: float | None, security: Security | None,
                  done: Done) -> bool:
    """Connect to ``address`` on the I/O thread; ``done(comm, None)`` or ``done(None,
    error)`` runs there (it must not block). False, and nothing done, for a host name
    (resolving it may block: the caller connects from a thread instead)."""
    scheme, loc = parse_address(address)
    host, port = parse_host_port(loc)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        return False
    family, _, _, _, sockaddr = infos[0]
    settings = config.read(CommSettings, connect_timeout=timeout)
    attempt = _Connecting(tcp_io.acquire(), address, host, family, sockaddr,
                          client_context(security, force=scheme == "tls"), security,
                          float(settings.connect_timeout), float(settings.handshake_timeout),
                          done)
    attempt.io.call_soon(attempt.start)
    return True


class _Connecting:
    """One :func:`_connect_soon` on the I/O thread: a non-blocking connect, then the client
    handshake advanced by readiness events, retried until the deadline."""

    def __init__(self, io: tcp_io.IOThread, address: str, host: str, family: int,
                 sockaddr: tuple, ctx: Any, security: Security | None, timeout: float,
                 handshake_timeout: float, done: Done):
        self.io = io
        self.address, self.host, self.family, self.sockaddr = address, host, family, sockaddr
        self.ctx, self.security, self.done = ctx, security, done
        self.timeout, self.handshake_timeout = timeout, handshake_timeout
        self.deadline = time.monotonic() + timeout
        self.delay = 0.01
        self.sock: socket.socket | None = None
        self.hs: ClientHandshake | None = None
        self.out = b""
        self.events = 0
        self.last: BaseException | None = None
        self.timer: tcp_io.Timer | None = None
        self.finished = False

    def start(self) -> None:
        """One attempt (on the I/O thread)."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self._fail(TimeoutError(f"could not connect to {self.address} within "
                                    f"{self.timeout}s: {self.last}"))
            return
        self.hs, self.out = None, b""
        try:
            sock = self.sock = socket.socket(self.family, socket.SOCK_STREAM)
            sock.setblocking(False)
            err = sock.connect_ex(self.sockaddr)
        except OSError as e:
            self._retry(e)
            return
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            self._retry(ConnectionRefusedError(err, os.strerror(err)))
            return
        self.events = WRITE
        self.io.register(sock, WRITE, self)
        self.timer = self.io.call_later(min(remaining, self.handshake_timeout), self._late)

    def on_event(self, mask: int) -> None:
        sock = self.sock
        if sock is None or self.finished:
            return
        try:
            if self.hs is None:  # the TCP connect finished, or failed
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise ConnectionRefusedError(err, os.strerror(err))
                tune(sock)
                self.hs = ClientHandshake(self.address, self.host, self.security, self.ctx)
            elif mask & READ:
                try:
                    data = sock.recv(WIRE_CHUNK)
                except (BlockingIOError, InterruptedError):
                    data = None
                if data is not None:
                    self.hs.receive(data)
            self.out += self.hs.data_to_send()
            if self.out:
                try:
                    n = sock.send(self.out)
                except (BlockingIOError, InterruptedError):
                    n = 0
                self.out = self.out[n:]
        except HandshakeError as e:
            self._fail(e)
            return
        except OSError as e:  # refused, reset, hung up: the peer may be busy or starting
            self._retry(e)
            return
        if self.hs.done and not self.out:
            self._connected()
            return
        events = READ | (WRITE if self.out else 0)
        if events != self.events:
            self.events = events
            self.io.modify(sock, events, self)

    def _connected(self) -> None:
        sock, hs = self.sock, self.hs
        assert sock is not None and hs is not None
        self._stop_timer()
        self.io.unregister(sock)
        try:
            local = f"{parse_address(self.address)[0]}://" \
                    f"{format_hostport(*sock.getsockname()[:2])}"
        except OSError as e:
            self._retry(e)
            return
        self.finished = True
        comm = TCPComm(self.io, sock, hs.tls, local, self.address, hs.leftover)
        comm.start()
        self.done(comm, None)

    def _late(self) -> None:
        self.timer = None
        stage = self.hs.stage if self.hs is not None else "connect"
        self._retry(TimeoutError(f"{self.address}: no answer in {stage} within "
                                 f"{self.handshake_timeout}s"))

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _close_socket(self) -> None:
        self._stop_timer()
        if self.sock is not None:
            self.io.unregister(self.sock)
            self.sock.close()
            self.sock = None

    def _retry(self, error: BaseException) -> None:
        self._close_socket()
        self.last = error
        # jittered, so that peers refused together do not come back together
        wait = max(min(self.delay * random.uniform(0.5, 1.5),
                       self.deadline - time.monotonic()), 0)
        self.delay = min(self.delay * 2, 0.5)
        self.io.call_later(wait, self.start)

    def _fail(self, error: BaseException) -> None:
        self._close_socket()
        self.finished = True
        self.io.release()
        self.done(None, error)


def _listen(address: str, on_connect: Callable[[Comm], None], security: Security | None
            ) -> Listener:
    return TCPListener(address, on_connect, security)


def _worker_listen_address(scheduler_address: str, host: str | None) -> str:
    """The scheduler's scheme, any port, on ``host`` if given, else on the address this host
    reaches the scheduler from (its peers on that network reach it there too; a name that
    does not resolve: every interface)."""
    scheme, loc = parse_address(scheduler_address)
    if not host:
        host = route_source(parse_host_port(loc, default_port=0)[0]) or "0.0.0.0"
    return f"{scheme}://{format_hostport(host, 0)}"


# a TCP peer that crashes, or whose host does, can leave its connection open: only the
# missing heartbeats tell (as distributed's worker-ttl); and anyone reaching the port may
# try to connect, hence a secret
def _service_host(server_address: str) -> str:
    """Beside the server: the host its TCP address names (loopback if none)."""
    hostport = parse_address(server_address)[1]
    return hostport.rpartition(":")[0].strip("[]") or "127.0.0.1"


BACKEND = Backend(connect=_connect, connect_soon=_connect_soon, listen=_listen, needs_heartbeat=True, needs_secret=True,
                  reconnectable=True,
                  worker_listen_address=_worker_listen_address, service_host=_service_host)
