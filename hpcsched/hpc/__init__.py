"""HPC support: the ``mpi://`` transport and MPI mode (``python -m hpcsched script.py``,
:func:`initialize`). Resource detection from batch-system environments lives in
:mod:`hpcsched.launchers.resources` (LocalCluster and the worker CLI size themselves with it).

Names are imported on first use, so ``import hpcsched.hpc`` never imports mpi4py
(nor initializes MPI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcsched._lazy import lazy_exports

_exports = {
    "init_endpoint": "hpcsched.hpc.mpi",
    "shutdown_endpoint": "hpcsched.hpc.mpi",
    "initialize": "hpcsched.hpc.bootstrap",
}

__all__ = [
    "init_endpoint",
    "initialize",
    "shutdown_endpoint",
]

# Type checkers and IDEs read these imports (public through __all__, which they read as a
# literal list); at run time the names come from __getattr__ below. tests/test_exports.py
# keeps _exports, __all__ and these imports equal. Without a __getattr__ in their view, a
# misspelt name is an error to them rather than Any.
if TYPE_CHECKING:
    from hpcsched.hpc.bootstrap import initialize
    from hpcsched.hpc.mpi import init_endpoint, shutdown_endpoint
else:
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _exports)
