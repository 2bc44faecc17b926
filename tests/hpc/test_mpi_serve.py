"""An MPI job that serves clients: ``mpiexec -n 3 python -m hpcsched --scheduler-file F``.

No script: rank 0 runs the scheduler, reachable over authenticated TCP by a client
in another process (this test's, as a notebook on the login node would be), and ranks
1-2 are workers talking MPI. The job ends when the client calls ``shutdown()``, or at
the batch job's end (``SLURM_JOB_END_TIME``), with no process of it left.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest

from hpcsched.hpc.command import end_time
from tests.conftest import wait_until
from tests.hpc.mpi_scripts import REPO_ON_PATH, assert_all_gone, kill_run, run, start
from tests.hpc.mpirun import needs_mpiexec

START_TIMEOUT = 90.0  # seconds for three ranks to start on this loaded 2-core machine


def inc(x: int) -> int:
    return x + 1


def block(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(100_000)


def total(*blocks: np.ndarray) -> float:
    return float(sum(b.sum() for b in blocks))


class Job:
    """A serving job started by :func:`serving`: its process, its mark, its scheduler file."""

    def __init__(self, proc: subprocess.Popen, mark: str, path: Path):
        self.proc, self.mark, self.path = proc, mark, path

    def wait(self, timeout: float) -> int:
        """The job's exit status once mpiexec exits (every rank checked gone)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job did not end within {timeout}s\n{self.output()}")
        assert_all_gone(self.mark, self.proc)
        return code

    def output(self) -> str:
        if self.proc.poll() is None:
            kill_run(self.proc, self.mark)
        out, err = self.proc.communicate(timeout=10)
        return f"--- stdout\n{out[-3000:]}\n--- stderr\n{err[-5000:]}"


@pytest.fixture
def serving(tmp_path: Path) -> Iterator:
    """``serving(*options, env=...)`` starts a serving job of 3 ranks; every job started is
    killed at the end of the test if it is still there."""
    jobs: list[Job] = []

    def make(*options: str, env: dict | None = None) -> Job:
        path = tmp_path / f"scheduler-{len(jobs)}.json"
        proc, mark = start(["--scheduler-file", str(path), "--nthreads", "1", *options],
                           nprocs=3, env={**REPO_ON_PATH, **(env or {})})
        jobs.append(Job(proc, mark, path))
        return jobs[-1]

    yield make
    for job in jobs:
        if job.proc.poll() is None:
            kill_run(job.proc, job.mark)
        assert_all_gone(job.mark, job.proc)


# ------------------------------------------------------------------ pure
def test_the_end_is_the_batch_jobs_minus_the_margin():
    assert end_time(30, {"SLURM_JOB_END_TIME": "1700000600"}) == 1700000570.0
    assert end_time(0, {"SLURM_JOB_END_TIME": "1700000600"}) == 1700000600.0
    assert end_time(30, {}) is None
    assert end_time(30, {"SLURM_JOB_END_TIME": "soon"}) is None


def test_a_script_or_a_scheduler_file_not_both_nor_neither(tmp_path):
    r = run(["--nthreads", "1"], nprocs=None, timeout=60)
    assert r.code == 2 and "give a SCRIPT to run, or --scheduler-file F" in r.err, r
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    r = run(["--scheduler-file", str(tmp_path / "f.json"), str(script)], nprocs=None,
            timeout=60)
    assert r.code == 2 and "give one or the other" in r.err, r


def test_serving_alone_is_a_clear_error(tmp_path):
    """One process is no cluster: rank 0 would serve no worker."""
    r = run(["--scheduler-file", str(tmp_path / "f.json")], nprocs=None, timeout=60)
    assert r.code == 1 and "at least 2 ranks" in r.err, r
    assert not (tmp_path / "f.json").exists()


# ------------------------------------------------------------------ under mpiexec
@needs_mpiexec
@pytest.mark.timeout(240)
def test_a_client_elsewhere_computes_on_the_job_and_its_shutdown_ends_every_rank(
        serving, road):
    from hpcsched import Client

    job = serving()
    client = Client(scheduler_file=str(job.path), timeout=START_TIMEOUT,
                    set_as_default=False)
    try:
        # the file holds the TCP address and the secret the connection proved
        written = json.loads(job.path.read_text())
        assert written["address"].startswith("tcp://") and written["secret"], written
        assert os.stat(job.path).st_mode & 0o077 == 0
        workers = sorted(client.scheduler_info()["workers"])
        assert workers == ["mpi://1", "mpi://2"]
        # a map above the bulk threshold, or as many single tasks
        futures = road.calls(client, inc, 40)
        assert client.gather(futures, timeout=60) == [inc(i) for i in range(40)]
        # a block on each worker rank, then each sums both: one comes over MPI
        parts = [client.submit(block, i, workers=[w], pure=False)
                 for i, w in enumerate(workers)]
        sums = [client.submit(total, *parts, workers=[w], pure=False) for w in workers]
        expected = total(block(0), block(1))
        assert client.gather(sums, timeout=60) == [pytest.approx(expected)] * 2
        # a dask array computation, against dask's own synchronous scheduler
        x = da.random.RandomState(1).random((200, 200), chunks=50)
        arr = (x @ x.T).mean(axis=0)
        np.testing.assert_allclose(client.compute(arr).result(timeout=60),
                                   dask.compute(arr, scheduler="sync")[0])
        client.shutdown()
    finally:
        client.close()
    assert job.wait(60) == 0
    assert not job.path.exists()


@needs_mpiexec
@pytest.mark.timeout(180)
def test_the_job_ends_by_itself_at_its_walltime(serving):
    """SLURM_JOB_END_TIME a little ahead: the job ends then, every rank with 0, before
    the batch system would kill it."""
    end = time.time() + 45
    job = serving("--walltime-margin", "5", env={"SLURM_JOB_END_TIME": str(int(end))})
    wait_until(job.path.exists, timeout=START_TIMEOUT, what="the scheduler file")
    assert job.wait(end - time.time() + 30) == 0
    ended = time.time()
    assert ended >= end - 5 - 1, "ended before its time"
    assert not job.path.exists()
