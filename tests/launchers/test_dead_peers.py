"""Dead and hung peers, with real processes: a worker outlives no scheduler, a client does not
wait forever on a stopped one, a LocalCluster keeps its size whatever way a worker left.

Every process a test starts is killed (after SIGCONT where it was stopped) in ``finally``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from hpcsched import Client, LocalCluster
from hpcsched.core import config
from tests.conftest import wait_until
from tests.launchers.procs import WORKER_OPTS, start_scheduler


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def leave_quietly() -> None:
    os._exit(0)


def executing(client: Client) -> int:
    return sum(w["executing"] for w in client.scheduler_info()["workers"].values())


@pytest.mark.timeout(120)
def test_a_worker_busy_in_a_task_exits_when_its_scheduler_is_killed(procs, tmp_path):  # noqa: F811
    """A scheduler without a journal does not come back: its worker and its client do not
    wait for it (the reconnect timeouts, 300 s by default, are for journaled schedulers)."""
    sfile = tmp_path / "scheduler.json"
    sched = start_scheduler(procs, sfile)
    worker = procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file",
                          str(sfile), "--death-timeout", "10", *WORKER_OPTS], "worker")
    client = Client(str(sfile), set_as_default=False)
    try:
        client.wait_for_workers(1, timeout=30)
        fut = client.submit(nap, 600, pure=False)
        wait_until(lambda: executing(client) == 1, timeout=30, what="the task running")
        sched.kill()
        sched.wait(10)
        code = worker.wait(30)  # at once, whatever the task is doing
        assert code != 0, "a worker whose scheduler vanished must not claim success"
        with pytest.raises(Exception) as info:
            fut.result(timeout=30)
        assert not isinstance(info.value, TimeoutError), info.value
    finally:
        client.close(timeout=1)


@pytest.mark.timeout(120)
def test_a_worker_of_a_journaled_scheduler_waits_for_it_then_exits(procs, tmp_path):  # noqa: F811
    sfile = tmp_path / "scheduler.json"
    sched = start_scheduler(procs, sfile, "--journal", str(tmp_path / "journal"))
    worker = procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file",
                          str(sfile), "--death-timeout", "10",
                          "--scheduler-reconnect-timeout", "3", *WORKER_OPTS], "worker")
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(1, timeout=30)
    sched.kill()
    sched.wait(10)
    gone = time.monotonic()
    code = worker.wait(30)  # past its reconnect timeout
    assert time.monotonic() - gone >= 2.5, "it exited without waiting for its scheduler"
    assert code != 0, "a worker whose scheduler vanished must not claim success"


@pytest.mark.timeout(120)
def test_the_client_raises_when_its_scheduler_stops_answering(procs, tmp_path):  # noqa: F811
    sfile = tmp_path / "scheduler.json"
    sched = start_scheduler(procs, sfile)
    procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file", str(sfile),
                 *WORKER_OPTS], "worker")
    stopped = False
    try:
        # no reconnecting: the scheduler is given up on as soon as the watch says so
        with config.set({"client.heartbeat-interval": 0.2, "client.scheduler-timeout": 3.0,
                         "client.scheduler-reconnect-timeout": 0}):
            client = Client(str(sfile), set_as_default=False)
        client.wait_for_workers(1, timeout=30)
        fut = client.submit(nap, 600, pure=False)
        wait_until(lambda: executing(client) == 1, timeout=30, what="the task running")
        os.kill(sched.pid, signal.SIGSTOP)
        stopped = True
        t0 = time.monotonic()
        # before: blocks until this timeout (TimeoutError); now the watch gives up first
        with pytest.raises(ConnectionError, match="did not answer"):
            fut.result(timeout=60)
        assert time.monotonic() - t0 < 30
        assert client.status == "disconnected"
        client.close(timeout=1)
    finally:
        if stopped:
            os.kill(sched.pid, signal.SIGCONT)


def worker_pids(cluster: LocalCluster) -> set[int]:
    return {w["pid"] for w in cluster.scheduler_info_workers().values()}


@pytest.mark.timeout(120)
def test_local_cluster_replaces_a_worker_that_exits_0():
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=0) as cluster, \
            Client(cluster, set_as_default=False) as client:
        before = worker_pids(cluster)
        victim = sorted(cluster.scheduler_info_workers())[0]
        client.submit(leave_quietly, workers=[victim], pure=False)
        wait_until(lambda: len(worker_pids(cluster)) == 2 and worker_pids(cluster) != before,
                   timeout=60, what="a replacement worker")
        assert len(before & worker_pids(cluster)) == 1


@pytest.mark.timeout(120)
def test_local_cluster_replaces_a_worker_dropped_while_stopped():
    """Stopped past the scheduler's worker-ttl, the worker is removed; resumed, it finds its
    connection closed and exits: the cluster starts another."""
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=0,
                      scheduler_kwargs={"worker_ttl": 2.0}) as cluster, \
            Client(cluster, set_as_default=False):
        (pid,) = worker_pids(cluster)
        proc = psutil.Process(pid)
        proc.suspend()
        try:
            wait_until(lambda: pid not in worker_pids(cluster), timeout=60,
                       what="the stopped worker removed")
        finally:
            proc.resume()
        wait_until(lambda: len(worker_pids(cluster)) == 1 and pid not in worker_pids(cluster),
                   timeout=60, what="a replacement worker")
