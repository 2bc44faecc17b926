"""HPC support: the ``mpi://`` transport, MPI mode (``python -m hpcsched script.py``,
:func:`initialize`) and resource detection from batch-system environments.

Names are imported on first use, so ``import hpcsched.hpc`` never imports mpi4py
(nor initializes MPI).
"""

from __future__ import annotations

from hpcsched._lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, globals(), _exports)
