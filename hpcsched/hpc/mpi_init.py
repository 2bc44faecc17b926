"""mpi4py's ``MPI`` module, initialized as the ``mpi://`` transport needs it.

Imported by whatever touches MPI first (the endpoint, the doorbell exchange, the
bootstrap), so that MPI is initialized the same way whichever comes first, and only
when MPI is used: ``import hpcsched`` never initializes MPI.

Before MPI is initialized, the library mpi4py is about to load is checked against the
launcher that started this process where both can be told without initializing MPI: Open
MPI's ``mpirun`` with MPICH's library (mpi4py's wheel loads the ``mpich`` wheel's when it
finds it) aborts inside ``MPI_Init`` with a message about PMIx that names neither.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def mpi_module() -> Any:
    """mpi4py's MPI module, initialized with MPI_THREAD_MULTIPLE (checked)."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
        if not rdma_devices():
            # UCX (the network library of the mpich wheel, and of Open MPI and MPICH on
            # many clusters) hooks mmap/munmap as it is loaded, so that its cache of
            # memory registered with an RDMA device learns what was unmapped: ~40 ms of
            # CPU in every rank's start (measured with the mpich wheel: 44 ms against 3 to
            # load libmpi). Without an RDMA device nothing is registered and the hooks
            # serve nothing; with one they are kept. A value the user gave is kept.
            os.environ.setdefault("UCX_MEM_EVENTS", "no")
        check_library(os.environ)
        # Open MPI yields the core inside every progress call of an oversubscribed rank
        # (more ranks than slots, as on a laptop or in CI). Only the progress thread waits
        # on MPI here, and it sleeps between polls itself: yielding at each poll as well
        # hands the core to any other busy process at every message, and on a busy host
        # the tasks' round trips become several times slower. A value the user gave
        # (mpirun --mca, the environment) is kept.
        os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "0")
    from mpi4py import MPI

    if not MPI.Is_initialized():  # the user set mpi4py.rc.initialize = False
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_MULTIPLE:
        names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED",
                 MPI.THREAD_SERIALIZED: "SERIALIZED"}
        raise RuntimeError(
            f"the mpi:// transport needs MPI_THREAD_MULTIPLE but MPI was initialized with "
            f"MPI_THREAD_{names.get(provided, provided)}; do not set mpi4py.rc.thread_level "
            "lower than 'multiple' (or use an MPI library built with thread support)"
        )
    return MPI


def rdma_devices(root: str = "/sys/class/infiniband") -> list[str]:
    """This node's RDMA devices (InfiniBand, RoCE, iWARP and EFA all appear there)."""
    try:
        return os.listdir(root)
    except OSError:
        return []


def wheel_library() -> str | None:
    """The MPI ABI (``"mpich"``, ``"openmpi"``) mpi4py's multi-ABI wheel is about to load.

    None for an mpi4py built against one MPI library (it links that one), or when it
    cannot be told. Looks for the library the way the wheel does (``MPI4PY_MPIABI``,
    ``MPI4PY_LIBMPI``, then a ``libmpi`` beside Python), without initializing it.
    """
    import mpi4py

    abi = getattr(mpi4py, "_mpiabi", None)
    if abi is None or "mpi4py.MPI" not in getattr(abi, "_registry", {}):
        return None
    try:
        return str(abi._get_mpiabi())
    except Exception:  # noqa: BLE001 - no library found: the import will say so itself
        return None


def check_library(env: Any) -> None:
    """RuntimeError if the launcher of ``env`` and the MPI library cannot work together."""
    if "OMPI_COMM_WORLD_SIZE" in env and wheel_library() == "mpich":
        raise RuntimeError(
            "hpcsched: started by Open MPI's mpirun, but mpi4py is about to load an MPICH "
            "library (the mpich wheel's), whose MPI_Init fails under Open MPI. Start the job "
            "with the mpiexec of that MPICH (the mpich wheel puts one on PATH), or use Open "
            "MPI's library: mpi4py built against it (pip install --no-binary mpi4py mpi4py, "
            "with Open MPI's mpicc first on PATH), or this mpi4py told where it is "
            "(mpirun -x MPI4PY_LIBMPI=libmpi.so.40 ...)")
