"""HPC support: the ``mpi://`` transport, MPI mode (``python -m hpcsched script.py``,
:func:`initialize`) and resource detection from batch-system environments.

Names are imported on first use, so ``import hpcsched.hpc`` never imports mpi4py
(nor initializes MPI).
"""

from __future__ import annotations

import importlib
from typing import Any

_exports = {
    "detect": "hpcsched.hpc.resources",
    "parse_bytes": "hpcsched.hpc.resources",
    "format_bytes": "hpcsched.hpc.resources",
    "Resources": "hpcsched.hpc.resources",
    "init_endpoint": "hpcsched.hpc.mpi",
    "shutdown_endpoint": "hpcsched.hpc.mpi",
    "initialize": "hpcsched.hpc.bootstrap",
}

__all__ = sorted(_exports)


def __getattr__(name: str) -> Any:
    try:
        module = _exports[name]
    except KeyError:
        raise AttributeError(f"module 'hpcsched.hpc' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
