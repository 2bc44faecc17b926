"""LocalCluster: worker processes over authenticated TCP, or threads over inproc.

Every cluster is closed in ``finally`` (or by its context manager); the
autouse leak check of ``tests/conftest.py`` verifies no worker outlives a test.
"""

from __future__ import annotations

import gc
import os
import re
import socket
import sys
import threading
import time
import weakref

import pytest

from hpcsched.core.client.client import Client
from hpcsched.launchers.local_cluster import LocalCluster
from tests.conftest import _local_cluster, hpcsched_children, wait_until, worker_env


def inc(x):
    return x + 1


def getenv(name):
    import os

    return os.environ.get(name)


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t.name.startswith(("hpcsched-worker", "hpcsched-task", "hpcsched-fetch",
                                  "hpcsched-scheduler"))]


def test_processes_over_tcp_compute_and_close():
    with _local_cluster(n_workers=2, threads_per_worker=2) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        assert cluster.security is not None and cluster.security.secret
        procs = cluster.worker_processes
        assert len(procs) == 2 and all(p.poll() is None for p in procs.values())
        info = cluster.workers
        assert len(info) == 2
        assert sorted(w["nthreads"] for w in info.values()) == [2, 2]
        assert {w["pid"] for w in info.values()} == {p.pid for p in procs.values()}
        # the secret travels in the environment, never on the command line
        for p in procs.values():
            assert cluster.security.secret_hex() not in " ".join(map(str, p.args))
        with Client(cluster, set_as_default=False) as client:
            assert client.submit(inc, 1).result(timeout=30) == 2
    assert all(p.poll() is not None for p in procs.values())


def test_threads_over_inproc(monkeypatch):
    before = set(worker_threads())
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster:
        assert cluster.scheduler_address.startswith("inproc://")
        assert cluster.worker_processes == {}
        assert not hpcsched_children()
        with Client(cluster, set_as_default=False) as client:
            assert sum(client.gather(client.map(inc, range(100)), timeout=30)) == 5050
            x = client.scatter(list(range(10)))
            assert client.submit(sum, x).result(timeout=30) == 45
    wait_until(lambda: not (set(worker_threads()) - before), timeout=10,
               what="the cluster's threads to end")


def test_worker_env_reaches_the_workers():
    env = worker_env()
    env["HPCSCHED_TEST_MARKER"] = "marker-42"
    with _local_cluster(n_workers=1, worker_env=env) as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert client.submit(getenv, "HPCSCHED_TEST_MARKER").result(timeout=30) == "marker-42"


def test_scale_up_and_down_keeps_the_data(road):
    with _local_cluster(n_workers=1) as cluster, Client(cluster, set_as_default=False) as client:
        cluster.scale(3)
        cluster.wait_for_workers(3, timeout=30)
        assert len(cluster.worker_processes) == 3
        futures = road.calls(client, inc, 40)
        assert client.gather(futures, timeout=30) == list(range(1, 41))
        cluster.scale(1)
        wait_until(lambda: len(cluster.workers) == 1, timeout=30, what="scale down to 1")
        wait_until(lambda: len(cluster.worker_processes) == 1, timeout=30,
                   what="processes stopped")
        # results held by the retired workers were moved, not recomputed or lost
        assert client.gather(futures, timeout=30) == list(range(1, 41))
        (w,) = cluster.workers.values()
        assert w["n_keys"] == 40


def test_resources_are_declared_and_respected():
    with _local_cluster(n_workers=1, resources={"GPU": 1}) as cluster, \
            Client(cluster, set_as_default=False) as client:
        (w,) = cluster.workers.values()
        assert w["resources"] == {"GPU": 1}
        futures = [client.submit(inc, i, resources={"GPU": 1}) for i in range(4)]
        assert client.gather(futures, timeout=30) == [1, 2, 3, 4]
        # a resource no worker has: the task waits instead of running anywhere
        # (pure=False: inc(1) above is the same pure call, and the same key, as in dask)
        f = client.submit(inc, 1, resources={"TPU": 1}, pure=False)
        wait_until(lambda: client.scheduler_info()["unrunnable"] == 1, timeout=10,
                   what="the TPU task to wait for a worker")
        assert not f.done()
        f.cancel()


@pytest.mark.parametrize("kw", [{"n_workers": -1}, {"threads_per_worker": 0, "n_workers": 1}])
def test_bad_sizes_are_refused(kw):
    with pytest.raises(ValueError, match="make no cluster"):
        LocalCluster(processes=False, **kw)


def test_default_size_follows_the_machine():
    import os

    with LocalCluster(processes=False) as cluster:
        info = cluster.workers
        assert sum(w["nthreads"] for w in info.values()) == (os.cpu_count() or 1)


