"""Futures as the standard library takes them: ``concurrent.futures.wait`` and
``as_completed`` on hpcsched's futures, and the executor's futures as arguments.

The first tests need no process: a future's state is moved along by hand, as the
client's reader thread moves it. The others run on a LocalCluster, each on both
roads (a bulk map of at least 32 calls, and single submits).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time

import pytest

from hpcsched.core.client.client import as_completed, wait
from hpcsched.core.client.future_state import FutureTable
from hpcsched.core.client.futures import Future, finish_all
from hpcsched.core.protocol.serialize import serialize


def inc(x):
    return x + 1


def double(x):
    return 2 * x


def fails_on(x, bad):
    if x == bad:
        raise ValueError(f"element {x} is bad")
    return x


def wait_for_file(path, timeout=30.0):
    """Blocks until ``path`` exists (a task the test releases), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return 1


class _Owner:
    """The part of a Client a Future uses, with no scheduler behind it."""

    id = "test-client"
    scheduler_comm = None

    def __init__(self) -> None:
        self.future_table = FutureTable(lambda msg: None)


# --- no process: the protocol of concurrent.futures' wait and as_completed ---------------


def test_a_future_is_a_concurrent_future():
    f = Future("inc-1", _Owner())
    assert isinstance(f, cf.Future)
    assert not f.done() and f._state == "PENDING"


@pytest.mark.timeout(10)
def test_wait_wakes_when_the_reader_thread_finishes_the_state():
    owner = _Owner()
    a, b = Future("a", owner), Future("b", owner)
    a.state.finish("int")  # done before the wait

    threading.Timer(0.1, b.state.finish, args=("int",)).start()
    done, not_done = cf.wait([a, b], timeout=5)

    assert done == {a, b} and not not_done
    assert b.state.waiters is None  # the wait's waiter left with it


@pytest.mark.timeout(10)
def test_wait_first_exception_and_cancelled():
    owner = _Owner()
    ok, bad, gone, pending = (Future(k, owner) for k in "abcd")
    ok.state.finish()
    gone.state.cancel()
    assert cf.wait([ok, gone, pending], timeout=0.05) == ({ok, gone}, {pending})

    threading.Timer(0.1, bad.state.error, args=(serialize(ValueError("x")), "", "x")).start()
    done, not_done = cf.wait([ok, bad, pending], timeout=5, return_when=cf.FIRST_EXCEPTION)

    assert done == {ok, bad} and not_done == {pending}
    assert isinstance(bad.exception(), ValueError)
    assert pending.state.waiters is None  # the timed-out wait took its waiter back


@pytest.mark.timeout(10)
def test_as_completed_yields_in_finishing_order_bulk_states_too():
    owner = _Owner()
    fs = Future.of_keys([f"m-{i}" for i in range(5)], owner)
    fs[4].state.finish()

    def finish_rest():
        finish_all([fs[2].state, fs[0].state], ["int", "int"])  # a bulk map's batch
        fs[1].state.cancel()
        fs[3].state.finish()

    threading.Timer(0.1, finish_rest).start()
    order = list(cf.as_completed(fs, timeout=5))

    assert order[0] is fs[4] and set(order[1:3]) == {fs[0], fs[2]}
    assert order[3:] == [fs[1], fs[3]]
    assert all(f.state.waiters is None for f in fs)


def test_as_completed_times_out_and_leaves_no_waiter():
    f = Future("slow", _Owner())
    with pytest.raises(TimeoutError):
        next(cf.as_completed([f], timeout=0.05))
    assert f.state.waiters is None


def test_a_state_made_pending_again_is_waited_for_again():
    f = Future("lost", _Owner())
    f.state.finish()
    f.state.lose()
    assert cf.wait([f], timeout=0.05).not_done == {f}
    f.state.finish()
    assert cf.wait([f], timeout=0.05).done == {f}


# --- on a cluster ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_concurrent_futures_wait(shared_client, road):
    fs = road.calls(shared_client, inc, 40)

    done, not_done = cf.wait(fs, timeout=30)

    assert not not_done and done == set(fs)
    assert sorted(f.result() for f in done) == list(range(1, 41))


@pytest.mark.timeout(60)
def test_concurrent_futures_as_completed(shared_client, road):
    fs = road.calls(shared_client, inc, 40)

    results = [f.result() for f in cf.as_completed(fs, timeout=30)]

    assert sorted(results) == list(range(1, 41))


@pytest.mark.timeout(60)
def test_concurrent_futures_wait_first_exception(shared_client, road):
    fs = road.map(shared_client, fails_on, range(40), [7] * 40)

    done, _ = cf.wait(fs, timeout=30, return_when=cf.FIRST_EXCEPTION)

    assert fs[7] in done
    with pytest.raises(ValueError, match="element 7 is bad"):
        fs[7].result()


@pytest.mark.timeout(60)
def test_concurrent_futures_wait_first_completed_and_timeout(shared_client, tmp_path):
    release = str(tmp_path / "release")
    blocked = shared_client.submit(wait_for_file, release, pure=False)
    quick = shared_client.submit(inc, 1, pure=False)

    done, not_done = cf.wait([blocked, quick], timeout=30, return_when=cf.FIRST_COMPLETED)
    assert done == {quick} and not_done == {blocked}
    assert cf.wait([blocked], timeout=0.1).not_done == {blocked}

    open(release, "w").close()
    assert cf.wait([blocked], timeout=30).done == {blocked}
    assert blocked.result() == 1


@pytest.mark.timeout(60)
def test_hpcsched_wait_and_as_completed_still_take_any_iterable(shared_client, road):
    fs = road.calls(shared_client, inc, 40)

    assert wait(fs, timeout=30).not_done == set()
    batch = [f for fs_ in as_completed(fs).batches() for f in fs_]
    assert sorted(f.result() for f in batch) == list(range(1, 41))


@pytest.mark.timeout(60)
def test_executor_futures_are_arguments_of_submit(shared_client):
    with shared_client.get_executor() as ex:
        g = ex.submit(inc, 1)
        f = ex.submit(double, g)
        assert isinstance(f, cf.Future)
        assert f.result(timeout=30) == 4
        assert ex.submit(sum, [ex.submit(inc, i) for i in range(3)]).result(timeout=30) == 6
        assert shared_client.submit(double, ex.submit(inc, 2)).result(timeout=30) == 6


@pytest.mark.timeout(60)
def test_executor_futures_in_concurrent_futures_as_completed(shared_client):
    with shared_client.get_executor() as ex:
        fs = [ex.submit(inc, i) for i in range(5)]
        assert sorted(f.result() for f in cf.as_completed(fs, timeout=30)) == [1, 2, 3, 4, 5]

