"""The pangeo workflow on a LocalCluster: netCDF files in, xarray's results out.

The test writes a year of daily fields split over several netCDF files (a few MB each,
several variables, a time axis), then does what a climate notebook does with a
``Client``: ``open_mfdataset(parallel=True)``, a monthly ``resample().mean()``, a
``groupby("time.season")`` climatology, a ``rolling`` mean and ``to_zarr``. Every result
equals xarray's own with dask's synchronous scheduler, computed after the cluster is gone.

The reads happen on the workers: each file is opened in a task (the ``preprocess``
hook records the process that opened it), the workers count the files their
``h5netcdf.File`` opened, and the test's process refuses to open any while the
cluster computes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")
pytest.importorskip("zarr")

from hpcsched.core.client.client import Client  # noqa: E402 - after the skips
from tests.pangeo import assert_as_synchronous, compute_on, write_files  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def test_the_pangeo_workflow_gives_xarrays_results_with_reads_on_the_workers(cluster,
                                                                             tmp_path):
    paths = write_files(tmp_path)
    with Client(cluster) as client:  # dask's scheduler while it lives
        got = compute_on(client, paths, tmp_path)
    assert_as_synchronous(got, paths, tmp_path)
