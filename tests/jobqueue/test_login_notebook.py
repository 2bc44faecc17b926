"""examples/login_node.ipynb runs headless, cell by cell, against the real SLURM on localhost.

A Jupyter kernel (nbclient, the runner Jupyter itself uses) executes the
notebook as a user would run it; any cell error fails the test. The kernel
gets what only this machine needs through hpcsched's configuration in its
environment (the jobs' log directory and PYTHONPATH), so the notebook stays
the one users copy. Every job the notebook's cluster submitted must have left
the queue when it is done (the last cell closes the cluster; a failing run's
kernel exits, and the cluster's exit handler cancels them).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, wait_until, worker_env

NOTEBOOK = Path(REPO) / "examples" / "login_node.ipynb"


def our_jobs(name: str) -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                         timeout=30).stdout
    return {ln.split()[0] for ln in out.splitlines() if ln.strip() and name in ln}


def execute_against_slurm(notebook: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          **settings: str) -> Any:
    """Run ``notebook`` in a Jupyter kernel whose environment has the jobs' log directory,
    PYTHONPATH and ``settings`` (environment variables); return it with its outputs, once
    every job it submitted has left the queue."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    name = f"nb{notebook.stem.replace('_', '')}{os.getpid()}"
    env = {
        "HPCSCHED_JOBQUEUE__SLURM__LOG_DIRECTORY": str(tmp_path / "logs"),
        "HPCSCHED_JOBQUEUE__SLURM__JOB_NAME": name,
        "HPCSCHED_JOBQUEUE__SLURM__JOB_SCRIPT_PROLOGUE": json.dumps(
            [f"export PYTHONPATH={worker_env()['PYTHONPATH']}"]),
        "HPCSCHED_JOBQUEUE__POLL_INTERVAL": "0.5",
        **settings,
        **worker_env(),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # the kernel inherits this process's environment
    nb = nbformat.read(notebook, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()  # raises CellExecutionError on any cell error
    finally:
        wait_until(lambda: not our_jobs(name), timeout=60,
                   what="the notebook's jobs to leave the SLURM queue")
    return nb


@pytest.mark.slurm
@pytest.mark.timeout(400)
def test_login_node_notebook_runs_against_slurm(slurm, tmp_path, monkeypatch):
    nb = execute_against_slurm(NOTEBOOK, tmp_path, monkeypatch,
                               HPCSCHED_ADAPTIVE__INTERVAL="0.5")
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    texts = "".join(o.get("text", "") for o in outputs)
    assert "sum of x @ x.T:" in texts and "report.html:" in texts
    (tmp_path / "outputs.json").write_text(json.dumps(outputs, indent=1, default=str))
    assert "/status?token=" in texts, f"no dashboard link; outputs: {tmp_path / 'outputs.json'}"
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("Dashboard" in h and "Workers" in h for h in html)  # the Client's repr
    widgets = [o for o in outputs if "application/vnd.jupyter.widget-view+json"
               in o.get("data", {})]
    assert widgets, "progress() showed no widget"
    report = (tmp_path / "report.html").read_text()
    assert '<script id="data" type="application/json">' in report
