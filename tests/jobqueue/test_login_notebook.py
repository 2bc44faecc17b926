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
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.jobqueue.notebooks import execute_against_slurm

NOTEBOOK = Path(REPO) / "examples" / "login_node.ipynb"


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
