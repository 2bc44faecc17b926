"""Backends keyed by URL scheme; ``connect`` / ``listen`` dispatch on an address.

The core's own transports (``inproc``, ``tcp``, ``tls``) are known from the start and
imported at their first use.
A transport built above the core is a seam named ``transport:<scheme>``
(:mod:`hpcsched.core.seams`), imported the first time an address of its scheme is
used: mpi4py is imported, and MPI initialized, only for ``mpi://``.
"""

from __future__ import annotations

from collections.abc import Callable

from hpcsched.core import config, seams
from hpcsched.core.comm.base import Backend, Comm, Listener, Security, parse_address
from hpcsched.core.settings import CommSettings

#: the core's own schemes; each backend's module is imported at its scheme's first use (an
#: MPI job's ranks, for one, never load the TCP stack)
CORE_SCHEMES = ("inproc", "tcp", "tls")
_backends: dict[str, Backend] = {}


def _core_backend(scheme: str) -> Backend | None:
    if scheme == "inproc":
        from hpcsched.core.comm import inproc

        return inproc.BACKEND
    if scheme in ("tcp", "tls"):
        from hpcsched.core.comm import tcp

        return tcp.BACKEND
    return None


def register(scheme: str, backend: Backend) -> None:
    """Serve addresses ``scheme://...`` with ``backend`` (a transport of the user's own)."""
    _backends[scheme] = backend


def get_backend(scheme: str) -> Backend:
    backend = _backends.get(scheme)
    if backend is None:
        backend = _core_backend(scheme)
        if backend is None and f"transport:{scheme}" in seams.SEAMS:
            backend = seams.resolve(f"transport:{scheme}")
        if backend is not None:
            _backends[scheme] = backend
    if backend is None:
        known = {*_backends, *CORE_SCHEMES} | {n.partition(":")[2] for n in seams.SEAMS
                                               if n.startswith("transport:")}
        raise ValueError(f"unknown transport scheme {scheme!r}; known: {sorted(known)}")
    return backend


def backend_for(address: str) -> Backend:
    """The backend of ``address``'s scheme: what it needs (``needs_heartbeat``, ...)."""
    return get_backend(parse_address(address)[0])


def connect(address: str, timeout: float | None = None, security: Security | None = None) -> Comm:
    """Open a comm to ``address``, retrying until ``timeout`` (config comm.timeouts.connect)."""
    scheme, _ = parse_address(address)
    timeout = config.read(CommSettings, connect_timeout=timeout).connect_timeout
    return get_backend(scheme).connect(address, timeout, security)


def connect_soon(address: str, done: Callable[[Comm | None, BaseException | None], None],
                 timeout: float | None = None, security: Security | None = None) -> bool:
    """Start opening a comm to ``address`` without blocking; ``done(comm, None)`` or
    ``done(None, error)`` is called back on the transport's thread (it must not block).
    False, and nothing started, where the transport cannot (call :func:`connect` from a
    thread instead)."""
    backend = get_backend(parse_address(address)[0])
    if backend.connect_soon is None:
        return False
    timeout = config.read(CommSettings, connect_timeout=timeout).connect_timeout
    return backend.connect_soon(address, timeout, security, done)


def listen(
    address: str, on_connect: Callable[[Comm], None], security: Security | None = None
) -> Listener:
    scheme, _ = parse_address(address)
    return get_backend(scheme).listen(address, on_connect, security)
