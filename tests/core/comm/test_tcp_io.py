"""The process's I/O thread: its timers."""

from __future__ import annotations

import threading

import pytest

from hpcsched.core.comm import tcp_io

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def io():
    io = tcp_io.acquire()
    try:
        yield io
    finally:
        io.release()


def on_io_thread(io: tcp_io.IOThread, fn):
    """``fn()`` run on the I/O thread; its result."""
    done = threading.Event()
    out: list = []

    def call():
        try:
            out.append(fn())
        finally:
            done.set()

    io.call_soon(call)
    assert done.wait(30), "the I/O thread did not run the call"
    return out[0]


def test_cancelled_timers_do_not_pile_up_until_their_deadline(io):
    # a connection starts a message-timeout timer (minutes) whenever a read ends inside
    # a message, and cancels it when the message is complete: many per second
    def churn():
        for _ in range(20_000):
            io.call_later(300.0, lambda: None).cancel()
        return len(io._timers)

    assert on_io_thread(io, churn) < 1_000  # of 20,000
    counted, on_heap = on_io_thread(io, lambda: (
        io._cancelled, sum(1 for e in io._timers if e[2].cancelled)))
    assert counted == on_heap


def test_live_timers_outlive_a_purge_and_fire_in_order(io):
    fired: list[int] = []
    all_fired = threading.Event()

    def fire(i):
        def f():
            fired.append(i)
            if len(fired) == 5:
                all_fired.set()
        return f

    mine: list = []  # every timer this test makes, kept to be looked for on the heap

    def schedule():
        dropped = []
        for i in range(5):
            mine.append(io.call_later(0.2 + 0.05 * i, fire(i)))  # live, among many cancelled
            for _ in range(1_000):
                mine.append(io.call_later(0.1 + 0.05 * i, fire(-1)))
                mine[-1].cancel()
            dropped.append(io.call_later(0.1, fire(-2)))
        mine.extend(dropped)
        for t in dropped:
            t.cancel()
            t.cancel()  # twice counts once
        return len(io._timers)

    assert on_io_thread(io, schedule) < 5_000
    assert all_fired.wait(30)
    assert fired == [0, 1, 2, 3, 4]
    # the count of cancelled timers on the heap stays exact as they are popped, and none
    # of this test's is left, all past their deadline (other users of the process's I/O
    # thread may have timers of their own there)
    ids = {id(t) for t in mine}
    counted, on_heap, left = on_io_thread(io, lambda: (
        io._cancelled, sum(1 for e in io._timers if e[2].cancelled),
        sum(1 for e in io._timers if id(e[2]) in ids)))
    assert counted == on_heap and left == 0
