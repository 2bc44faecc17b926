"""dask collections whose first layer is thousands of short root tasks, on real workers.

Queued root-ish tasks known to take microseconds go to a worker many at a time
(:func:`hpcsched.core.state.policies.queue_slots`: milliseconds of them, not one per
slot and round trip). Each test checks that this happened (a worker held more than its
slots at once, seen by a scheduler plugin) and that what dask users rely on holds: plain
``.compute()`` gives dask's synchronous scheduler's values, a root task that fails errs
only the tasks that need it, and a worker killed while it holds a run of root tasks
loses only those it had not finished (or held the only result of).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from hpcsched import Client
from hpcsched.core.client.client import as_completed
from hpcsched.core.client.futures import futures_of
from hpcsched.core.client.plugins import SchedulerPlugin
from tests.conftest import _local_cluster

# a hang detector: on a shared, loaded machine the cluster runs some 50 of these tasks a
# second, and the bag's 8,000 tasks and the cluster's start take minutes
pytestmark = pytest.mark.timeout(600)

SLOTS = 2  # ceil(1.1 x 1 thread): what a worker holds of queued tasks as in dask


class MostHeld(SchedulerPlugin):
    """The most tasks one worker held (processing) at once, seen at every transition."""

    def __init__(self) -> None:
        self.most = 0
        self.scheduler: Any = None

    def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "processing":
            for ws in self.scheduler.state.workers.values():
                self.most = max(self.most, len(ws.processing))


def most_held(client: Client, name: str) -> int:
    def read(dask_scheduler: Any) -> int:
        return dask_scheduler.control.scheduler_plugins[name].most

    return client.run_on_scheduler(read)


def watch(client: Client, name: str) -> None:
    client.register_plugin(MostHeld(), name=name)


@pytest.fixture(scope="module")
def cluster():
    c = _local_cluster(n_workers=2, threads_per_worker=1)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def client(cluster):
    """dask's default scheduler while it lives, as users make it."""
    with Client(cluster) as c:
        yield c


def inc(x):
    return x + 1


def fails_on(x, bad):
    if x == bad:
        raise ValueError(f"root {x} is bad")
    return x


def sync(x):
    return dask.compute(x, scheduler="sync")[0]


@pytest.mark.parametrize("make, in_runs", [
    pytest.param(lambda: db.from_sequence(range(20_000), npartitions=4_000).map(inc).sum(),
                 True, id="bag"),
    pytest.param(lambda: da.from_array(np.arange(40_000.0), chunks=10).sum(), True,
                 id="array"),
    # a partition's task takes a few milliseconds (pandas): on a loaded machine too
    # long for runs, so only its values are checked
    pytest.param(lambda: dd.from_pandas(
        pd.DataFrame({"x": np.arange(20_000), "y": np.arange(20_000) * 2.0}),
        npartitions=2_000).x.sum(), False, id="dataframe"),
])
def test_collections_of_many_short_roots_compute_right(client, make, in_runs):
    name = f"most-held-{time.monotonic_ns()}"
    watch(client, name)
    assert make().compute() == sync(make())
    if in_runs:
        assert most_held(client, name) > SLOTS


def test_thousands_of_delayed_calls(client):
    name = f"most-held-{time.monotonic_ns()}"
    watch(client, name)
    calls = [dask.delayed(inc)(i) for i in range(3_000)]
    assert list(dask.compute(*calls)) == [i + 1 for i in range(3_000)]
    assert most_held(client, name) > SLOTS


def test_a_failing_root_errs_only_the_tasks_that_need_it(client):
    """3,000 roots, each with a dependent, and sums of ten dependents: root 1234 raises.
    Its dependent and the sum over it err with its exception; every other task gives its
    value."""
    name = f"most-held-{time.monotonic_ns()}"
    watch(client, name)
    n, bad = 3_000, 1234
    roots = [dask.delayed(fails_on)(i, bad) for i in range(n)]
    deps = [dask.delayed(inc)(r) for r in roots]
    sums = [dask.delayed(sum)(deps[i:i + 10]) for i in range(0, n, 10)]
    futures = client.compute(deps + sums)
    fdeps, fsums = futures[:n], futures[n:]
    for i, f in enumerate(fdeps):
        if i == bad:
            with pytest.raises(ValueError, match=f"root {bad} is bad"):
                f.result(timeout=60)
        else:
            assert f.result(timeout=60) == i + 1
    for j, f in enumerate(fsums):
        if j == bad // 10:
            assert isinstance(f.exception(timeout=60), ValueError)
        else:
            assert f.result(timeout=60) == sum(range(10 * j + 1, 10 * j + 11))
    assert most_held(client, name) > SLOTS


CALLS: dict[int, int] = {}  # in a worker process: root -> how often it ran there


def tagged(x):
    """Counts its calls in the worker's :data:`CALLS`; returns (x, the worker's pid). A
    tenth of a millisecond of work: a worker holds runs of tens of them."""
    CALLS[x] = CALLS.get(x, 0) + 1
    deadline = time.perf_counter() + 0.0001
    while time.perf_counter() < deadline:
        pass
    return x, os.getpid()


def calls_here() -> tuple[int, dict[int, int]]:
    return os.getpid(), dict(CALLS)


def test_a_worker_killed_mid_run_loses_only_its_unfinished_roots():
    """Two workers run the 10,000 short root tasks of a persisted bag, many at a time
    each; one is SIGKILLed midway. Every partition gets its right value, none from the
    victim's process, and no task ran twice on a live worker: what the survivor had
    finished was not run again, and what the victim held (unfinished, or finished with
    the only copy of its result) ran once elsewhere."""
    n = 10_000
    cluster = _local_cluster(n_workers=2, threads_per_worker=1)
    try:
        with Client(cluster, set_as_default=False) as client:
            # imports on the workers first: a group's first task that imports dask.bag
            # takes milliseconds, which its mean duration remembers for a while
            warm = db.from_sequence(range(-100, 0), npartitions=100).map(tagged)
            assert len(client.compute(warm).result(timeout=60)) == 100
            name = "most-held-kill"
            watch(client, name)
            bag = client.persist(db.from_sequence(range(n), npartitions=n).map(tagged))
            fs = futures_of(bag)
            assert len(fs) == n
            done: dict[int, int] = {}
            for f in as_completed(fs):
                ((x, pid),) = f.result()
                assert x == f.key[1]
                done[x] = pid
                if len(done) >= 1_000 and len(set(done.values())) == 2:
                    break
            assert most_held(client, name) > SLOTS  # each worker held a run
            victim_pid = max(set(done.values()))
            (victim,) = [p for p in cluster.worker_processes.values() if p.pid == victim_pid]
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            results = client.gather(fs, timeout=120)
            assert [x for ((x, _),) in results] == list(range(n))
            assert all(pid != victim_pid for ((_, pid),) in results)
            counts: dict[int, int] = {}
            for pid, here in client.run(calls_here).values():
                assert pid != victim_pid
                for x, k in here.items():
                    if x >= 0:  # not the warm-up's
                        counts[x] = counts.get(x, 0) + k
            assert set(counts.values()) == {1}  # no task ran twice on a live worker
            # the live workers ran every task: each result the victim held was its only
            # copy (nothing asked for another), so it was computed again
            assert set(counts) == set(range(n))
    finally:
        cluster.close()
