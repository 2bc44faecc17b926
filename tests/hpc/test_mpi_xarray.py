"""The pangeo workflow under ``mpiexec -n 4 python -m hpcsched``: netCDF files read on the
worker ranks, results equal to xarray's with dask's synchronous scheduler
(tests/hpc/scripts/xarray_workflow.py checks them and says so line by line)."""

from __future__ import annotations

import pytest

from tests.hpc.mpi_scripts import REPO_ON_PATH, run, script
from tests.hpc.mpirun import needs_mpiexec

pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")
pytest.importorskip("zarr")


@needs_mpiexec
@pytest.mark.timeout(200)
def test_the_pangeo_workflow_reads_on_the_worker_ranks():
    r = run([script("xarray_workflow.py")], timeout=180, env=REPO_ON_PATH)
    assert r.code == 0, r
    assert "files opened and read on 3 worker ranks, none on rank 0" in r.out, r
    assert "monthly, climatology, rolling and zarr equal to the synchronous scheduler's" \
        in r.out, r
