"""Code written for dask and dask.distributed runs unchanged on hpcsched.

The idioms are those of dask.distributed's "Futures" and "Dask collections"
documentation: futures passed inline and inside containers, plain
``.compute()`` of collections once a Client exists, ``client.compute`` /
``persist``, ``dask.annotate``, pure keys, scheduler files, fire-and-forget.
Expected values of collections come from dask's synchronous scheduler.

Both a process cluster (TCP) and a threads cluster (inproc) are used; dask's
own conformance mixin for get functions runs against both and against
``hpcsched.get``.
"""

from __future__ import annotations

import json
import os
import threading
from operator import add

import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask import delayed
from dask.utils_test import GetFunctionTestMixin

import hpcsched
from hpcsched import Client, LocalCluster
from hpcsched.core.client.collections import DaskScheduler
from hpcsched.core.client.futures import Future, fire_and_forget, futures_of
from tests.conftest import wait_until, worker_env


def dask_scheduler_client():
    """The client whose scheduler dask uses now, if it is an hpcsched client's."""
    scheduler = dask.config.get("scheduler", None)
    return scheduler.client if isinstance(scheduler, DaskScheduler) else None


pytestmark = pytest.mark.timeout(120)


def inc(x):
    return x + 1


def plus(x, y):
    return x + y


def double(x):
    return 2 * x


def sync(x):
    """What dask's own synchronous scheduler computes: the expected value."""
    return dask.compute(x, scheduler="sync")[0]


@pytest.fixture(scope="module", params=["tcp", "inproc"])
def cluster(request):
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=request.param == "tcp",
                      timeout=60, worker_env=worker_env()) as c:
        yield c


@pytest.fixture
def client(cluster):
    """A client made as users make it: the default, dask's scheduler while it lives."""
    with Client(cluster) as c:
        yield c


# ---------------------------------------------------------------- futures, inline
def test_futures_passed_inline_become_dependencies(client):
    # every one of these failed with "which the scheduler does not hold" when a temporary
    # future was released before the task that needed it reached the scheduler
    assert client.submit(inc, client.submit(inc, 1)).result(timeout=30) == 3
    assert client.submit(sum, client.map(inc, range(3))).result(timeout=30) == 6
    assert client.submit(lambda d: d["a"] + d["b"][0],
                         {"a": client.submit(inc, 1), "b": [client.submit(inc, 2)]}
                         ).result(timeout=30) == 5
    assert client.submit(add, client.scatter(1), client.scatter(2)).result(timeout=30) == 3
    assert client.gather(client.map(add, client.map(inc, range(4)), [10] * 4)) == \
        [11, 12, 13, 14]
    assert client.submit(len, {client.submit(inc, 5), 3}).result(timeout=30) == 2
    chained = client.submit(inc, client.submit(inc, client.submit(inc, 0)))
    assert chained.result(timeout=30) == 3


def test_documentation_futures_examples(client):
    # dask.distributed "Futures": submit, map, gather, submit on futures
    def square(x):
        return x ** 2

    def neg(x):
        return -x

    a = client.map(square, range(10))
    b = client.map(neg, a)
    total = client.submit(sum, b)
    assert total.result() == -285
    assert client.gather(a) == [x ** 2 for x in range(10)]
    x = client.submit(inc, 10)
    y = client.submit(inc, x)
    assert y.result() == 12


def div(x, y):
    return x / y


def score(x):
    return (x * 7) % 11


