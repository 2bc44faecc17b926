"""Scheduling policies seen on a real LocalCluster (issue 4), where only the whole
system shows them: fusion of graphs given to ``get``, resources declared by
workers, work stealing between worker servers, the local scheduler behind
``hpcsched.get``.

Most tests use ``processes=False`` (worker servers as threads over inproc://:
the same Scheduler/Worker code, started in a fraction of a second); stealing is
also shown with worker processes over TCP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from operator import add
from typing import Any

import pytest

from hpcsched.core.client.client import Client
from hpcsched.launchers.local_cluster import LocalCluster


def inc(x: int) -> int:
    return x + 1


def slow_inc(x: int, i: int, seconds: float = 0.4) -> int:
    time.sleep(seconds)
    return x + i


def interval(i: int, seconds: float = 0.15) -> tuple[float, float]:
    start = time.monotonic()
    time.sleep(seconds)
    return (start, time.monotonic())


@pytest.fixture
def inproc() -> Iterator[tuple[LocalCluster, Client]]:
    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False)
    try:
        client = Client(cluster, set_as_default=False)
        try:
            yield cluster, client
        finally:
            client.close()
    finally:
        cluster.close()


def scheduled_keys(cluster: LocalCluster, run: Any) -> tuple[Any, set]:
    """Run ``run()``; return its result and the keys the scheduler saw (from its
    transition log)."""
    cluster.scheduler.call(lambda s: s.state.transition_log.clear())
    result = run()
    # keys that were scheduled; releases of an earlier call's keys may still trickle in
    keys = cluster.scheduler.call(lambda s: {k for k, _, finish, *_ in s.state.transition_log
                                             if finish not in ("released", "forgotten")})
    return result, keys


def chain(prefix: str) -> dict:
    """``{prefix}a -> b -> c -> d`` (d = a + 3), and ``e = b + d``::

            e
           / \\
          d   |
          |   |
          c   |
          |   |
          b --+
          |
          a
    """
    return {f"{prefix}a": 1, f"{prefix}b": (inc, f"{prefix}a"), f"{prefix}c": (inc, f"{prefix}b"),
            f"{prefix}d": (inc, f"{prefix}c"), f"{prefix}e": (add, f"{prefix}b", f"{prefix}d")}


# ================================================================ 8. fusion
def test_get_fuses_linear_chains_by_default(inproc: tuple[LocalCluster, Client]):
    """``b`` has two dependents, so only ``c -> d`` is a chain (and ``a -> b``): the
    scheduler sees b, d, e; results are found under the chain ends' names."""
    cluster, client = inproc
    result, keys = scheduled_keys(cluster, lambda: client.get(chain("f-"), ["f-e", "f-d"]))
    assert result == [2 + 4, 4]
    assert keys == {"f-b", "f-d", "f-e"}


def test_get_without_fusion_schedules_every_task(inproc: tuple[LocalCluster, Client],
                                                 monkeypatch: pytest.MonkeyPatch):
    cluster, client = inproc
    result, keys = scheduled_keys(cluster, lambda: client.get(chain("n-"), "n-e", fuse=False))
    assert result == 6 and keys == {"n-a", "n-b", "n-c", "n-d", "n-e"}
    # the same through the environment layer of the configuration
    monkeypatch.setenv("HPCSCHED_SCHEDULER__FUSE", "false")
    result, keys = scheduled_keys(cluster, lambda: client.get(chain("m-"), "m-e"))
    assert result == 6 and keys == {"m-a", "m-b", "m-c", "m-d", "m-e"}


def test_intermediate_keys_asked_for_are_kept(inproc: tuple[LocalCluster, Client]):
    cluster, client = inproc
    result, keys = scheduled_keys(cluster, lambda: client.get(chain("k-"), ["k-c", "k-e"]))
    assert result == [3, 6] and keys == {"k-b", "k-c", "k-d", "k-e"}


# ================================================================ 6. resources
def test_resources_declared_by_a_worker_are_respected(inproc: tuple[LocalCluster, Client]):
    """Worker ``gpu`` (2 threads, GPU=1) joins a cluster whose other worker has no
    GPU. Tasks asking for ``{"GPU": 1}`` all run there, one at a time."""
    from hpcsched.core.worker.server import Worker

    cluster, client = inproc
    w = Worker(cluster.scheduler_address, nthreads=2, resources={"GPU": 1}, name="gpu",
               security=cluster.security)
    w.start()
    try:
        client.wait_for_workers(2, timeout=10)
        futures = [client.submit(interval, i, resources={"GPU": 1}, key=f"gpu-{i}")
                   for i in range(4)]
        spans = sorted(client.gather(futures, timeout=30))
        keys = [f.key for f in futures]
        where = cluster.scheduler.call(lambda s: s.state.who_has(keys))
        assert all(holders == [w.address] for holders in where.values()), where
        for (_, stop), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= stop - 0.01, spans  # never two at once: one GPU
        del futures
    finally:
        w.close("test over")


# ================================================================ 7. stealing
def run_backlog(client: Client, cluster: LocalCluster) -> dict:
    """Scatter ``x`` to one worker, then submit 4 slow tasks that need it: placed by
    ``decide_worker`` on the holder (4 tasks on 2 threads are not root-ish).
    Returns ``{key: [holders]}`` of the results."""
    workers = sorted(client.scheduler_info()["workers"])
    [x] = client.scatter([10], workers=[workers[0]])
    futures = [client.submit(slow_inc, x, i, key=f"slow-{i}") for i in range(4)]
    assert client.gather(futures, timeout=60) == [10, 11, 12, 13]
    out = cluster.scheduler.call(lambda s: s.state.who_has([f.key for f in futures]))
    out["x"] = workers[0]
    return out


@pytest.mark.timeout(60)
def test_idle_worker_process_steals_from_a_backlogged_one(cluster: LocalCluster,
                                                          client: Client):
    """Two worker processes of one thread (TCP): the idle one takes work."""
    where = run_backlog(client, cluster)
    holder = where.pop("x")
    assert any(h != [holder] for h in where.values()), where


def test_no_stealing_when_disabled():
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                           scheduler_kwargs={"work_stealing": False})
    try:
        with Client(cluster, set_as_default=False) as client:
            where = run_backlog(client, cluster)
        holder = where.pop("x")
        assert all(h == [holder] for h in where.values()), where
    finally:
        cluster.close()


# ================================================================ 9. local scheduler
def test_hpcsched_get_is_the_local_scheduler():
    import hpcsched
    from hpcsched.core.client import local

    assert hpcsched.get is local.get
    threads = set()

    def record(x: int) -> int:
        threads.add(threading.get_ident())
        return x

    dsk = {("x", i): (record, i) for i in range(8)}
    dsk["total"] = (sum, [("x", i) for i in range(8)])
    assert hpcsched.get(dsk, "total", num_workers=2) == 28
    assert 1 <= len(threads) <= 2  # num_workers threads at most
