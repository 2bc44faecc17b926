"""examples/pangeo_xarray.ipynb runs headless, cell by cell, against the real SLURM on
localhost, as tests/jobqueue/test_login_notebook.py runs the login-node notebook: the
kernel gets the jobs' log directory and PYTHONPATH through hpcsched's configuration in its
environment, any cell error fails the test, and no job of the notebook is left queued."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.jobqueue.notebooks import execute_against_slurm

NOTEBOOK = Path(REPO) / "examples" / "pangeo_xarray.ipynb"


@pytest.mark.slurm
@pytest.mark.timeout(400)
def test_pangeo_notebook_runs_against_slurm(slurm, tmp_path, monkeypatch):
    pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    pytest.importorskip("zarr")
    nb = execute_against_slurm(NOTEBOOK, tmp_path, monkeypatch)
    texts = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                    for o in cell.outputs)
    assert "12 files, " in texts
    assert "global mean temperature by season (K):" in texts and "DJF" in texts
    assert "the cluster's results equal the synchronous scheduler's" in texts
    assert (tmp_path / "monthly.zarr").is_dir()