def test_futures_documentation_page(client):
    """The examples of dask's "Futures" page, in its order, as written there."""
    a = client.submit(inc, 10)  # calls inc(10) in background thread or process
    b = client.submit(inc, 20)
    assert repr(a).startswith("<Future: status: ") and a.key in repr(a)
    assert a.result() == 11
    assert "type: int" in repr(a)
    c = client.submit(add, a, b)  # calls add on the results of a and b
    futures = client.map(inc, range(1000))
    assert c.result() == 32
    results = client.gather(futures)  # this can be faster
    assert results == list(range(1, 1001))
    df = pd.DataFrame({"x": range(5)})
    future = client.submit(len, df)
    remote_df = client.scatter(df)
    assert remote_df.result().equals(df)
    assert client.submit(len, remote_df).result() == future.result() == 5
    assert len(client.scatter([1, 2, 3])) == 3
    future.cancel()  # deletes data even if other futures point to it
    assert future.cancelled()
    a = client.submit(div, 1, 0)  # 1 / 0 raises a ZeroDivisionError
    with pytest.raises(ZeroDivisionError):
        a.result()
    b = client.submit(inc, a)  # futures depending on an erred one err the same way
    with pytest.raises(ZeroDivisionError):
        b.result()
    assert isinstance(b.exception(), ZeroDivisionError) and "div" in b.traceback()
    futures = client.map(score, range(20))
    hpcsched.wait(futures)
    best = -1
    for future in hpcsched.as_completed(futures):
        y = future.result()
        if y > best:
            best = y
    assert best == 10
    seen = [r for _, r in hpcsched.as_completed(futures, with_results=True)]
    assert sorted(seen) == sorted(score(i) for i in range(20))
    batched = [r for batch in hpcsched.as_completed(futures, with_results=True).batches()
               for _, r in batch]
    assert sorted(batched) == sorted(seen)
    seq = hpcsched.as_completed(client.map(inc, range(3)))
    added = 0
    for future in seq:
        y = future.result()
        if y < 3 and added < 2:
            seq.add(client.submit(inc, y + 100))  # add back into the loop
            added += 1
    assert added == 2


def test_pure_keys_share_identical_work_and_impure_do_not(client):
    a, b = client.submit(inc, 41), client.submit(inc, 41)
    assert a.key == b.key and a.result(timeout=30) == 42
    assert client.submit(inc, 42).key != a.key
    c, d = client.submit(inc, 41, pure=False), client.submit(inc, 41, pure=False)
    assert len({a.key, c.key, d.key}) == 3
    assert [f.key for f in client.map(inc, [1, 2])] == [f.key for f in client.map(inc, [1, 2])]
    assert len({f.key for f in client.map(inc, [1, 1], pure=False)}) == 2


# ---------------------------------------------------------------- collections
def where_am_i(_):
    return os.getpid(), threading.current_thread().name


def test_plain_compute_runs_on_the_cluster(client, cluster):
    x = da.ones((40, 40), chunks=10)
    assert dask_scheduler_client() is client
    assert (x + 1).sum().compute() == sync((x + 1).sum())
    pid, thread = delayed(where_am_i)(1).compute()
    if cluster.processes:
        assert pid != os.getpid()  # in a worker process
    else:
        assert thread != threading.current_thread().name  # in a worker's thread
    assert delayed(where_am_i)(2).compute(scheduler="sync") == \
        (os.getpid(), threading.current_thread().name)


def test_collections_match_the_synchronous_scheduler(client):
    rs = da.random.RandomState(0)
    x = rs.random((300, 200), chunks=(100, 50))
    arr = ((x @ x.T) + x.mean(axis=1)[:, None]).std(axis=0)
    np.testing.assert_allclose(arr.compute(), sync(arr))
    pdf = pd.DataFrame({"k": np.arange(500) % 7, "v": np.arange(500.0),
                        "w": np.arange(500) % 3})
    df = dd.from_pandas(pdf, npartitions=5)
    grouped = df.groupby("k").v.sum()
    pd.testing.assert_series_equal(grouped.compute().sort_index(), sync(grouped).sort_index())
    shuffled = df.set_index("v").w.sum()  # a shuffle: tasks, not one machine's disk
    assert shuffled.compute() == sync(shuffled)
    bag = db.from_sequence(range(100), npartitions=7).map(inc).filter(lambda i: i % 2)
    assert bag.sum().compute() == sync(bag.sum())
    assert sorted(bag.compute()) == sorted(sync(bag))
    d = delayed(add)(delayed(inc)(1), delayed(double)(3))
    assert d.compute() == 8
    assert dask.compute(arr.sum(), grouped.sum(), d) == sync((arr.sum(), grouped.sum(), d))


