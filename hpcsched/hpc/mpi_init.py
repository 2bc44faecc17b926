"""mpi4py's ``MPI`` module, initialized as the ``mpi://`` transport needs it.

Imported by whatever touches MPI first (the endpoint, the doorbell exchange, the
bootstrap), so that MPI is initialized the same way whichever comes first, and only
when MPI is used: ``import hpcsched`` never initializes MPI.
"""

from __future__ import annotations

import sys
from typing import Any


def mpi_module() -> Any:
    """mpi4py's MPI module, initialized with MPI_THREAD_MULTIPLE (checked)."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
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
