"""A result that cannot be serialized errs its future: nothing waits for it forever.

Results stay unpickled on their worker until they leave it: to the client
(gathered through the scheduler) or to a peer (a dependency). Each path is
tested end to end over TCP (worker processes) and ``inproc://`` (worker
threads of this process) with a class whose ``__reduce__`` raises and an
object holding a lock; ``result(timeout=...)`` must raise that very exception,
with the worker's traceback, well before the timeout. Then the state-machine
side: the scheduler errs the task (and its dependents) instead of recomputing
it, and a worker told by a peer that a dependency cannot be sent does not
report it missing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from hpcsched import Client, LocalCluster
from hpcsched.core.state import events as ev
from tests.conftest import worker_env
from tests.core.state.harness import (
    P1,
    A,
    B,
    compute,
    executes,
    finish,
    graph,
    new_worker,
    one,
    sent,
    step,
    submit,
    to_scheduler,
    with_workers,
)

pytestmark = pytest.mark.timeout(120)

WAIT = 30  # result()'s timeout: a hang shows as TimeoutError, not as a stuck test


class RefusesPickling:
    def __reduce__(self):
        raise ValueError("RefusesPickling will not be pickled")


class HoldsALock:
    def __init__(self):
        self.lock = threading.Lock()
        self.callback = lambda: self.lock


def refuses():
    return RefusesPickling()


def holds_a_lock():
    return HoldsALock()


def kind_of(x):
    return type(x).__name__


@pytest.fixture(scope="module", params=["tcp", "inproc"])
def two_workers(request: pytest.FixtureRequest) -> Iterator[tuple[Client, list[str], str]]:
    cluster = LocalCluster(n_workers=2, threads_per_worker=1,
                           processes=request.param == "tcp", timeout=60,
                           worker_env=worker_env())
    try:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            yield client, sorted(client.scheduler_info()["workers"]), request.param
    finally:
        cluster.close()


@pytest.mark.parametrize("make, exc, match", [
    (refuses, ValueError, "RefusesPickling will not be pickled"),
    (holds_a_lock, TypeError, "lock"),
])
def test_unserializable_result_errs_the_future_on_gather(two_workers, make, exc, match):
    client, _, _ = two_workers
    fut = client.submit(make, pure=False)
    start = time.monotonic()
    with pytest.raises(exc, match=match) as info:
        fut.result(timeout=WAIT)
    assert time.monotonic() - start < WAIT / 2
    assert fut.status == "error"
    # the worker's traceback travels with it, and a note says which result failed
    assert "__reduce__" in str(info.value.__cause__) or "pickle" in str(info.value.__cause__)
    assert any(fut.key in note for note in getattr(info.value, "__notes__", ()))
    # asked again: the same error at once, not a recomputation
    with pytest.raises(exc, match=match):
        fut.result(timeout=WAIT)
    assert client.submit(kind_of, 1).result(timeout=WAIT) == "int"  # the cluster is fine


def test_unserializable_dependency_errs_a_dependent_on_another_worker(two_workers):
    client, (w1, w2), transport = two_workers
    x = client.submit(refuses, workers=[w1], pure=False)
    here = client.submit(kind_of, x, workers=[w1])  # same worker: never serialized
    assert here.result(timeout=WAIT) == "RefusesPickling"
    there = client.submit(kind_of, x, workers=[w2], pure=False)  # must travel from w1 to w2
    if transport == "inproc":  # between threads of one process: handed over, not pickled
        assert there.result(timeout=WAIT) == "RefusesPickling"
    else:
        with pytest.raises(ValueError, match="will not be pickled"):
            there.result(timeout=WAIT)
    with pytest.raises(ValueError, match="will not be pickled"):
        x.result(timeout=WAIT)


def test_gather_of_good_and_bad_results_raises_for_the_bad_one(two_workers):
    client, (w1, _), _ = two_workers
    good = client.submit(kind_of, 2, workers=[w1], pure=False)
    bad = client.submit(refuses, workers=[w1], pure=False)
    with pytest.raises(ValueError, match="will not be pickled"):
        client.gather([good, bad], timeout=WAIT)
    assert client.gather([good, bad], errors="skip", timeout=WAIT) == ["int"]


# ---------------------------------------------------------------- state machines
def test_scheduler_errs_a_result_that_cannot_leave_its_worker_and_its_dependents():
    s = with_workers(A, B)
    submit(s, graph(x=[], y=["x"]), keys=["x", "y"], workers=[A])
    finish(s, A, "x")
    out = step(s, ev.ResultErred(A, "x", "exc-blob", "Traceback...", "ValueError: no"))
    err = one(out, "task-erred", to="c", key="x")
    assert err.wire()["exception"] == "exc-blob" and err.wire()["traceback"] == "Traceback..."
    assert one(out, "task-erred", to="c", key="y").wire()["exception_text"] == "ValueError: no"
    assert one(out, "free-keys", to=A, keys=["x"])  # the holder drops it
    assert s.tasks["x"].state == "erred" and s.tasks["y"].state == "erred"
    assert not sent(out, "compute-task")  # never recomputed: it would fail the same way
    # a late duplicate report changes nothing
    assert step(s, ev.ResultErred(A, "x", "exc-blob", "", "")) == []


def test_worker_reports_a_result_it_cannot_serve():
    s = new_worker()
    step(s, compute("x"))
    step(s, ev.ExecuteSuccess("x", object(), 8, "object", 1.0, 2.0))
    out = step(s, ev.ServeFailed("x", "exc-blob", "tb", "ValueError: no"))
    msg = to_scheduler(out, "result-erred", key="x")[0].wire()
    assert msg["exception"] == "exc-blob" and msg["traceback"] == "tb"
    assert "x" in s.data  # kept until the scheduler frees it: other requests fail alike


def test_dependency_a_peer_cannot_serialize_is_not_reported_missing():
    s = new_worker()
    step(s, compute("y", {"x": [P1]}))
    out = step(s, ev.GatherDepSuccess(P1, {}, [], {"x": "ValueError: no"}))
    assert not to_scheduler(out, "missing-data")  # missing would recompute x, in vain
    assert executes(out) == [] and s.tasks["y"].state == "waiting"
    step(s, ev.FreeKeys(["y"]))  # the scheduler errs y: its free-keys clears both
    assert s.tasks == {}
