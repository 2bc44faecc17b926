"""The Client against a cluster of MPI ranks (pytest-mpi; needs 3 ranks or more).

    mpiexec -n 4 python -m pytest --with-mpi -q tests/hpc/test_mpi_client.py

The module fixture ``cluster`` (tests/hpc/conftest.py) builds the cluster on every rank: rank 0 runs a scheduler
on ``mpi://0`` and a Client over ``inproc://``; every other rank runs a Worker
in the background of its pytest process. The tests run on rank 0 only (the
others return at once and wait, idle, in the fixture's teardown until rank 0
closes the scheduler, then check their worker was closed by it and served).
tests/hpc/test_mpi_launch.py runs this under mpiexec in the plain suite.
"""

from __future__ import annotations

import operator
import os
import socket
import time

import numpy as np
import pytest

from tests.hpc.conftest import WAIT

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(60)]

def inc(x):
    return x + 1


def where(_=None):
    return os.getpid(), socket.gethostname()


def make_array(n, value):
    return np.full(n, value, dtype=np.float64)


def describe(arr):
    return float(arr.sum()), bool(arr.flags.owndata), os.getpid()


def fail(x):
    raise KeyError(f"missing {x}")


def test_submit_and_map(cluster):
    if cluster is None:
        return
    client, _, _ = cluster
    assert client.submit(inc, 1).result(timeout=WAIT) == 2
    futures = client.map(inc, range(2000))
    assert client.gather(futures, timeout=WAIT) == list(range(1, 2001))


def pid_of(x):
    if x == 13:
        raise ValueError("thirteen")
    return x, os.getpid()


def test_bulk_map_over_worker_ranks(cluster):
    """A large map goes as a bulk map (ranges over MPI), every element its own future: it
    runs on every worker rank, a failing element errs alone, an element feeds a task."""
    if cluster is None:
        return
    client, sched, size = cluster
    n = 20_000
    futures = client.map(pid_of, range(n), pure=False)
    prefix = futures[0].key.rpartition("-")[0] + "-"
    assert wait_for(lambda: prefix in sched.state.bulk.maps), "no bulk map"
    with pytest.raises(ValueError, match="thirteen"):
        futures[13].result(timeout=WAIT)
    rest = client.gather(futures[:13] + futures[14:], timeout=WAIT)
    assert [x for x, _ in rest] == [i for i in range(n) if i != 13]
    assert len({pid for _, pid in rest}) == size - 1
    assert client.submit(lambda t: t[0] * 2, futures[500], pure=False).result(WAIT) == 1000
    del futures, rest
    assert wait_for(lambda: prefix not in sched.state.bulk.maps), "the map was not forgotten"


