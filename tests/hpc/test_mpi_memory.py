"""Memory under MPI, where a rank cannot be restarted: spilling keeps the job alive."""

from __future__ import annotations

import pytest

from tests.hpc.mpi_scripts import run, script
from tests.hpc.mpirun import needs_mpiexec


@needs_mpiexec
@pytest.mark.timeout(300)
def test_results_three_times_the_memory_limit_spill_and_the_job_lives():
    r = run(["--memory-limit", "250MB", script("spill.py")], nprocs=3, timeout=280)
    assert r.code == 0, r
    assert "spill ok" in r.out, r
    assert "out of memory" not in r.err, r
