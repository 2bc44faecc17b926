"""The server Loop: batching, calls, ticks, and ``offer`` (run in the producer's thread)."""

from __future__ import annotations

import threading
import time
from itertools import pairwise

import pytest

from hpcsched.core.comm.loop import Loop
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(30)


class Recorder:
    """A server whose ``process`` records (thread, items) and can be held up."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list]] = []
        self.flushes: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def process(self, items: list) -> None:
        self.entered.set()
        assert self.gate.wait(10)
        self.seen.append((threading.current_thread().name, list(items)))

    def flush(self) -> None:
        self.flushes.append(threading.current_thread().name)

    def items(self) -> list:
        return [i for _, batch in self.seen for i in batch]


@pytest.fixture
def server():
    rec = Recorder()
    loop = Loop("test-loop", rec.process, rec.flush)
    loop.start()
    try:
        yield loop, rec
    finally:
        rec.gate.set()
        loop.stop()
        assert loop.stopped.wait(5)


def test_put_is_processed_on_the_loop_thread_then_flushed(server):
    loop, rec = server
    loop.put("a")
    wait_until(lambda: rec.items() == ["a"], timeout=5)
    assert rec.seen[0][0] == "test-loop"
    wait_until(lambda: rec.flushes, timeout=5)
    assert rec.flushes[0] == "test-loop"


def test_offer_to_an_idle_loop_runs_in_the_callers_thread(server):
    loop, rec = server
    loop.offer("x")  # returns after the iteration: processed and flushed here
    me = threading.current_thread().name
    assert rec.seen == [(me, ["x"])]
    assert rec.flushes == [me]


def test_offer_to_a_busy_loop_queues_and_keeps_the_order(server):
    loop, rec = server
    rec.gate.clear()
    loop.put(1)  # the loop thread takes it and blocks in process
    assert rec.entered.wait(5)
    loop.put(2)
    loop.offer(3)  # busy: queued behind 2, not run here
    loop.offer(4)
    assert rec.seen == []
    rec.gate.set()
    wait_until(lambda: rec.items() == [1, 2, 3, 4], timeout=5)
    assert all(name == "test-loop" for name, _ in rec.seen)


def test_offer_never_overtakes_queued_items():
    rec = Recorder()
    loop = Loop("not-started", rec.process, rec.flush)
    loop.put("first")
    loop.offer("second")  # the loop has not started: queued, not run
    assert rec.seen == []
    loop.start()
    try:
        wait_until(lambda: rec.items() == ["first", "second"], timeout=5)
    finally:
        loop.stop()


def test_many_producers_offering_at_once_lose_and_reorder_nothing(server):
    loop, rec = server
    n, producers = 2000, 4
    active, overlaps = [0], []
    inner = loop._process

    def process(items: list) -> None:
        active[0] += 1
        if active[0] > 1:
            overlaps.append(items)
        time.sleep(0)  # let other threads run while "inside" the server's code
        inner(items)
        active[0] -= 1

    loop._process = process

    def produce(p: int) -> None:
        for i in range(n):
            (loop.offer if i % 2 else loop.put)((p, i))

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    wait_until(lambda: len(rec.items()) == n * producers, timeout=10)
    for p in range(producers):  # each producer's items in its own order
        assert [i for q, i in rec.items() if q == p] == list(range(n))
    assert overlaps == [], "two threads ran the server's code at once"


def test_call_from_code_running_the_iteration_does_not_deadlock(server):
    loop, rec = server
    results = []
    loop._process = lambda items: results.append(loop.call(lambda: "inner"))
    loop.offer("x")  # runs here; call() must run inline, not queue and wait
    assert results == ["inner"]


def test_stop_from_an_offered_iteration_returns(server):
    loop, _ = server
    loop._process = lambda items: loop.stop(join=True)  # would join itself if naive
    t0 = time.monotonic()
    loop.offer("x")
    assert time.monotonic() - t0 < 4
    assert loop.stopped.wait(5)


def test_calls_pending_at_stop_fail_instead_of_hanging():
    rec = Recorder()
    loop = Loop("stopping", rec.process, rec.flush)
    rec.gate.clear()
    loop.start()
    loop.put("hold")
    assert rec.entered.wait(5)
    box: list = []
    caller = threading.Thread(target=lambda: box.append(_call(loop)))
    caller.start()
    wait_until(lambda: len(loop._items) == 1, timeout=5)
    loop.stop(join=False)
    rec.gate.set()
    caller.join(10)
    assert box and isinstance(box[0], RuntimeError)
    assert loop.stopped.wait(5)


def test_an_unbounded_call_ends_when_the_loop_thread_ends_before_running_it(monkeypatch):
    """A call without a timeout (a journal's restore) waits as long as the loop runs it;
    if the loop's thread ends first -- here between the caller's look at the loop and its
    put, so that no one fails the call -- the caller hears so instead of waiting forever."""
    rec = Recorder()
    loop = Loop("ending", rec.process, rec.flush)
    loop.start()
    put = loop.put

    def put_after_the_end(item):
        loop.stop()
        assert loop.stopped.wait(5)
        put(item)

    monkeypatch.setattr(loop, "put", put_after_the_end)
    monkeypatch.setattr("hpcsched.core.comm.loop._LIVENESS_CHECK", 0.05)
    with pytest.raises(RuntimeError, match="ending ended before running the call"):
        loop.call(lambda: "never", timeout=None)


def test_an_unbounded_call_returns_the_result_or_raises_the_error():
    rec = Recorder()
    loop = Loop("unbounded", rec.process, rec.flush)
    loop.start()
    try:
        assert loop.call(lambda: 42, timeout=None) == 42
        with pytest.raises(ZeroDivisionError):
            loop.call(lambda: 1 / 0, timeout=None)
    finally:
        loop.stop()
    assert loop.stopped.wait(5)


def _call(loop: Loop):
    try:
        return loop.call(lambda: "never", timeout=10)
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e


def test_quiet_ticks_space_the_ticks_out_until_lifted():
    # a worker running a gang member: its loop ticks (memory samples) seldom meanwhile
    rec = Recorder()
    ticks: list[float] = []
    loop = Loop("ticking", rec.process, rec.flush,
                tick=lambda now: ticks.append(time.monotonic()), tick_interval=0.02)
    loop.start()
    try:
        wait_until(lambda: len(ticks) >= 2, timeout=5)
        loop.quiet_ticks(0.4)
        n = len(ticks)
        # the tick already due may come; those after it are 0.4 s apart, not 0.02
        wait_until(lambda: len(ticks) >= n + 3, timeout=10)
        gaps = [b - a for a, b in pairwise(ticks[n:])]
        assert min(gaps[1:]) >= 0.35, gaps
        loop.quiet_ticks(None)
        wait_until(lambda: len(ticks) >= n + 3 + 10, timeout=10)
        gaps = [b - a for a, b in pairwise(ticks[-6:])]
        assert max(gaps) < 0.35, gaps
    finally:
        loop.stop()


def test_ticks_run_on_the_loop_thread_when_idle():
    rec = Recorder()
    ticks: list[str] = []
    loop = Loop("ticking", rec.process, rec.flush,
                tick=lambda now: ticks.append(threading.current_thread().name), tick_interval=0.05)
    loop.start()
    try:
        wait_until(lambda: len(ticks) >= 3, timeout=5)
        assert set(ticks) == {"ticking"}
    finally:
        loop.stop()