def test_compute_with_the_client_as_scheduler(client):
    x = da.arange(100, chunks=10)
    assert x.sum().compute(scheduler=client.get) == 4950
    assert x.sum().compute(scheduler=client) == 4950
    assert dask.compute(x.sum(), scheduler=client.get) == (4950,)


def test_client_compute_returns_one_finalized_future_per_collection(client):
    x = da.arange(12, chunks=4)
    f = client.compute(x)
    assert isinstance(f, Future)
    np.testing.assert_array_equal(f.result(timeout=30), np.arange(12))
    fs = client.compute([x.sum(), delayed(inc)(1)])
    assert isinstance(fs, list) and all(isinstance(i, Future) for i in fs)
    assert client.gather(fs) == [66, 2]
    assert client.compute(x.sum(), sync=True) == 66
    df = dd.from_pandas(pd.DataFrame({"a": range(10)}), npartitions=3)
    out = client.compute(df).result(timeout=30)
    assert isinstance(out, pd.DataFrame) and out.a.tolist() == list(range(10))


def test_persist_keeps_results_on_the_cluster(client):
    x = da.arange(40, chunks=10) * 2
    y = client.persist(x)
    futures = futures_of(y)
    assert len(futures) == 4 and all(isinstance(f, Future) for f in futures)
    hpcsched.wait(futures)
    assert y.sum().compute() == sync(x.sum())
    np.testing.assert_array_equal(y.compute(), sync(x))
    a, b = client.persist([x + 1, delayed(inc)(1)])
    assert b.compute() == 2 and a.sum().compute() == sync((x + 1).sum())


def _ran_in_a_task(i):
    from hpcsched.core.client.worker_client import in_task

    return in_task()


