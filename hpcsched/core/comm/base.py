"""The transport interface: one small ``Comm`` per peer, a ``Listener`` per server.

Rules every backend follows (``inproc://``, ``tcp://``, ``mpi://``):

* A message is any picklable Python object; servers send a ``list`` of op dicts
  (``{"op": "compute-task", ...}``). ``send`` delivers messages to the peer in
  order, and is safe to call from several threads at once.
* ``recv(timeout)`` blocks until the next message arrives, raises
  :class:`CommClosedError` once the comm or its peer is closed, and
  ``TimeoutError`` when ``timeout`` passes first. It never spins a core.
* Serialization of what crosses a process boundary happens inside the backend,
  with :mod:`hpcsched.core.serialize` (header + out-of-band frames); ``inproc``
  passes objects as they are.
* A backend registers itself by URL scheme in :mod:`hpcsched.core.comm.registry`
  with a :class:`Backend`: ``connect(address, timeout, security) -> Comm`` and
  ``listen(address, on_connect, security) -> Listener``. ``on_connect(comm)`` is
  called (in a backend thread) for every accepted, authenticated peer.
"""

from __future__ import annotations

import abc
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class CommClosedError(ConnectionError):
    """The comm, or the peer behind it, is closed."""


class HandshakeError(ConnectionError):
    """A peer failed authentication (wrong secret, bad TLS, garbage)."""


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
    def closed(self) -> bool: ...

    def deliver_to(self, inbox: Any, source: Any, closed_marker: Any) -> bool:
        """Push every later message onto ``inbox`` as ``(source, message)``, then
        ``(source, closed_marker)`` once the comm closes, instead of waiting for ``recv``
        calls; messages that arrived before go first. ``inbox`` has ``put``, and may have
        ``offer`` / ``offer_batch`` (a :class:`~hpcsched.core.loop.Loop`'s inbox: the
        transport's thread may run an idle loop's iteration itself). Every backend of hpcsched does this (inproc,
        tcp, mpi); returns False when a backend cannot (then the caller runs a reader
        thread).
        """
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.local_address} -> {self.peer_address}>"


class Listener(abc.ABC):
    """Accepts peers on ``address`` and hands each to ``on_connect``."""

    address: str = ""  # the address peers connect to (port resolved)

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop accepting; comms already handed out stay open. Idempotent."""


@dataclass
class Security:
    """Who may connect: a shared secret (HMAC challenge-response), optional TLS.

    ``secret`` is never sent over the wire. ``Security.generate()`` makes a fresh
    random secret for a new cluster.
    """

    secret: bytes | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def generate(cls, **kw: Any) -> Security:
        return cls(secret=secrets.token_bytes(32), **kw)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    def secret_hex(self) -> str:
        return self.secret.hex() if self.secret else ""

    @classmethod
    def from_hex(cls, text: str, **kw: Any) -> Security:
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


@dataclass(frozen=True)
class Backend:
    connect: Callable[[str, float, Security | None], Comm]
    listen: Callable[[str, Callable[[Comm], None], Security | None], Listener]


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
