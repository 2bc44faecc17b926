"""Under MPI, a job run again with the same journal skips the tasks it checkpointed.

``mpiexec -n 3 python -m hpcsched --journal J tests/hpc/scripts/checkpointed.py``: the
first run ends halfway through its tasks -- with an error (a job out of walltime), or
killed with every rank; the second runs only the tasks whose results were not kept, and
gets every result right; a third runs none. Each task counts its runs in a file of its
own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.hpc.mpirun import REPO, kill_tree, run_mpi
from tests.launchers.counting import runs

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec is not on PATH")

SCRIPT = "tests/hpc/scripts/checkpointed.py"
# the script and the workers import the tasks from this project's tests
ON_PATH = {"PYTHONPATH": os.pathsep.join(
    p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
RUN = 240.0  # seconds one run of the job may take: a hang detector


def kept(directory: str) -> int:
    """Checkpoint files in ``directory`` (whole ones: temporary files are renamed)."""
    return sum(1 for name in os.listdir(directory) if name.endswith(".pkl"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how,n", [("error", 200), ("kill", 2000)])
def test_a_job_run_again_with_its_journal_skips_the_checkpointed_tasks(tmp_path, how, n):
    journal, done = tmp_path / "campaign.journal", tmp_path / "runs"
    done.mkdir()
    checkpoints = f"{journal}.checkpoints"
    args = ["-m", "hpcsched", "--journal", str(journal), SCRIPT, str(done), str(n)]

    if how == "error":
        code, out = run_mpi(3, [*args, str(n // 2)], timeout=RUN, env=ON_PATH)
        assert code == 1, out[-3000:]
        assert "stopping after" in out
    else:  # the allocation ends: every rank killed at once, some in the middle of a write
        proc = subprocess.Popen(["mpiexec", "-n", "3", sys.executable, *args, "0"], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **ON_PATH})
        try:
            deadline = time.monotonic() + RUN
            while len(os.listdir(done)) < n // 2:
                assert proc.poll() is None, "the job ended before it was killed"
                assert time.monotonic() < deadline, f"half the tasks did not run in {RUN} s"
                time.sleep(0.02)
        finally:
            kill_tree(proc)
    first = runs(done)
    saved = kept(checkpoints)
    assert n // 4 <= saved < n, saved
    assert sum(first.values()) >= saved

    code, out = run_mpi(3, [*args, "0"], timeout=RUN, env=ON_PATH)
    assert code == 0, out[-3000:]
    assert f"RESULT {sum(2 * i for i in range(n))}" in out
    second = runs(done)
    ran_again = {i: second[i] - first.get(i, 0) for i in second}
    # every task whose result was kept was read, not run: the re-run ran only the others
    assert sum(ran_again.values()) == n - saved, (sum(ran_again.values()), n, saved)
    assert all(k <= 1 for k in ran_again.values())
    assert kept(checkpoints) == n

    code, out = run_mpi(3, [*args, "0"], timeout=RUN, env=ON_PATH)  # everything is kept: nothing runs
    assert code == 0, out[-3000:]
    assert runs(done) == second