def _compute_inside(n):
    """A task that computes a dask collection itself (dask's "Futures" page allows it)."""
    import dask
    import dask.array as da

    total = int(da.arange(n, chunks=max(n // 4, 1)).sum().compute())
    where = dask.compute(*[delayed(_ran_in_a_task)(i) for i in range(3)])
    return total, where


def test_compute_inside_a_task_runs_on_the_cluster_without_deadlock(client):
    # every task waits on a computation of its own: with a slot held per waiting task, the
    # inner tasks could never run
    nthreads = sum(w["nthreads"] for w in client.scheduler_info()["workers"].values())
    sizes = range(10, 10 + 2 * nthreads)
    results = client.gather(client.map(_compute_inside, sizes), timeout=60)
    assert [total for total, _ in results] == [n * (n - 1) // 2 for n in sizes]
    # the inner tasks ran as tasks of the cluster, not in dask's threads inside the worker
    assert all(where == (True, True, True) for _, where in results), results


def test_delayed_functions_accept_futures(client):
    fut = client.submit(inc, 1)
    assert delayed(inc)(fut).compute() == 3
    assert delayed(sum)([fut, client.submit(inc, 10)]).compute() == 13
    assert client.compute(delayed(add)(fut, 5)).result(timeout=30) == 7


def test_task_spec_graphs_are_evaluated(client):
    from dask._task_spec import Alias, DataNode, Task, TaskRef

    dsk = {"ts-a": DataNode("ts-a", 10), "ts-b": Task("ts-b", inc, TaskRef("ts-a")),
           "ts-c": Alias("ts-c", "ts-b"), "ts-d": Task("ts-d", plus, TaskRef("ts-b"), y=5),
           "ts-e": DataNode("ts-e", (inc, 1))}  # data, never run as a task
    assert client.get(dsk, ["ts-b", "ts-c", "ts-d", "ts-e"]) == [11, 11, 16, (inc, 1)]
    assert hpcsched.get(dsk, "ts-d") == 16


def _flaky(path, x):
    """Fails until it has been called three times (the calls are counted in a file)."""
    with open(path, "a") as f:
        f.write("x")
    if len(open(path).read()) < 3:
        raise ValueError("not yet")
    return x


def test_retries_annotation_is_honoured(client, tmp_path):
    path = str(tmp_path / "calls")
    with dask.annotate(retries=2):
        d = delayed(_flaky, pure=False)(path, 7)
    assert d.compute() == 7 and open(path).read() == "xxx"
    path2 = str(tmp_path / "calls2")
    with dask.annotate(retries=1):
        d = delayed(_flaky, pure=False)(path2, 7)
    with pytest.raises(ValueError, match="not yet"):
        d.compute()  # two calls only: one retry


def test_priority_annotation_reaches_the_scheduler(client, cluster):
    def record(name):
        return name

    low = [delayed(record, pure=False)(f"low-{i}") for i in range(3)]
    with dask.annotate(priority=10):
        high = [delayed(record, pure=False)(f"high-{i}") for i in range(3)]
    futures = client.compute(low + high)
    client.gather(futures)
    keys = [f.key for f in futures]
    prio = cluster.scheduler.call(lambda s: {k: s.state.tasks[k].priority for k in keys})
    # (generation, -user priority, static): the annotated tasks rank before the others
    assert all(prio[h][1] == -10 for h in keys[3:]) and all(prio[lo][1] == 0 for lo in keys[:3])
    assert max(prio[h] for h in keys[3:]) < min(prio[lo] for lo in keys[:3])


def _worker_address(_):
    return hpcsched.get_worker().address


def test_resources_and_workers_annotations_restrict_placement(client):
    workers = sorted(client.scheduler_info()["workers"])
    with dask.annotate(workers=workers[0]):
        parts = [delayed(os.getpid)(dask_key_name=f"pid-{i}") for i in range(6)]
    pids = set(dask.compute(*parts))
    assert len(pids) == 1
    with dask.annotate(workers={workers[1]}):  # a set of workers, as dask allows
        others = [delayed(_worker_address)(i, dask_key_name=f"where-set-{i}") for i in range(4)]
    assert set(dask.compute(*others)) == {workers[1]}
    with dask.annotate(resources={"GPU": 1}):
        never = delayed(inc)(1)
    fut = client.compute(never)
    with pytest.raises(TimeoutError):
        fut.result(timeout=1.0)  # no worker has a GPU: it must wait, not run
    fut.cancel()


def test_bad_annotation_is_refused_in_the_caller(client):
    with dask.annotate(retries=-1):  # a number, as dask checks, but not a count
        d = delayed(inc)(1)
    with pytest.raises(ValueError, match="retries=-1"):
        d.compute()


# ---------------------------------------------------------------- futures API
def test_future_release_retry_and_client_retry(client, tmp_path):
    marker = tmp_path / "ok"

    def needs_marker():
        if not marker.exists():
            raise RuntimeError("no marker yet")
        return "done"

    f = client.submit(needs_marker, pure=False)
    with pytest.raises(RuntimeError, match="no marker"):
        f.result(timeout=30)
    marker.write_text("")
    f.retry()
    assert f.result(timeout=30) == "done"
    g = client.submit(needs_marker, pure=False)
    assert g.result(timeout=30) == "done"
    marker.unlink()
    h = client.submit(needs_marker, pure=False)
    dependent = client.submit(str.upper, h)
    with pytest.raises(RuntimeError):
        dependent.result(timeout=30)
    marker.write_text("")
    client.retry([dependent])  # reruns the erred dependency too
    assert dependent.result(timeout=30) == "DONE"
    key = dependent.key
    dependent.release()
    assert key not in client.futures


def test_fire_and_forget_runs_without_a_held_future(client, tmp_path):
    out = tmp_path / "fired"
    fire_and_forget(client.submit(out.write_text, "yes", pure=False))
    wait_until(lambda: out.exists() and out.read_text() == "yes", timeout=30,
               what="the fire-and-forget task to run")


def test_default_client_and_dask_scheduler_restored_on_close(cluster):
    before = dask.config.get("scheduler", None)
    with Client(cluster) as c1:
        assert hpcsched.default_client() is c1
        assert dask_scheduler_client() is c1
        with Client(cluster) as c2:
            assert dask_scheduler_client() is c2
        with Client(cluster, set_as_default=False):
            assert dask_scheduler_client() is c1
    assert dask.config.get("scheduler", None) is before


# ---------------------------------------------------------------- scheduler files
def test_client_from_a_scheduler_file(cluster, tmp_path):
    from hpcsched.core.comm.scheduler_file import write_scheduler_file

    if not cluster.processes:
        pytest.skip("an inproc address is only reachable in its own process")
    path = tmp_path / "sched.json"
    write_scheduler_file(str(path), cluster.scheduler_address, cluster.security)
    with Client(scheduler_file=str(path)) as c:
        assert c.scheduler_address == cluster.scheduler_address
        assert c.submit(inc, 1).result(timeout=30) == 2
    with Client(str(path)) as c:
        assert c.submit(inc, 2).result(timeout=30) == 3


def test_a_scheduler_file_that_appears_later_is_waited_for(cluster, tmp_path):
    from hpcsched.core.comm.scheduler_file import write_scheduler_file

    if not cluster.processes:
        pytest.skip("an inproc address is only reachable in its own process")
    path = tmp_path / "late.json"
    timer = threading.Timer(0.5, write_scheduler_file,
                            (str(path), cluster.scheduler_address, cluster.security))
    timer.start()
    try:
        with Client(scheduler_file=str(path), timeout=30) as c:
            assert c.submit(inc, 1).result(timeout=30) == 2
    finally:
        timer.cancel()


def test_a_missing_scheduler_file_is_an_error_naming_it_never_a_new_cluster(tmp_path):
    from tests.conftest import hpcsched_children

    before = hpcsched_children()
    path = tmp_path / "nowhere.json"
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        Client(scheduler_file=str(path), timeout=0.5)
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        Client(str(path), timeout=0.5)
    assert hpcsched_children() == before
    path.write_text(json.dumps({"no": "address"}))
    with pytest.raises(ValueError, match="has no address"):
        Client(str(path), timeout=0.5)


# ---------------------------------------------------------------- dask's conformance suite
def _as_tuples(keys, result):
    """distributed's Client.get returns lists for lists of keys; dask's get functions tuples
    (the values themselves are left as they are)."""
    if isinstance(keys, list):
        return tuple(_as_tuples(k, r) for k, r in zip(keys, result, strict=True))
    return result


class TestClientGetDaskConformance(GetFunctionTestMixin):
    """dask's own tests of a get function, run against ``Client.get``."""

    @pytest.fixture(autouse=True)
    def _client(self, cluster):
        with Client(cluster, set_as_default=False) as c:
            self.client = c
            yield

    def get(self, dsk, keys, **kwargs):
        return _as_tuples(keys, self.client.get(dsk, keys, timeout=60))


class TestLocalGetDaskConformance(GetFunctionTestMixin):
    """dask's own tests of a get function, run against ``hpcsched.get``."""

    get = staticmethod(hpcsched.get)


def test_cluster_settings_given_where_a_scheduler_exists_are_reported(cluster, monkeypatch,
                                                                      caplog):
    # the same script on a laptop (a LocalCluster of that shape) and where a scheduler is
    # given by the environment (a batch job, python -m hpcsched): never a silent surprise
    from tests.conftest import hpcsched_children

    if not cluster.processes:
        pytest.skip("an inproc address is only reachable in its own process")
    monkeypatch.setenv("HPCSCHED_SCHEDULER_ADDRESS", cluster.scheduler_address)
    monkeypatch.setenv("HPCSCHED_SECRET", cluster.security.secret_hex())
    before = hpcsched_children()
    with caplog.at_level("WARNING", logger="hpcsched.client"), \
            Client(n_workers=3, threads_per_worker=1) as c:
        assert c.scheduler_address == cluster.scheduler_address
        assert hpcsched_children() == before  # no cluster of its own
    assert "n_workers=3" in caplog.text and "not used" in caplog.text
