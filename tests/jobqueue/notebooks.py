"""A notebook run headless against the real SLURM on localhost, as a user runs it: a
Jupyter kernel (nbclient, the runner Jupyter itself uses) executes it cell by cell, any
cell error fails the test, and every job it submitted must have left the queue."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until, worker_env


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
