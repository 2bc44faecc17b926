"""Backends keyed by URL scheme; ``connect`` / ``listen`` dispatch on an address."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from hpcsched.core import config
from hpcsched.core.comm.base import Backend, Comm, Listener, Security, parse_address

_backends: dict[str, Backend] = {}
# backends imported on first use, so that e.g. mpi4py is only imported for mpi://
_lazy = {
    "inproc": "hpcsched.core.comm.inproc",
    "tcp": "hpcsched.core.comm.tcp",
    "tls": "hpcsched.core.comm.tcp",
    "mpi": "hpcsched.hpc.mpi",
}


def register(scheme: str, backend: Backend) -> None:
    _backends[scheme] = backend


def get_backend(scheme: str) -> Backend:
    if scheme not in _backends and scheme in _lazy:
        importlib.import_module(_lazy[scheme])
    try:
        return _backends[scheme]
    except KeyError:
        raise ValueError(
            f"unknown transport scheme {scheme!r}; known: {sorted(set(_backends) | set(_lazy))}"
        ) from None


def backend_for(address: str) -> Backend:
    """The backend of ``address``'s scheme: what it needs (``needs_heartbeat``, ...)."""
    return get_backend(parse_address(address)[0])


def connect(address: str, timeout: float | None = None, security: Security | None = None) -> Comm:
    """Open a comm to ``address``, retrying until ``timeout`` (config comm.timeouts.connect)."""
    scheme, _ = parse_address(address)
    timeout = config.get("comm.timeouts.connect", timeout)
    return get_backend(scheme).connect(address, timeout, security)


def listen(
    address: str, on_connect: Callable[[Comm], None], security: Security | None = None
) -> Listener:
    scheme, _ = parse_address(address)
    return get_backend(scheme).listen(address, on_connect, security)