def test_closing_the_cluster_under_a_client_fails_its_futures_not_hangs():
    cluster = _local_cluster(n_workers=1)
    client = Client(cluster, set_as_default=False)
    try:
        assert client.submit(inc, 1).result(timeout=30) == 2
        f = client.submit(time.sleep, 30)
        cluster.close()
        with pytest.raises(ConnectionError):
            f.result(timeout=20)
    finally:
        client.close(timeout=2)
        cluster.close()


def test_a_dropped_cluster_leaves_no_worker_process():
    cluster = _local_cluster(n_workers=1)
    procs = list(cluster.worker_processes.values())
    ref = weakref.ref(cluster)
    try:
        del cluster
        gc.collect()
        for p in procs:
            p.wait(5)
    finally:
        alive = ref()
        if alive is not None:  # the bug: still alive; close it so nothing is left behind
            alive.close()


def test_a_dropped_cluster_closes_its_scheduler():
    cluster = _local_cluster(n_workers=1)
    host, port = cluster.scheduler_address.split("://")[1].rsplit(":", 1)
    scheduler = cluster.scheduler
    ref = weakref.ref(cluster)
    try:
        del cluster
        gc.collect()
        wait_until(lambda: scheduler.loop.stopped.is_set(), timeout=2,
                   what="the scheduler of a dropped cluster to stop")
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=2).close()
    finally:
        alive = ref()
        if alive is not None:
            alive.close()
        scheduler.close()


def _blas_env():
    return {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                            "MKL_NUM_THREADS")}


def test_worker_processes_run_numerical_libraries_single_threaded(monkeypatch):
    # each worker thread runs a task: one BLAS thread per task, as dask's nanny sets it
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    with _local_cluster(n_workers=1) as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert client.submit(_blas_env, pure=False).result(timeout=30) == {
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # what the user's environment says wins
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with _local_cluster(n_workers=1) as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert client.submit(_blas_env, pure=False).result(timeout=30)["OMP_NUM_THREADS"] == "3"


RANK_VARIABLES = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
                  "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_RANK": "1", "PMI_SIZE": "2",
                  "PMI_RANK": "1", "MPI_LOCALNRANKS": "2"}


def _launcher_env() -> dict[str, str | None]:
    return {v: os.environ.get(v) for v in RANK_VARIABLES}


def test_workers_started_from_an_mpi_rank_are_not_ranks_themselves(monkeypatch):
    # a LocalCluster made by a rank of `mpirun -n 2` (Open MPI) or `mpiexec -n 2` (MPICH)
    for var, value in RANK_VARIABLES.items():
        monkeypatch.setenv(var, value)
    with _local_cluster(n_workers=1) as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert client.submit(_launcher_env, pure=False).result(timeout=30) == dict.fromkeys(
            RANK_VARIABLES)
        # named as the cluster named it, with no rank suffix (`hpcsched worker` adds one
        # under a launcher)
        names = [w["name"] for w in client.scheduler_info()["workers"].values()]
        assert len(names) == 1 and re.fullmatch(r"local-\d+", names[0]), names


# a worker preload as dask's documentation writes one: ``dask_setup(worker)`` sets state up
PRELOAD = """
SET_UP = []

def dask_setup(worker):
    SET_UP.append(worker.name)
"""


def preloaded_value(module):
    import sys

    return sys.modules[module].SET_UP  # loaded at the worker's start, not by this task


@pytest.mark.timeout(60)
@pytest.mark.parametrize("processes", [True, False])
def test_preload_sets_up_each_worker_before_its_tasks(tmp_path, processes):
    module = f"lc_preload_{'procs' if processes else 'threads'}"
    path = tmp_path / f"{module}.py"
    path.write_text(PRELOAD)
    try:
        with _local_cluster(n_workers=2, processes=processes, preload=str(path)) as cluster, \
                Client(cluster, set_as_default=False) as client:
            got = sorted(client.run(preloaded_value, module).values())
            # each process its own module; threads share the test process's
            assert got == ([["local-0"], ["local-1"]] if processes else
                           [["local-0", "local-1"]] * 2)
            assert client.submit(preloaded_value, module, pure=False).result(timeout=30) \
                in got
    finally:
        sys.modules.pop(module, None)
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))


@pytest.mark.timeout(60)
def test_a_failing_preload_is_named_and_its_worker_not_replaced(capfd, caplog):
    with pytest.raises(TimeoutError):
        _local_cluster(n_workers=1, preload="no_such_preload_module", timeout=5)
    err = capfd.readouterr().err
    assert "worker preload 'no_such_preload_module' could not be imported" in err
    assert "its preload failed: not replacing it" in caplog.text
    assert "starting a replacement" not in caplog.text
