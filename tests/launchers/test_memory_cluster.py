"""Memory management end to end on LocalCluster worker processes: spill, pause, terminate.

Sizes are small (a 200-400 MB memory_limit) as the machine is shared. Each test waits on
conditions (scheduler info, files) with timeouts; the cluster ends every process it started.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import psutil
import pytest

from hpcsched import Client, LocalCluster, wait
from tests.conftest import wait_until

MB = 1_000_000
_held: list = []  # memory a task keeps in its worker process (not a result: unmanaged)


def block(i: int, nbytes: int) -> np.ndarray:
    return np.full(nbytes // 8, i, dtype=np.float64)


def hold_until(path: str, nbytes: int) -> str:
    """Take ``nbytes`` of process memory the worker cannot spill, until ``path`` exists."""
    import time

    _held.append(np.ones(nbytes // 8))
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    _held.clear()
    return "released"


def blow_up_once(marker: str, nbytes: int) -> int:
    """First run: grows past the terminate fraction (and never returns). Rerun: returns."""
    import time

    if os.path.exists(marker):
        return os.getpid()
    Path(marker).write_text(str(os.getpid()))
    _held.append(np.ones(nbytes // 8))
    time.sleep(120)
    return -1


def the_worker(cluster: LocalCluster) -> dict:
    (info,) = cluster.scheduler_info_workers().values()
    return info


@pytest.mark.timeout(180)
def test_results_three_times_the_memory_limit_complete_by_spilling(tmp_path):
    limit = 250 * MB
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=limit,
                      local_directory=str(tmp_path)) as cluster, \
            Client(cluster, set_as_default=False) as client:
        pid = the_worker(cluster)["pid"]
        futures = [client.submit(block, i, 20 * MB, pure=False) for i in range(38)]  # 760 MB
        wait(futures, timeout=120)
        info = the_worker(cluster)
        rss = psutil.Process(info["pid"]).memory_info().rss
        wait_until(lambda: the_worker(cluster)["metrics"].get("in_memory") == 38
                   and "spilled" in the_worker(cluster)["metrics"], timeout=30,
                   what="a heartbeat with memory figures after the last result")
        metrics = the_worker(cluster)["metrics"]
        assert metrics["spilled"] >= 500 * MB, metrics  # most of it went to disk ...
        assert rss < limit, f"worker process holds {rss / MB:.0f} MB"  # ... not memory
        assert any(p.name.startswith("hpcsched-spill-") for p in tmp_path.iterdir())
        # and comes back transparently, a few at a time (one reply holds what it carries)
        for start in range(0, 38, 2):
            for i, arr in enumerate(client.gather(futures[start:start + 2]), start):
                assert arr.shape == (20 * MB // 8,) and arr[0] == i and arr[-1] == i
        # dependents read spilled dependencies on the worker too
        total = client.submit(lambda *a: sum(float(x[0]) for x in a), *futures[:3])
        assert total.result(timeout=60) == 0 + 1 + 2
        assert the_worker(cluster)["pid"] == pid, "the worker was never restarted"
    assert not any(tmp_path.iterdir()), "the spill directory is removed with the worker"


@pytest.mark.timeout(180)
def test_a_paused_worker_starts_nothing_until_memory_drops(tmp_path):
    release = tmp_path / "release"
    # terminate off: this test holds memory past pause on purpose
    with LocalCluster(n_workers=1, threads_per_worker=2, memory_limit=400 * MB,
                      worker_env={"HPCSCHED_WORKER__MEMORY__TERMINATE": "false"}) as cluster, \
            Client(cluster, set_as_default=False) as client:
        holder = client.submit(hold_until, str(release), 360 * MB, pure=False)
        wait_until(lambda: the_worker(cluster)["status"] == "paused", timeout=60,
                   what="the worker paused")
        later = client.submit(os.getpid, pure=False)
        # a thread is free, but the paused worker is given nothing
        def state() -> str | None:
            ts = cluster.scheduler.call(lambda s: s.state.tasks.get(later.key))
            return ts.state if ts is not None else None

        wait_until(state, timeout=30, what="the task at the scheduler")
        assert state() in ("no-worker", "queued"), state()
        release.write_text("go")
        assert holder.result(timeout=60) == "released"
        assert later.result(timeout=60) == the_worker(cluster)["pid"]
        wait_until(lambda: the_worker(cluster)["status"] == "running", timeout=30,
                   what="the worker resumed")


@pytest.mark.timeout(180)
def test_terminate_restarts_the_worker_process_and_its_task_reruns(tmp_path):
    marker = tmp_path / "ran-once"
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=300 * MB) as cluster, \
            Client(cluster, set_as_default=False) as client:
        first = the_worker(cluster)["pid"]
        fut = client.submit(blow_up_once, str(marker), 400 * MB, pure=False)
        pid = fut.result(timeout=120)
        assert marker.exists() and int(marker.read_text()) == first
        assert pid != first, "the task reran in a new worker process"
        assert not psutil.pid_exists(first) or \
            psutil.Process(first).status() == psutil.STATUS_ZOMBIE
        assert the_worker(cluster)["pid"] == pid
