"""MPI mode at its walltime (hpcsched/hpc/walltime.py): a job stops before its end, exits
75, keeps its checkpointed results, and its continuation resumes from them.

SIGUSR1 to rank 0 (the notice SLURM's ``--signal`` gives) in the middle of a campaign
under ``mpiexec``, on both roads (a bulk map, tasks one by one). The same on the real
SLURM, stopped by its walltime and continued by ``--requeue``:
tests/jobqueue/test_sbatch_walltime.py.

Each task appends a byte to a file of its own when its work is done
(tests/hpc/scripts/walltime_campaign.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hpcsched.hpc.walltime import EXIT_NOT_FINISHED
from tests.hpc.mpirun import REPO, kill_tree, needs_mpiexec, run_mpi
from tests.launchers.counting import runs

SCRIPT = "tests/hpc/scripts/walltime_campaign.py"
ON_PATH = {"PYTHONPATH": os.pathsep.join(
    p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


def wait_until(pred, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, f"the job ended before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


@needs_mpiexec
@pytest.mark.timeout(240)
@pytest.mark.parametrize("road", ["bulk", "tasks"])
def test_sigusr1_stops_the_job_with_75_and_a_run_again_resumes(tmp_path, road):
    """Stopped at a quarter of the work, then again at half of it (a run that read
    checkpoints: the tasks it runs are no shorter for that), then run to the end: each
    stop exits 75 with every rank, none in MPI_Abort, and no task runs to its end twice."""
    n = 120
    journal, done, pidfile = tmp_path / "campaign.journal", tmp_path / "runs", tmp_path / "pid"
    done.mkdir()
    args = ["-m", "hpcsched", "--journal", str(journal), SCRIPT, str(done), str(n), "0.2",
            road]
    for part in (1, 2):
        pidfile.unlink(missing_ok=True)
        proc = subprocess.Popen(["mpiexec", "-n", "3", sys.executable, *args, str(pidfile)],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                                env={**os.environ, **ON_PATH})
        try:
            wait_until(lambda part=part: len(os.listdir(done)) >= part * n // 4 and pidfile.exists(),
                       120, f"{part} quarter(s) of the tasks", proc)
            os.kill(int(pidfile.read_text()), signal.SIGUSR1)
            out, _ = proc.communicate(timeout=60)
        finally:
            kill_tree(proc)
        assert proc.returncode == EXIT_NOT_FINISHED, out[-3000:]
        assert "before its job's end (signal SIGUSR1" in out, out[-3000:]
        assert "Not finished: exit status 75" in out and "Abort" not in out, out[-3000:]
        assert len(runs(done)) < n, "the job did not stop: every task ran"
        kept = sum(name.endswith(".pkl") for name in os.listdir(f"{journal}.checkpoints"))
        assert kept == len(runs(done))  # the tasks running at the stop ended, and kept theirs

    code, out = run_mpi(3, args, timeout=120, env=ON_PATH)
    assert code == 0, out[-3000:]
    assert f"RESULT {sum(2 * i for i in range(n))}" in out
    assert set(runs(done)) == set(range(n))
    assert max(runs(done).values()) == 1, {i: k for i, k in runs(done).items() if k > 1}
