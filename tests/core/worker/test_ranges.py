"""The ranges of bulk maps on a worker (hpcsched.core.worker.ranges): taking back the
elements not started.

A RangeRunner on real task threads (TaskPool), with a stand-in for the worker's loop that
collects the batches of finished elements, and the test in the place of the worker's state
machine, giving the ranges a thread slot when they want one: an element blocks its thread
on an event, the test asks the runner to give elements up meanwhile, then lets it go.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from hpcsched.core.protocol.messages import ComputeRange, ReleaseRange
from hpcsched.core.protocol.serialize import dumps_function, dumps_object
from hpcsched.core.state import events as ev
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.worker.parts.inbox import RangesDone
from hpcsched.core.worker.ranges import RangeRunner
from hpcsched.core.worker.task_pool import TaskPool

GATE = threading.Event()
STARTED = threading.Event()


def gated(x):
    if x == 0:
        STARTED.set()
        assert GATE.wait(30)
    return x


class Loop:
    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()  # batches of finished elements
        self.events: queue.Queue = queue.Queue()  # events for the state machine

    def put(self, item: Any) -> None:
        if type(item) is RangesDone:
            self.q.put(item.batch)
        else:
            self.events.put(item)


class Worker:
    """What RangeRunner reads of a worker."""

    def __init__(self, nthreads: int) -> None:
        self.address = "tcp://w:1"
        self.nthreads = nthreads
        self.loop = Loop()
        self.executor = TaskPool(nthreads, "test-ranges")
        self.state = None
        self.sent: list = []

    def send_to_scheduler(self, record: Any) -> None:
        self.sent.append(record)


def compute_range(prefix: str, indices: list[int]) -> ComputeRange:
    return ComputeRange(prefix, dumps_function(gated), indices,
                        [dumps_object(((i,), {})) for i in indices])


def submit(r: RangeRunner, record: ComputeRange) -> None:
    """Queue ``record`` and start the threads its runner wants (the state machine's part,
    on a worker whose slots are all free for ranges)."""
    for _ in range(r.submit(record).threads):
        r.start_thread()


def ran(w: Worker, n: int) -> list[int]:
    """The indices of the next batches of finished elements, ``n`` of them in all."""
    out: list[int] = []
    while len(out) < n:
        batch = w.loop.q.get(timeout=30)
        assert not batch.failures
        out += batch.indices
    return out


@pytest.mark.timeout(60)
def test_a_release_gives_up_the_tails_not_started_and_they_never_run():
    """One thread: the first range blocks on element 0, a second waits behind it. A
    release of 6 takes the whole second range (the last given first), then the tail of
    the running one, never element 0; once let go, the thread runs exactly the rest."""
    GATE.clear()
    STARTED.clear()
    w = Worker(1)
    r = RangeRunner(w)
    try:
        submit(r, compute_range("m-a-", [0, 1, 2, 3, 4]))
        submit(r, compute_range("m-b-", [7, 8, 9]))
        assert STARTED.wait(30)
        assert r.release(6) == {"m-b-": [7, 8, 9], "m-a-": [2, 3, 4]}
        assert r.release(10) == {"m-a-": [1]}  # all that has not started
        assert r.release(10) == {}
        r.answer_release(ReleaseRange(1))
        assert w.sent[-1].released == {}
        GATE.set()
        assert ran(w, 1) == [0]
        assert w.loop.q.empty()
        submit(r, compute_range("m-c-", [5, 6]))  # the runner goes on with new ranges
        assert sorted(ran(w, 2)) == [5, 6]
    finally:
        GATE.set()
        w.executor.shutdown()


@pytest.mark.timeout(60)
def test_a_release_of_some_keeps_the_head_of_a_range():
    GATE.clear()
    STARTED.clear()
    w = Worker(1)
    r = RangeRunner(w)
    try:
        submit(r, compute_range("m-a-", [0, 1, 2, 3, 4, 5]))
        assert STARTED.wait(30)
        assert r.release(2) == {"m-a-": [4, 5]}
        GATE.set()
        assert sorted(ran(w, 4)) == [0, 1, 2, 3]
    finally:
        GATE.set()
        w.executor.shutdown()


class HeldPool:
    """Task threads started when the test calls them, one at a time."""

    def __init__(self) -> None:
        self.started: list = []

    def submit(self, fn: Any, *args: Any) -> None:
        self.started.append(fn)

    def shutdown(self) -> None:
        pass


@pytest.mark.timeout(60)
def test_a_range_given_as_the_last_thread_of_ranges_ends_still_gets_a_thread():
    """One thread, and the runner with a real state machine, the loop played in order. The
    thread runs out of ranges and ends; a ``compute-range`` already on the loop is handled
    before the thread's ``RangeThreadDone``, and wants a thread the state machine has no
    slot for yet (the ending thread holds it). The ``RangeThreadDone``, handled as the
    worker's loop handles it, gives that range a thread: its "none wanted" is stale.
    (The interleaving left bulk maps with one range waiting forever on an idle worker.)"""
    GATE.set()
    w = Worker(1)
    w.executor.shutdown()
    pool = w.executor = HeldPool()
    state = WorkerState(w.address, 1)
    r = RangeRunner(w)

    def loop_handles(event: Any) -> None:
        for instruction in state.handle(event):
            if type(instruction) is ev.RunRanges:
                r.start_thread()

    loop_handles(r.submit(compute_range("m-a-", [1, 2])))
    (thread,) = pool.started
    thread()  # runs both elements, finds nothing waiting, ends
    assert sorted(ran(w, 2)) == [1, 2]
    done = w.loop.events.get_nowait()
    assert type(done) is ev.RangeThreadDone and done.threads == 0
    loop_handles(r.submit(compute_range("m-b-", [3])))
    assert len(pool.started) == 1 and state.range_threads == 1  # no slot free yet
    loop_handles(r.as_of_now(done))
    assert len(pool.started) == 2, "the range of m-b- waits with no thread to run it"
    pool.started[1]()
    assert ran(w, 1) == [3]