def wait_for(predicate, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_every_worker_rank_is_registered_with_its_host(cluster):
    if cluster is None:
        return
    client, _, size = cluster
    info = client.scheduler_info()["workers"]
    assert sorted(info) == [f"mpi://{r}" for r in range(1, size)]
    for addr, w in info.items():
        assert w["host"] == socket.gethostname()
        assert w["name"] == f"rank-{addr.rsplit('/', 1)[1]}"
        assert w["nthreads"] == 2 and w["memory_limit"] == 2**30


def test_tasks_run_on_every_worker_rank(cluster):
    if cluster is None:
        return
    client, _, size = cluster
    workers = sorted(client.scheduler_info()["workers"])
    pids = {client.submit(where, w, workers=[w], pure=False).result(timeout=WAIT)[0]
            for w in workers}
    assert len(pids) == size - 1 and os.getpid() not in pids


def test_tree_reduction_graph(cluster):
    if cluster is None:
        return
    client, _, _ = cluster
    leaves = 256
    dsk = {("x", i): i for i in range(leaves)}
    level, width = 0, leaves
    while width > 1:
        for i in range(width // 2):
            dsk[("s", level + 1, i)] = (operator.add, ("x", 2 * i) if level == 0 else
                                        ("s", level, 2 * i),
                                        ("x", 2 * i + 1) if level == 0 else
                                        ("s", level, 2 * i + 1))
        level, width = level + 1, width // 2
    assert client.get(dsk, ("s", level, 0), timeout=WAIT) == leaves * (leaves - 1) // 2


def test_dependency_moves_between_worker_ranks_without_copies(cluster):
    if cluster is None:
        return
    client, _, _ = cluster
    a_addr, b_addr = sorted(client.scheduler_info()["workers"])[:2]
    n = 4 * 2**20 // 8
    a = client.submit(make_array, n, 1.5, workers=[a_addr])
    b = client.submit(describe, a, workers=[b_addr])
    total, owndata, pid = b.result(timeout=WAIT)
    assert total == 1.5 * n
    assert not owndata, "the array was copied after MPI received it"
    assert pid == client.submit(where, workers=[b_addr], pure=False).result(timeout=WAIT)[0]
    # and back to the client (worker -> scheduler -> client)
    arr = a.result(timeout=WAIT)
    assert arr.shape == (n,) and arr[0] == 1.5


def test_scatter_then_compute(cluster):
    if cluster is None:
        return
    client, _, _ = cluster
    data = np.arange(200_000, dtype=np.int64)
    [fut] = client.scatter([data])
    assert client.submit(np.sum, fut).result(timeout=WAIT) == data.sum()


def test_task_error_leaves_the_cluster_working(cluster):
    if cluster is None:
        return
    client, _, size = cluster
    bad = client.submit(fail, "x")
    with pytest.raises(KeyError, match="missing x"):
        bad.result(timeout=WAIT)
    assert "KeyError" in str(bad.traceback() or "") or bad.exception() is not None
    assert client.submit(inc, 41).result(timeout=WAIT) == 42
    assert len(client.scheduler_info()["workers"]) == size - 1


def test_client_without_address_uses_the_default_scheduler(cluster):
    if cluster is None:
        return
    from hpcsched.core.client import client as client_mod

    _, sched, _ = cluster
    inproc = sched.add_listener("inproc://")
    old = client_mod.default_scheduler_address
    client_mod.default_scheduler_address = inproc
    try:
        with client_mod.Client(set_as_default=False) as c:
            assert c.cluster is None  # no LocalCluster was started
            assert c.submit(inc, 9).result(timeout=WAIT) == 10
    finally:
        client_mod.default_scheduler_address = old


def test_idle_worker_ranks_do_not_spin(cluster):
    if cluster is None:
        return
    import psutil

    client, _, _ = cluster
    workers = sorted(client.scheduler_info()["workers"])
    pids = [client.submit(where, workers=[w], pure=False).result(timeout=WAIT)[0]
            for w in workers]
    procs = [psutil.Process(p) for p in pids] + [psutil.Process()]
    # the back-off keeps a 1 ms cap for the first second of idleness (a reply is
    # usually near); the claim is about the idleness after it
    time.sleep(1.2)
    before = [sum(p.cpu_times()[:2]) for p in procs]
    t0 = time.monotonic()
    time.sleep(3.0)  # measuring idleness: nothing to wait for
    elapsed = time.monotonic() - t0
    used = [(sum(p.cpu_times()[:2]) - b) / elapsed for p, b in zip(procs, before, strict=True)]
    # each worker rank's progress thread polls a few dozen times a second (~0.1 %)
    assert max(used[:-1]) < 0.02, f"idle worker ranks used {used[:-1]} of a CPU"
    assert used[-1] < 0.04, f"idle rank 0 (scheduler + client) used {used[-1]:.3f} of a CPU"


def test_idle_worker_ranks_report_their_metrics(cluster):
    # idle ranks stay nearly silent (no per-second heartbeat over MPI), but each reports
    # its CPU and memory now and then, so the dashboard's workers table stays current
    if cluster is None:
        return
    from tests.conftest import wait_until

    _, sched, size = cluster

    def report_times():
        return sched.call(lambda s: {a: (ws.metrics or {}).get("time", 0.0)
                                     for a, ws in s.state.workers.items()})

    since = time.time()
    assert len(report_times()) == size - 1
    wait_until(lambda: all(t > since for t in report_times().values()), timeout=WAIT,
               what="a fresh report from every idle worker rank")
    metrics = sched.call(lambda s: [ws.metrics for ws in s.state.workers.values()])
    assert all("memory" in m and "cpu" in m for m in metrics), metrics
