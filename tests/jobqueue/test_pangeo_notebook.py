"""examples/pangeo_xarray.ipynb runs headless, cell by cell, against the real SLURM on
localhost, as tests/jobqueue/test_login_notebook.py runs the login-node notebook: the
kernel gets the jobs' log directory and PYTHONPATH through hpcsched's configuration in its
environment, any cell error fails the test, and no job of the notebook is left queued."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_until, worker_env
from tests.jobqueue.test_login_notebook import our_jobs

NOTEBOOK = Path(REPO) / "examples" / "pangeo_xarray.ipynb"


@pytest.mark.slurm
@pytest.mark.timeout(400)
def test_pangeo_notebook_runs_against_slurm(slurm, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    pytest.importorskip("zarr")
    name = f"nbpangeo{os.getpid()}"
    env = {
        "HPCSCHED_JOBQUEUE__SLURM__LOG_DIRECTORY": str(tmp_path / "logs"),
        "HPCSCHED_JOBQUEUE__SLURM__JOB_NAME": name,
        "HPCSCHED_JOBQUEUE__SLURM__JOB_SCRIPT_PROLOGUE": json.dumps(
            [f"export PYTHONPATH={worker_env()['PYTHONPATH']}"]),
        "HPCSCHED_JOBQUEUE__POLL_INTERVAL": "0.5",
        **worker_env(),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # the kernel inherits this process's environment
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()  # raises CellExecutionError on any cell error
    finally:
        wait_until(lambda: not our_jobs(name), timeout=60,
                   what="the notebook's jobs to leave the SLURM queue")
    texts = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                    for o in cell.outputs)
    assert "12 files, " in texts
    assert "global mean temperature by season (K):" in texts and "DJF" in texts
    assert "the cluster's results equal the synchronous scheduler's" in texts
    assert (tmp_path / "monthly.zarr").is_dir()
