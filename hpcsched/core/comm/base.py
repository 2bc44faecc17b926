"""The transport interface: one small ``Comm`` per peer, a ``Listener`` per server.

Rules every backend follows (``inproc://``, ``tcp://``, ``mpi://``):

* A message is any picklable Python object; servers send a ``list`` of op dicts
  (``{"op": "compute-task", ...}``). ``send`` delivers messages to the peer in
  order, and is safe to call from several threads at once.
* ``recv(timeout)`` blocks until the next message arrives, raises
  :class:`CommClosedError` once the comm or its peer is closed, and
  ``TimeoutError`` when ``timeout`` passes first. It never spins a core.
* Serialization of what crosses a process boundary happens inside the backend,
  with :mod:`hpcsched.core.protocol.serialize` (header + out-of-band frames); ``inproc``
  passes objects as they are.
* A backend registers itself by URL scheme in :mod:`hpcsched.core.comm.registry`
  with a :class:`Backend`: ``connect(address, timeout, security) -> Comm`` and
  ``listen(address, on_connect, security) -> Listener``. ``on_connect(comm)`` is
  called (in a backend thread) for every accepted, authenticated peer; it must not
  block (it may run on the thread serving every connection). The
  :class:`Backend` also declares what servers must do for the transport
  (heartbeats, a secret, a worker's default listen address), so that no server
  branches on a scheme.
* Servers receive through ``deliver_to(inbox, source, closed_marker)``: the
  backend pushes each message onto an :class:`Inbox` (``recv`` remains for
  request-reply exchanges such as a worker's registration). Whether the
  transport's thread may run the receiver's handler is the inbox's interface
  (``offer``), not the transport's guess.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable
from typing import Any

from hpcsched.core.protocol.records import Record, field


class CommClosedError(ConnectionError):
    """The comm, or the peer behind it, is closed."""


class HandshakeError(ConnectionError):
    """A peer failed authentication (wrong secret, bad TLS, garbage)."""


class Inbox(abc.ABC):
    """Where a transport hands a comm's messages (:meth:`Comm.deliver_to`).

    ``put`` only queues the item for the receiver's thread. ``offer`` and
    ``offer_batch`` say the caller (a transport's thread) may run the receiver's
    handler itself, now, if the receiver is idle: a
    :class:`~hpcsched.core.comm.loop.Loop` (a server's, or a client's for what its
    scheduler sends) does, saving a thread hand-off per message.
    An inbox whose handler must not run on another thread keeps these defaults,
    which queue.
    """

    __slots__ = ()

    #: the receiver's handler may run in any sender's thread, also one of a transport
    #: whose sends only queue (``inproc://``): it is short, never blocks and takes no lock
    #: a sender could hold. Such a transport then hands items over with ``offer``.
    any_thread: bool = False

    @abc.abstractmethod
    def put(self, item: Any) -> None:
        """Queue ``item``; never runs the receiver's code in the caller."""

    def offer(self, item: Any) -> None:
        """Hand ``item`` over; the receiver may handle it in the calling thread."""
        self.put(item)

    def offer_batch(self, items: list) -> None:
        """Like :meth:`offer` for several items at once (one iteration may take them all)."""
        for item in items:
            self.put(item)


class Comm(abc.ABC):
    """A bidirectional, ordered, message-oriented connection to one peer."""

    local_address: str = ""
    peer_address: str = ""

    @abc.abstractmethod
    def send(self, msg: Any) -> None:
        """Send one message; raises CommClosedError if the comm is closed."""

    @abc.abstractmethod
    def recv(self, timeout: float | None = None) -> Any:
        """Next message; CommClosedError when closed, TimeoutError on timeout."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close both directions; idempotent. A blocked recv raises CommClosedError."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """Whether the comm is closed (by either side): sends fail, recv raises."""

    @abc.abstractmethod
    def deliver_to(self, inbox: Inbox, source: Any, closed_marker: Any) -> None:
        """Push every later message onto ``inbox`` as ``(source, message)``.

        Then ``(source, closed_marker)`` once the comm closes, instead of waiting for ``recv``
        calls; messages that arrived before go first, in order. How a server receives
        from its peers: every backend does it. The transport's thread hands messages over
        with ``inbox.offer`` / ``offer_batch`` where its sends never block (then running
        the receiver's handler there cannot deadlock), else with ``inbox.put``.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.local_address} -> {self.peer_address}>"


class Listener(abc.ABC):
    """Accepts peers on ``address`` and hands each to ``on_connect``."""

    address: str = ""  # the address peers connect to (port resolved)

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop accepting; comms already handed out stay open. Idempotent."""


class Security(Record):
    """Who may connect: a shared secret (HMAC challenge-response), optional TLS.

    ``secret`` is never sent over the wire. ``Security.generate()`` makes a fresh
    random secret for a new cluster.
    """

    secret: bytes | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    extra: dict[str, Any] = field(factory=dict)

    @classmethod
    def generate(cls, **kw: Any) -> Security:
        """A fresh random 32-byte secret for a new cluster (``kw``: the TLS files)."""
        return cls(secret=os.urandom(32), **kw)  # what secrets.token_bytes does

    @property
    def tls(self) -> bool:
        """Whether connections use TLS (a certificate is given)."""
        return bool(self.tls_cert)

    def secret_hex(self) -> str:
        """The secret as hex text (empty without one), for a scheduler file or the CLI."""
        return self.secret.hex() if self.secret else ""

    @classmethod
    def from_hex(cls, text: str, **kw: Any) -> Security:
        """The security whose secret is hex ``text`` (none if blank): see :meth:`secret_hex`."""
        return cls(secret=bytes.fromhex(text.strip()) if text.strip() else None, **kw)

    @classmethod
    def from_environment(cls) -> Security | None:
        """``HPCSCHED_SECRET`` (hex) or ``HPCSCHED_SECRET_FILE`` (a 0600 file)."""
        env = os.environ.get("HPCSCHED_SECRET")
        if env:
            return cls.from_hex(env)
        path = os.environ.get("HPCSCHED_SECRET_FILE")
        if path:
            with open(path) as f:
                return cls.from_hex(f.read())
        return None


def _listen_beside(scheduler_address: str, host: str | None) -> str:
    """Any address of the scheduler's scheme: ``inproc://``, ``mpi://``."""
    return f"{parse_address(scheduler_address)[0]}://"


def _loopback(server_address: str) -> str:
    return "127.0.0.1"


def _no_rank(address: str) -> int | None:
    return None


class Backend(Record):
    """A transport, and what servers must do for it (so that they never test a scheme)."""

    connect: Callable[[str, float, Security | None], Comm]
    listen: Callable[[str, Callable[[Comm], None], Security | None], Listener]
    #: ``(address, timeout, security, done) -> bool``: connect without blocking the caller,
    #: ``done(comm, None)`` or ``done(None, error)`` called back on the transport's thread
    #: (it must not block); False when it cannot for this address. None: the transport
    #: connects only by ``connect`` (the caller uses a thread)
    connect_soon: Callable[[str, float | None, Security | None,
                            Callable[[Comm | None, BaseException | None], None]], bool] | None = None
    #: a peer that dies is noticed only when its heartbeats stop (a TCP connection to a
    #: crashed host may stay open for a long time); False where the transport reports it
    #: itself (an MPI rank that dies ends the job; inproc peers share this process)
    needs_heartbeat: bool = False
    #: any process that reaches the address may connect, so a cluster makes a shared
    #: secret when given none (MPI ranks and inproc peers are ours by construction)
    needs_secret: bool = False
    #: peers live in this process only: a server's own address already serves a client
    #: in its process (no second, in-process listener is needed)
    same_process: bool = False
    #: a scheduler can die and be started again apart from its peers (a separate process
    #: at an address it can listen at again): workers and clients look for it again
    #: (``*.scheduler-reconnect-timeout``); not under MPI (rank 0 ends the job) nor inproc
    reconnectable: bool = False
    #: ``(scheduler_address, host) -> address`` a worker of that scheduler listens on by
    #: default; ``host`` is the worker's host name or address, when it was given one
    worker_listen_address: Callable[[str, str | None], str] = _listen_beside
    #: ``server_address -> host`` a service beside a server at that address (its
    #: dashboard) listens on when told no host: where the server's own peers reach it
    service_host: Callable[[str], str] = _loopback
    #: servers of this transport run on a compute node of a batch job, which a user's
    #: laptop reaches through an ssh tunnel from the login node (the dashboard says how)
    reached_by_tunnel: bool = False
    #: ``address -> rank`` of the process at that address, for transports that number
    #: their processes (MPI); None elsewhere
    rank_of: Callable[[str], int | None] = _no_rank


def parse_address(address: str) -> tuple[str, str]:
    """``"tcp://host:1234"`` -> ``("tcp", "host:1234")``; the one address parser."""
    if not isinstance(address, str) or "://" not in address:
        raise ValueError(
            f"not an hpcsched address: {address!r} (expected scheme://location, "
            "e.g. tcp://10.0.0.1:8786, inproc://name, mpi://0)"
        )
    scheme, _, loc = address.partition("://")
    return scheme.lower(), loc


def unparse_address(scheme: str, location: str) -> str:
    """``scheme://location``, the inverse of :func:`parse_address`."""
    return f"{scheme}://{location}"


def parse_host_port(location: str, default_port: int | None = None) -> tuple[str, int]:
    """``"host:1234"`` / ``"[::1]:1234"`` -> ``(host, port)``."""
    if location.startswith("["):
        host, _, rest = location[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, sep, port = location.rpartition(":")
        if not sep:
            host, port = location, ""
    if not port:
        if default_port is None:
            raise ValueError(f"address {location!r} has no port")
        return host, default_port
    try:
        return host, int(port)
    except ValueError:
        raise ValueError(f"address {location!r} has a non-numeric port {port!r}") from None
