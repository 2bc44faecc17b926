"""Under MPI, a job run again with the same journal skips the tasks it checkpointed.

``mpiexec -n 3 python -m hpcsched --journal J tests/hpc/scripts/checkpointed.py``: the
first run ends with an error halfway through its tasks (a job out of walltime); the
second runs only the tasks whose results were not kept, and gets every result right; a
third runs none. Each task counts its runs in a file of its own.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.hpc.test_mpi_launch import run_mpi
from tests.launchers.test_restart import runs

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec is not on PATH")

N = 200
SCRIPT = "tests/hpc/scripts/checkpointed.py"


def kept(directory: str) -> int:
    """Checkpoint files in ``directory`` (whole ones: temporary files are renamed)."""
    return sum(1 for name in os.listdir(directory) if name.endswith(".pkl"))


@pytest.mark.timeout(300)
def test_a_job_run_again_with_its_journal_skips_the_checkpointed_tasks(tmp_path):
    journal, done = tmp_path / "campaign.journal", tmp_path / "runs"
    done.mkdir()
    checkpoints = f"{journal}.checkpoints"

    def job(stop_after: int) -> tuple[int, str]:
        return run_mpi(3, ["-m", "hpcsched", "--journal", str(journal), SCRIPT, str(done),
                           str(N), str(stop_after)], timeout=120)

    code, out = job(stop_after=N // 2)
    assert code == 1, out[-3000:]
    assert "stopping after" in out
    first = runs(done)
    saved = kept(checkpoints)
    assert N // 2 <= saved < N, (saved, out[-3000:])
    assert sum(first.values()) >= saved

    code, out = job(stop_after=0)
    assert code == 0, out[-3000:]
    assert f"RESULT {sum(2 * i for i in range(N))}" in out
    second = runs(done)
    ran_again = {i: second[i] - first.get(i, 0) for i in second}
    # every task whose result was kept was read, not run: the re-run ran only the others
    assert sum(ran_again.values()) == N - saved, (sum(ran_again.values()), N, saved)
    assert all(n <= 1 for n in ran_again.values())
    assert kept(checkpoints) == N

    code, out = job(stop_after=0)  # everything is kept: nothing runs
    assert code == 0, out[-3000:]
    assert runs(done) == second

