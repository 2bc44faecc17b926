"""HPC support: the ``mpi://`` transport and MPI mode (``python -m hpcsched script.py``,
:func:`initialize`). Resource detection from batch-system environments lives in
:mod:`hpcsched.launchers.resources` (LocalCluster and the worker CLI size themselves with it).

Names are imported on first use, so ``import hpcsched.hpc`` never imports mpi4py
(nor initializes MPI).
"""

from __future__ import annotations

from hpcsched._lazy import lazy_exports

_exports = {
    "init_endpoint": "hpcsched.hpc.mpi",
    "shutdown_endpoint": "hpcsched.hpc.mpi",
    "initialize": "hpcsched.hpc.bootstrap",
}

__all__ = sorted(_exports)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _exports)
