"""MPI mode at its walltime on the real SLURM (hpcsched/hpc/walltime.py).

``sbatch --time=1`` of a batch script running ``mpiexec -n 3 python -m hpcsched --journal
J --requeue`` on checkpointed work of about 2.5 minutes: each job stops before its
walltime (``SLURM_JOB_END_TIME``), exits 75 and queues its continuation, until one
finishes; every result right and no task run to its end twice (each task appends a byte
to a file of its own when its work is done: tests/hpc/scripts/walltime_campaign.py).
Both ways of continuing: ``sbatch`` of the same script (a job SLURM may not requeue) and
``scontrol requeue`` (SLURM starts a requeued job two minutes later: the longer test).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.jobqueue.batch import ROOT
from tests.launchers.counting import runs

SCRIPT = "tests/hpc/scripts/walltime_campaign.py"
BATCH_SCRIPT = """#!/bin/bash
#SBATCH -n 3
#SBATCH -t 1
cd {repo}
export PYTHONPATH={repo}
mpiexec -n 3 {python} -m hpcsched --journal {journal} --requeue --walltime-margin 15 \\
    {script} {done} {n} {seconds} bulk
"""


def slurm_jobs(name: str) -> list[tuple[str, str]]:
    """(id, state) of this user's jobs of the name ``name``, finished ones included."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-n", name, "-o", "%i %T"],
                         capture_output=True, text=True, timeout=30).stdout
    return [tuple(line.split()[:2]) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("requeue", ["sbatch", "scontrol"])
def test_a_campaign_longer_than_its_jobs_goes_on_in_continuations(slurm, tmp_path, requeue):
    """3 ranks (2 workers of one thread), 300 tasks of 1 s: 150 s of work, in jobs of
    60 s that stop 15 s before their end."""
    n, seconds = 300, 1.0
    done = tmp_path / "runs"
    done.mkdir()
    script = tmp_path / "campaign.sh"
    script.write_text(BATCH_SCRIPT.format(repo=ROOT, python=sys.executable, n=n, seconds=seconds,
                                          journal=tmp_path / "campaign.journal",
                                          script=SCRIPT, done=done))
    name = f"hpcsched-walltime-{os.getpid()}-{tmp_path.name}"[:60]
    log = tmp_path / "campaign.out"
    submit = ["sbatch", "--parsable", "-J", name, "-o", str(log), "--open-mode=append"]
    if requeue == "sbatch":
        submit.append("--no-requeue")  # the continuation is an sbatch of the same script
    try:
        subprocess.run([*submit, str(script)], check=True, capture_output=True, text=True,
                       timeout=30)
        patience = 840 if requeue == "sbatch" else 1700
        deadline = time.monotonic() + patience
        while True:
            text = log.read_text() if log.exists() else ""
            if f"RESULT {sum(2 * i for i in range(n))}" in text:
                break
            assert time.monotonic() < deadline, f"no result after {patience} s: {text[-4000:]}"
            time.sleep(1.0)
        jobs = slurm_jobs(name)
    finally:
        ids = [job_id for job_id, _ in slurm_jobs(name)]
        if ids:
            subprocess.run(["scancel", *ids], timeout=30)
    text = log.read_text()
    stops = text.count("Not finished: exit status 75")
    print(f"{len(jobs)} jobs, {stops} stopped before their walltime")
    assert stops >= 2 and text.count("continuation queued") == stops, text[-4000:]
    assert "DUE TO TIME LIMIT" not in text, text[-4000:]  # none was killed at its walltime
    assert set(runs(done)) == set(range(n))
    assert max(runs(done).values()) == 1, {i: k for i, k in runs(done).items() if k > 1}
