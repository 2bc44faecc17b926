"""Nanny plugins under ``mpiexec``: refused, saying why (a rank has no nanny)."""

from __future__ import annotations

import pytest

from tests.hpc.mpi_scripts import REPO_ON_PATH, run, script
from tests.hpc.mpirun import needs_mpiexec


@needs_mpiexec
@pytest.mark.timeout(120)
def test_mpi_ranks_refuse_nanny_plugins_saying_why():
    r = run([script("nanny_plugin.py")], nprocs=3, timeout=90, env=REPO_ON_PATH)
    assert r.code == 0, r
    assert "nanny plugin under mpi ok" in r.out, r
    assert "has no nanny: MPI ranks are started by mpiexec and a rank cannot be restarted" \
        in r.out, r
