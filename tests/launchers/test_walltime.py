"""Walltime-aware placement and time limits, with real worker processes, on both roads
(tasks one by one, and maps above the bulk threshold).

A LocalCluster's worker ("fresh", no end) and a worker started beside it with
``--lifetime 2m`` ("short", 2 minutes left and more threads): tasks said to take 10
minutes all run on fresh. A task past its ``time_limit`` fails with an error naming the
limit, and its worker's one slot runs the next task at once.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from hpcsched.core.client.client import Client
from hpcsched.core.worker.tasks.time_limit import TaskTimeLimitExceeded
from tests.conftest import Road, _local_cluster, wait_until, worker_env
from tests.launchers.procs import hpcsched_cmd


def where(i: int) -> str:
    import hpcsched

    time.sleep(0.01)
    return hpcsched.get_worker().name


def slow_at(i: int, slow: int, seconds: float) -> int:
    time.sleep(seconds if i == slow else 0.0)
    return i


@pytest.fixture
def two_workers(procs: Any) -> Any:
    """(client, short worker's address): fresh from the LocalCluster, short beside it."""
    with _local_cluster(n_workers=1, threads_per_worker=1) as cluster, \
            Client(cluster, set_as_default=False) as client:
        procs.start([*hpcsched_cmd(), "worker", cluster.scheduler_address, "--name", "short",
                     "--nthreads", "2", "--memory-limit", "0", "--lifetime", "2m"], "short",
                    env={**worker_env(), "HPCSCHED_SECRET": cluster.security.secret_hex()})
        client.wait_for_workers(2, timeout=60)
        yield client, next(a for a, w in client.scheduler_info()["workers"].items()
                           if w["name"] == "short")


@pytest.mark.timeout(180)
def test_tasks_said_to_take_10_minutes_avoid_the_worker_with_2_left(two_workers: Any,
                                                                    road: Road):
    client, short = two_workers
    info = client.scheduler_info()["workers"][short]
    assert 100 < info["lifetime_end"] - time.time() <= 120
    names = client.gather(road.calls(client, where, 40, duration="10m"), timeout=120)
    assert "short" not in names and len(set(names)) == 1
    # and tasks that fit in its 2 minutes do run there (its threads are the idle ones)
    fits = road.calls(client, where, 40, duration="1s")
    assert "short" in client.gather(fits, timeout=120)


@pytest.mark.timeout(180)
def test_a_task_past_its_time_limit_fails_naming_it_and_frees_its_slot(road: Road):
    with _local_cluster(n_workers=1, threads_per_worker=1) as cluster, \
            Client(cluster, set_as_default=False) as client:
        one = client.submit(slow_at, 0, 0, 20.0, time_limit="1s", pure=False)
        with pytest.raises(TaskTimeLimitExceeded, match=r"time_limit='1s' \(1 s\)"):
            one.result(timeout=60)
        t0 = time.monotonic()
        # the one slot is free again while the overrunning code still sleeps
        assert client.submit(slow_at, 1, -1, 0.0, pure=False).result(timeout=30) == 1
        assert time.monotonic() - t0 < 15
        futures = road.calls(client, slow_at, 40, slow=7, seconds=20.0, time_limit="2s")
        wait_until(lambda: all(f.done() for f in futures), timeout=120,
                   what="the map to end")
        failed = [i for i, f in enumerate(futures) if f.status == "error"]
        assert failed == [7]
        assert isinstance(futures[7].exception(), TaskTimeLimitExceeded)
        assert [f.result() for i, f in enumerate(futures) if i != 7] == \
            [i for i in range(40) if i != 7]


def test_a_bad_duration_is_refused_before_anything_is_sent():
    from hpcsched.core.client.collections import timed

    with pytest.raises(ValueError, match="time_limit"):
        timed(print, None, "soon")
    with pytest.raises(ValueError, match="duration"):
        timed(print, -5, None)
    func, seconds = timed(print, "1h30m", "2h")
    assert seconds == 5400.0 and func.seconds == 7200.0 and func.__name__ == "print"


@pytest.mark.timeout(120)
def test_dask_annotate_gives_calls_and_collections_their_duration(client: Client):
    dask = pytest.importorskip("dask")
    with dask.annotate(duration="20m"):
        call = client.submit(slow_at, 1, -1, 0.0, pure=False)
        delayed = client.compute(dask.delayed(slow_at)(2, -1, 0.0))
    said = client.submit(slow_at, 3, -1, 0.0, duration="00:05:00", pure=False)
    plain = client.submit(slow_at, 4, -1, 0.0, pure=False)
    futures = [call, delayed, said, plain]
    assert client.gather(futures, timeout=60) == [1, 2, 3, 4]

    keys = [f.key for f in futures]

    def durations(dask_scheduler: Any) -> list:
        return [dask_scheduler.state.tasks[k].duration for k in keys]

    assert client.run_on_scheduler(durations) == [1200.0, 1200.0, 300.0, None]


@pytest.mark.timeout(120)
def test_a_worker_in_a_slurm_job_says_when_its_walltime_ends(procs: Any):
    """SLURM_JOB_END_TIME (launchers/resources.py) is the worker's end, as --lifetime is."""
    end = int(time.time()) + 90
    with _local_cluster(n_workers=0) as cluster, \
            Client(cluster, set_as_default=False) as client:
        procs.start([*hpcsched_cmd(), "worker", cluster.scheduler_address, "--name", "job",
                     "--nthreads", "1", "--memory-limit", "0"], "job",
                    env={**worker_env(), "HPCSCHED_SECRET": cluster.security.secret_hex(),
                         "SLURM_JOB_ID": "4242", "SLURM_JOB_END_TIME": str(end)})
        client.wait_for_workers(1, timeout=60)
        (info,) = client.scheduler_info()["workers"].values()
        assert info["lifetime_end"] == end
