"""The pangeo workflow (tests/pangeo.py) on a SLURMCluster: workers in batch jobs of
the local SLURM open and read the netCDF files, and the results equal xarray's own with
dask's synchronous scheduler."""

from __future__ import annotations

import pytest

from hpcsched.core.client.client import Client
from tests.jobqueue.batch import ROOT

pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")
pytest.importorskip("zarr")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("batch", [pytest.param("slurm", marks=pytest.mark.slurm)],
                         indirect=True)
def test_the_pangeo_workflow_on_a_slurm_cluster(batch, tmp_path):
    from tests.pangeo import assert_as_synchronous, compute_on, write_files

    paths = write_files(tmp_path)
    # the tasks' functions live in the repository's tests package: the jobs import them
    c = batch.cluster(cores=1, processes=1, memory="1GB",
                      job_script_prologue=[f"export PYTHONPATH={ROOT}:$PYTHONPATH"])
    c.scale(jobs=2)
    batch.record(c)
    c.wait_for_workers(2, timeout=90)
    with Client(c) as client:
        got = compute_on(client, paths, tmp_path)
    c.close()
    assert_as_synchronous(got, paths, tmp_path)
