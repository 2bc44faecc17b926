"""examples/sbatch_mpi.sh submitted to the real SLURM: one allocation of 4 tasks,
``mpiexec -n 4 python -m hpcsched script.py`` inside, the script's output in the log."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsched.jobqueue.systems.slurm import SLURMSystem

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sbatch_mpi.sh"


def _submit(tmp_path: Path, *args: str) -> tuple[str, Path]:
    out = tmp_path / "job-%j.out"
    env_python = f"ALL,PYTHON={sys.executable}"
    job_id = SLURMSystem.parse_job_id(subprocess.run(
        ["sbatch", "--parsable", f"--export={env_python}", "-o", str(out), str(EXAMPLE), *args],
        capture_output=True, text=True, check=True, timeout=30, cwd=tmp_path).stdout)
    return job_id, tmp_path / f"job-{job_id}.out"


def _wait(job_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        time.sleep(0.3)
    subprocess.run(["scancel", job_id], timeout=30)
    raise AssertionError(f"job {job_id} still {state or 'unknown'} after {timeout} s (cancelled)")


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_sbatch_mpi_example_runs_the_demo_in_one_allocation(slurm, tmp_path):
    job_id, log = _submit(tmp_path)
    try:
        state = _wait(job_id, 90)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    text = log.read_text() if log.exists() else "(no log)"
    assert state == "COMPLETED", text
    assert "sum of squares: 328350" in text
    assert "workers: 3" in text  # 4 ranks: scheduler + script on rank 0, 3 worker ranks


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_sbatch_mpi_example_passes_the_scripts_failure_to_the_job(slurm, tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("from hpcsched import Client\nwith Client() as c:\n"
                      "    assert c.submit(sum, [1, 2]).result() == 3\n"
                      "raise SystemExit(7)\n")
    job_id, log = _submit(tmp_path, str(script))
    try:
        state = _wait(job_id, 90)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    text = log.read_text() if log.exists() else "(no log)"
    assert state == "FAILED", text
    detail = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                            timeout=30).stdout
    assert "ExitCode=7:0" in detail, detail + text
