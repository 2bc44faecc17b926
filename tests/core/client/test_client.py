"""The Client end to end, on a LocalCluster of real worker processes over TCP.

Most tests share one cluster per module (``shared_client``) and leave it as
they found it; tests that need their own cluster (or none) start it
themselves and close it in ``finally``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import socket
import stat
import threading
import time
from operator import add

import pytest

from hpcsched.core.client.client import (
    CancelledError,
    Client,
    Future,
    as_completed,
    wait,
    write_scheduler_file,
)
from hpcsched.core.graph.dsk import GraphError
from tests.conftest import hpcsched_children, wait_until
from tests.core.client.get_conformance import GetFunctionTestMixin


def inc(x):
    return x + 1


def slowinc(x, delay=0.2):
    time.sleep(delay)
    return x + 1


def add_all(*args, **kwargs):
    return sum(args) + sum(kwargs.values())


def fail_with_value_error(x):
    raise ValueError(f"bad value {x}")


class CustomError(Exception):
    pass


def raise_custom(x):
    raise CustomError(f"custom {x}")


def flaky(path, fail_times):
    """Fails the first ``fail_times`` calls (counted in a file: calls may run on any worker)."""
    with open(path, "a+") as f:
        f.seek(0)
        n = len(f.read())
        f.write("x")
    if n < fail_times:
        raise RuntimeError(f"flaky failure {n + 1}")
    return n


@pytest.fixture
def c(shared_client):
    return shared_client


# ---------------------------------------------------------------- submit / map / gather
def test_submit_result(c):
    f = c.submit(inc, 1)
    assert isinstance(f, Future)
    assert f.result(timeout=30) == 2
    assert f.status == "finished" and f.done()
    assert f.exception() is None


def test_submit_kwargs_and_futures_as_arguments(c):
    x = c.submit(inc, 1)
    y = c.submit(inc, 10)
    z = c.submit(add_all, x, [y, 5][0], extra=x)
    assert z.result(timeout=30) == 2 + 11 + 2
    nested = c.submit(lambda d, lst: d["a"] + sum(lst), {"a": x}, [x, y, 3])
    assert nested.result(timeout=30) == 2 + 2 + 11 + 3


def test_same_key_gives_the_same_task(c):
    a = c.submit(inc, 1, key="fixed-key-1")
    b = c.submit(inc, 100, key="fixed-key-1")
    assert a.key == b.key
    assert b.result(timeout=30) == 2


def test_map_and_gather_structures(c):
    futures = c.map(add, range(10), range(10, 20))
    assert c.gather(futures, timeout=30) == [i + i + 10 for i in range(10)]
    out = c.gather({"a": futures[0], "b": (futures[1], [futures[2]]), "lit": 7}, timeout=30)
    assert out == {"a": 10, "b": (12, [14]), "lit": 7}
    assert c.map(inc, []) == []


def test_map_with_futures_and_chained_maps(c):
    xs = c.map(inc, range(20))
    ys = c.map(inc, xs)
    total = c.submit(sum, ys)
    assert total.result(timeout=30) == sum(range(2, 22))


def test_scatter_list_dict_and_single(c):
    [a, b] = c.scatter([1, 2])
    assert c.submit(add, a, b).result(timeout=30) == 3
    d = c.scatter({"scattered-x": 10})
    assert set(d) == {"scattered-x"}
    assert c.submit(inc, d["scattered-x"]).result(timeout=30) == 11
    big = c.scatter(bytes(1_000_000))
    assert c.submit(len, big).result(timeout=30) == 1_000_000
    assert big.result(timeout=30) == bytes(1_000_000)


def test_scatter_broadcast_puts_data_on_every_worker(c):
    f = c.scatter([41], broadcast=True)[0]
    assert c.submit(inc, f).result(timeout=30) == 42
    info = c.scheduler_info()
    assert all(w["n_keys"] >= 1 for w in info["workers"].values())


def test_cancel_a_waiting_task(c):
    x = c.submit(slowinc, 1, 0.5)
    y = c.submit(inc, x)
    y.cancel()
    assert y.cancelled() and y.status == "cancelled"
    with pytest.raises(CancelledError):
        y.result(timeout=30)
    with pytest.raises(CancelledError):
        c.gather([y], timeout=30)
    assert c.gather([y], errors="skip", timeout=30) == []
    assert x.result(timeout=30) == 2  # what it depended on is unaffected


def test_cancel_then_other_work_runs(c):
    futures = c.map(slowinc, range(6), delay=0.1)
    c.cancel(futures[3:])
    assert c.gather(futures[:3], timeout=30) == [1, 2, 3]
    assert all(f.cancelled() for f in futures[3:])


# ---------------------------------------------------------------- graphs
class TestClientGet(GetFunctionTestMixin):
    """The conformance tests every ``get`` passes, run by the distributed Client."""

    seq = list  # as distributed's Client.get

    @pytest.fixture(autouse=True)
    def _use_client(self, shared_client):
        self.client = shared_client

    def get(self, dsk, keys):
        return self.client.get(dsk, keys, timeout=60)


def test_get_nested_keys_literals_and_nested_tasks(c):
    dsk = {
        "a": 1,
        ("b", 0): (inc, "a"),
        ("b", 1): (add, "a", ("b", 0)),
        "c": (add_all, [("b", 0), ("b", 1)][0], (inc, (inc, "a"))),
        "d": {"k": [("b", 1), "literal"]},
    }
    assert c.get(dsk, [["a", ("b", 0)], ("b", 1), "c"]) == [[1, 2], 3, 2 + 3]
    assert c.get(dsk, "d") == {"k": [3, "literal"]}


def test_get_with_futures_in_the_graph(c):
    x = c.submit(inc, 1)
    assert c.get({"y": (add, x, 10)}, "y") == 12
    # nested in containers and in a task's arguments, next to keys of the graph
    # (keys of its own: an earlier test's erred "a" may still be held by pytest's traceback)
    assert c.get({"fa": 5, "fz": (sum, [x, "fa", (inc, x)])}, "fz") == 2 + 5 + 3


def test_a_future_of_another_client_in_a_graph_is_refused(c, shared_cluster):
    from hpcsched.core.client.client import Client

    with Client(shared_cluster, set_as_default=False) as other:
        x = other.submit(inc, 1)
        with pytest.raises(ValueError, match="another client"):
            c.get({"y": (add, x, 10)}, "y")


def test_compute_returns_futures_in_the_same_nesting(c):
    dsk = {"x": 1, "y": (inc, "x"), "z": (inc, "y")}
    futures = c.compute(dsk, [["y"], "z"])
    assert isinstance(futures[0][0], Future)
    assert c.gather(futures, timeout=30) == [[2], 3]


def test_bad_graphs_are_refused_at_submission_naming_the_keys(c):
    with pytest.raises(GraphError, match="cycle") as e:
        c.get({"ka": (inc, "kb"), "kb": (inc, "ka")}, "ka")
    assert "'ka'" in str(e.value) and "'kb'" in str(e.value)
    with pytest.raises(GraphError, match="'self-x' depends on itself"):
        c.get({"self-x": (inc, "self-x")}, "self-x")
    with pytest.raises(KeyError, match="no-such-key"):
        c.get({"x": 1}, ["x", "no-such-key"])
    with pytest.raises(KeyError, match="missing-too"):
        c.compute({"x": 1}, [["missing-too"]])


def test_tree_reduction_of_8192_leaves_as_one_graph(c):
    n = 8192
    dsk = {("leaf", i): i for i in range(n)}
    level, width = "leaf", n
    depth = 0
    while width > 1:
        depth += 1
        name = f"level{depth}"
        for i in range(width // 2):
            dsk[(name, i)] = (add, (level, 2 * i), (level, 2 * i + 1))
        level, width = name, width // 2
    assert len(dsk) == 2 * n - 1
    assert c.get(dsk, (level, 0), timeout=120) == n * (n - 1) // 2


def test_ten_thousand_submits(c):
    futures = [c.submit(inc, i) for i in range(10_000)]
    assert c.gather(futures, timeout=120) == list(range(1, 10_001))


# ---------------------------------------------------------------- waiting on futures
def test_wait_and_as_completed(c):
    futures = c.map(slowinc, [3, 1, 2], delay=0.05)
    done, not_done = wait(futures, timeout=30)
    assert done == set(futures) and not not_done
    fs = c.map(inc, range(5))
    seen = [f.result() for f in as_completed(fs)]
    assert sorted(seen) == [1, 2, 3, 4, 5]
    pairs = list(as_completed(c.map(inc, range(3)), with_results=True))
    assert sorted(r for _, r in pairs) == [1, 2, 3]


def test_wait_first_completed_and_timeout(c):
    slow = c.submit(slowinc, 0, 0.5)
    fast = c.submit(inc, 0)
    done, _ = wait([slow, fast], return_when="FIRST_COMPLETED", timeout=30)
    assert fast in done
    with pytest.raises(TimeoutError):
        wait([c.submit(slowinc, 5, 1.0)], timeout=0.05)
    with pytest.raises(TimeoutError):
        c.submit(slowinc, 6, 1.0).result(timeout=0.05)
    slow.result(timeout=30)


def test_add_done_callback(c):
    called = threading.Event()
    got = []

    def cb(fut):
        got.append((fut.key, fut.status))
        called.set()

    f = c.submit(inc, 41)
    f.add_done_callback(cb)
    assert called.wait(30)
    assert got == [(f.key, "finished")]
    # on an already-finished future: called at once
    later = []
    f.add_done_callback(lambda fut: later.append(fut.result()))
    assert later == [42]


@pytest.fixture
def own_client(shared_cluster):
    """A client of its own on the shared cluster (callbacks calling result() once deadlocked
    the client's reader thread: such tests must not wedge the shared client)."""
    cl = Client(shared_cluster, set_as_default=False)
    try:
        yield cl
    finally:
        cl.close(timeout=2)


def test_executor(own_client):
    with own_client.get_executor() as ex:
        fut = ex.submit(pow, 2, 10)
        assert isinstance(fut, cf.Future)
        assert fut.result(timeout=3) == 1024
        assert list(ex.map(inc, range(5), timeout=10)) == [1, 2, 3, 4, 5]
        bad = ex.submit(fail_with_value_error, 3)
        with pytest.raises(ValueError, match="bad value 3"):
            bad.result(timeout=10)
        done, _ = cf.wait([ex.submit(inc, i) for i in range(3)], timeout=10)
        assert sorted(f.result() for f in done) == [1, 2, 3]
    with pytest.raises(RuntimeError):
        ex.submit(inc, 1)


def test_done_callback_may_ask_for_the_result(own_client):
    got = []
    called = threading.Event()

    def cb(fut):
        got.append(fut.result(timeout=5))
        called.set()

    f = own_client.submit(slowinc, 1, 0.2)
    f.add_done_callback(cb)
    if not called.wait(3):
        raise TimeoutError("callback did not finish")
    assert got == [2]


# ---------------------------------------------------------------- errors
def test_exception_keeps_type_and_remote_traceback(c):
    f = c.submit(raise_custom, 7)
    with pytest.raises(CustomError, match="custom 7") as e:
        f.result(timeout=30)
    assert "raise_custom" in str(e.value.__cause__)
    assert f.status == "error"
    exc = f.exception(timeout=30)
    assert isinstance(exc, CustomError)
    assert "raise_custom" in f.traceback()


def test_dependents_of_a_failed_task_err_and_other_work_continues(c):
    bad = c.submit(fail_with_value_error, 1)
    dep = c.submit(inc, bad)
    dep2 = c.submit(inc, dep)
    good = c.map(slowinc, range(4), delay=0.01)
    with pytest.raises(ValueError, match="bad value 1") as e:
        dep2.result(timeout=30)
    assert "fail_with_value_error" in str(e.value.__cause__)
    assert dep.status == "error"
    assert c.gather(good, timeout=30) == [1, 2, 3, 4]
    assert c.gather([bad, good[0]], errors="skip", timeout=30) == [1]


def test_retries_rerun_a_failing_task(c, tmp_path):
    counter = str(tmp_path / "calls")
    f = c.submit(flaky, counter, 2, retries=2)
    assert f.result(timeout=30) == 2
    counter2 = str(tmp_path / "calls2")
    g = c.submit(flaky, counter2, 2, retries=1)
    with pytest.raises(RuntimeError, match="flaky failure 2"):
        g.result(timeout=30)
    assert os.path.getsize(counter2) == 2
    h = c.get({"x": (flaky, str(tmp_path / "calls3"), 1)}, "x", retries=1)
    assert h == 1


def test_unpicklable_argument_raises_at_submit_naming_the_type(c):
    lock = threading.Lock()
    with pytest.raises(TypeError, match="lock"):
        c.submit(lambda d: d, {"inner": [lock]})
    with pytest.raises(TypeError, match="lock"):
        c.map(lambda d: d, [lock])
    assert c.submit(inc, 1).result(timeout=30) == 2  # the client still works


def test_submit_rejects_a_non_callable(c):
    with pytest.raises(TypeError, match="callable"):
        c.submit(42)


# ---------------------------------------------------------------- cluster information
def test_scheduler_info_lists_each_worker_with_its_host(c, shared_cluster):
    info = c.scheduler_info()
    workers = info["workers"]
    assert len(workers) == 2
    pids = {p.pid for p in shared_cluster.worker_processes.values()}
    for addr, w in workers.items():
        assert addr.startswith("tcp://")
        assert w["host"] == socket.gethostname()
        assert w["nthreads"] == 1
        assert w["pid"] in pids
    assert info["address"] == shared_cluster.scheduler_address


def test_wait_for_workers(c):
    c.wait_for_workers(2, timeout=10)
    with pytest.raises(TimeoutError, match="3"):
        c.wait_for_workers(3, timeout=0.3)


def test_client_from_a_scheduler_file(shared_cluster, tmp_path):
    path = str(tmp_path / "scheduler.json")
    write_scheduler_file(path, shared_cluster.scheduler_address, shared_cluster.security)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        assert json.load(f)["address"] == shared_cluster.scheduler_address
    with Client(path, set_as_default=False) as other:
        assert other.submit(inc, 1).result(timeout=30) == 2


def test_client_from_an_address_and_the_secret_in_the_environment(shared_cluster, monkeypatch):
    monkeypatch.setenv("HPCSCHED_SECRET", shared_cluster.security.secret_hex())
    with Client(shared_cluster.scheduler_address, set_as_default=False) as other:
        assert other.submit(inc, 2).result(timeout=30) == 3


def test_two_clients_share_results_by_key(shared_client, shared_cluster):
    a = shared_client.submit(inc, 1, key="shared-by-key")
    assert a.result(timeout=30) == 2
    with Client(shared_cluster, set_as_default=False) as other:
        b = other.submit(inc, 1, key="shared-by-key")
        assert b.result(timeout=30) == 2


def test_client_without_arguments_starts_and_closes_its_own_cluster(monkeypatch):
    for var in ("HPCSCHED_SCHEDULER_ADDRESS", "HPCSCHED_SCHEDULER_FILE"):
        monkeypatch.delenv(var, raising=False)
    from tests.conftest import worker_env

    monkeypatch.setenv("PYTHONPATH", worker_env()["PYTHONPATH"])
    before = set(hpcsched_children())
    client = Client(n_workers=1, threads_per_worker=1)
    try:
        assert client.cluster is not None
        assert client.submit(inc, 1).result(timeout=30) == 2
        started = set(hpcsched_children()) - before
        assert len(started) == 1
    finally:
        client.close()
    assert client.status == "closed"
    wait_until(lambda: not (set(hpcsched_children()) - before), timeout=10,
               what="the client's own workers to exit")


def test_client_context_manager_and_closed_client_refuses_work(shared_cluster):
    with Client(shared_cluster, set_as_default=False) as other:
        assert other.submit(inc, 1).result(timeout=30) == 2
    assert other.status == "closed"
    with pytest.raises(RuntimeError, match="closed"):
        other.submit(inc, 1)


def test_connecting_to_nothing_fails_fast():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t0 = time.monotonic()
    with pytest.raises((OSError, TimeoutError)):
        Client(f"tcp://127.0.0.1:{port}", timeout=1, set_as_default=False)
    assert time.monotonic() - t0 < 10


# ---------------------------------------------------------------- memory is given back
def _held_keys(cluster, keys) -> list:
    return cluster.scheduler.call(lambda s: [k for k in keys if k in s.state.tasks])


def _worker_keys(client) -> int:
    return sum(w["n_keys"] for w in client.scheduler_info()["workers"].values())


def test_released_futures_free_scheduler_and_worker_memory(own_client, shared_cluster):
    client = own_client
    held = _worker_keys(client)
    xs = client.map(inc, range(200))
    total = client.submit(sum, xs)
    data = client.scatter(list(range(10)))
    assert total.result(timeout=30) == sum(range(1, 201))
    dsk = {("a", i): (inc, i) for i in range(50)} | {"s": (sum, [("a", i) for i in range(50)])}
    assert client.get(dsk, "s") == sum(range(1, 51))
    keys = [f.key for f in [*xs, total, *data]] + list(dsk)
    del xs, total, data
    wait_until(lambda: not _held_keys(shared_cluster, keys), timeout=20,
               what="the scheduler to forget released keys")
    wait_until(lambda: _worker_keys(client) <= held, timeout=20,
               what="workers to free released keys")


def test_a_future_with_a_done_callback_is_released_when_dropped(own_client, shared_cluster):
    f = own_client.submit(inc, 1000)
    called = threading.Event()
    f.add_done_callback(lambda fut: called.set())
    assert called.wait(30)
    key = f.key
    del f
    wait_until(lambda: not _held_keys(shared_cluster, [key]), timeout=5,
               what="the scheduler to forget the dropped future's key")


def test_large_arrays_move_between_workers(c):
    np = pytest.importorskip("numpy")
    workers = sorted(c.scheduler_info()["workers"])
    a = c.submit(np.arange, 5_000_000, workers=[workers[0]])  # 40 MB
    b = c.submit(np.ones, 5_000_000, workers=[workers[1]])
    s = c.submit(lambda x, y: float((x + y).sum()), a, b, workers=[workers[1]])
    assert s.result(timeout=60) == float(np.arange(5_000_000).sum() + 5_000_000)
    back = a.result(timeout=60)
    assert back.shape == (5_000_000,) and back[-1] == 4_999_999


def test_releases_of_many_futures_reach_the_scheduler_as_few_messages():
    from hpcsched.core.client.connection import coalesce
    from hpcsched.core.protocol.messages import ClientReleasesKeys, RetryKeys, encode

    rel = [ClientReleasesKeys("c", [k]) for k in "abc"]
    other = RetryKeys("c", ["x"])
    out = coalesce([*rel, other, *rel[:2]])  # the queued records, encoded as sent
    assert out == [{"op": "client-releases-keys", "keys": ["a", "b", "c"]}, encode(other),
                   {"op": "client-releases-keys", "keys": ["a", "b"]}]  # order kept
    assert rel[0].keys == ["a"]  # inputs untouched



def test_a_large_map_is_sent_first_batch_ahead():
    from hpcsched.core.client.graphs import FIRST_MAP_BATCH, MAX_MAP_BATCH, map_batches

    assert map_batches(0, None) == []
    assert map_batches(10, None) == [(0, 10)]
    assert map_batches(2 * FIRST_MAP_BATCH, None) == [(0, 2 * FIRST_MAP_BATCH)]
    n = FIRST_MAP_BATCH + 2 * MAX_MAP_BATCH
    assert map_batches(n, None) == [(0, FIRST_MAP_BATCH),
                                     (FIRST_MAP_BATCH, FIRST_MAP_BATCH + MAX_MAP_BATCH),
                                     (FIRST_MAP_BATCH + MAX_MAP_BATCH, n)]
    assert map_batches(7, 3) == [(0, 3), (3, 6), (6, 7)]


def test_map_in_batches_gives_every_result_in_order(c):
    assert c.gather(c.map(inc, range(10), batch_size=3, pure=False)) == list(range(1, 11))
    n = 2500  # over two batches without batch_size
    assert c.gather(c.map(inc, range(n), pure=False)) == list(range(1, n + 1))
    with pytest.raises(ValueError, match="batch_size"):
        c.map(inc, range(3), batch_size=0)


_STARTED = threading.Event()
_RELEASE = threading.Event()


def wait_for_release():
    """A task (on a worker in this process) that runs until the test lets it go."""
    _STARTED.set()
    _RELEASE.wait(30)
    return 1


def test_a_client_in_its_schedulers_process_is_handed_messages_directly():
    """A client of a scheduler in its own process starts no reader thread: the scheduler's
    thread hands it each batch (results arrive, replies reach their requests); when the
    scheduler goes away, what the client still waits for errs instead of hanging."""
    from hpcsched import Client, LocalCluster

    _STARTED.clear()
    _RELEASE.clear()
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False)
    client = Client(cluster)
    try:
        assert not [t for t in threading.enumerate() if t.name.endswith("-reader")]
        assert client.submit(inc, client.submit(inc, 1)).result(timeout=30) == 3
        assert len(client.nthreads()) == 1  # a request and its reply
        pending = client.submit(wait_for_release, pure=False)
        assert _STARTED.wait(30)
        cluster.close()
        with pytest.raises(Exception, match="scheduler"):
            pending.result(timeout=30)
    finally:
        _RELEASE.set()
        client.close()
        cluster.close()
