"""Results at a gather's speed in every idiom: ``result()`` brings along the small
finished results the client is about to ask for, and only those.

The first tests need no process: futures whose states are moved along by hand, as the
client's reader thread moves them, and the table that names, holds and hands out the
results fetched ahead. The others run on a LocalCluster, each on both roads (a bulk
map of at least 32 calls, and single submits): every idiom of dask's documentation gives
every result right, errors and cancellations behave as they did, and a client that
never asks for a result receives none.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

import pytest

from hpcsched.core import config
from hpcsched.core.client.client import CancelledError, Client, as_completed, wait
from hpcsched.core.client.future_state import FutureTable
from hpcsched.core.client.futures import (
    TAKEN,
    UNFETCHED,
    Arrivals,
    Future,
    FutureGroup,
    finish_all,
)

N = 40  # calls per test: above the bulk threshold (32) on the bulk road
WAIT = 30.0


def inc(x):
    return x + 1


def fails_on(x, bad):
    if x == bad:
        raise ValueError(f"element {x} is bad")
    return x + 1


def payload(x, size):
    return bytes([x % 256]) * size


def wait_for_file(path, timeout=WAIT):
    """Returns once ``path`` exists (a task the test releases), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return 1


class _Owner:
    """The part of a Client a Future uses, with no scheduler behind it."""

    id = "test-client"
    scheduler_comm = None

    def __init__(self) -> None:
        self.future_table = FutureTable(lambda msg: None, held_limit=1000)


def _held(futures) -> list:
    """The futures among ``futures`` whose value is held here, fetched ahead."""
    return [f for f in futures if f.state.value is not UNFETCHED and f.state.value is not TAKEN]


# --- no process: which results are named, held and handed out -----------------------------


def test_a_maps_group_names_the_finished_results_after_the_cursor():
    owner = _Owner()
    fs = [Future(f"inc-{i}", owner) for i in range(6)]
    group = FutureGroup(fs)
    for i in (0, 1, 3, 4):
        fs[i].state.finish("int")
    fs[4].state.error(b"", "", "boom")  # done, but nothing to fetch

    out: dict = {}
    group.ready(out, limit=10)
    assert list(out) == ["inc-0", "inc-1", "inc-3"]

    fs[0].state.value = TAKEN  # its result() took it: the cursor moves past it
    fs[1].state.value = 2
    out = {}
    group.ready(out, limit=2)  # looks at the next 2 from the cursor
    assert group.cursor == 2 and list(out) == ["inc-3"]


def test_the_table_holds_what_fits_and_hands_each_value_out_once():
    owner = _Owner()  # held_limit=1000
    table = owner.future_table
    a, b, c = (Future(k, owner) for k in "abc")
    for f in (a, b, c):
        f.state.finish("int")
    c.state.cancel()  # cancelled after it finished: not to be held

    table.hold({"a": a.state, "b": b.state, "c": c.state}, {"a": 1, "b": 2, "c": 3},
               {"a": 600, "b": 600, "c": 1})
    assert table.held_bytes == 600 and table.room() == 400  # b did not fit: dropped
    assert table.take(b.state) is UNFETCHED and table.take(c.state) is UNFETCHED
    assert table.take(a.state) == 1 and table.take(a.state) is UNFETCHED
    assert table.room() == 1000

    table.hold({"b": b.state}, {"b": 2}, {"b": 1000})
    assert table.room() == 0
    b.state.lose()  # recomputed: the value held is stale, and its bytes are counted back
    assert table.take(b.state) is UNFETCHED
    assert table.room() == 1000


def test_the_bytes_a_reply_in_flight_may_bring_are_counted_until_it_is_held():
    owner = _Owner()  # held_limit=1000
    table = owner.future_table
    a, b = Future("a", owner), Future("b", owner)
    for f in (a, b):
        f.state.finish("int")
    table.hold({"a": a.state}, {"a": 1}, {"a": 300})

    assert table.reserve(600) == 600  # a request's budget, counted while it travels
    assert table.room() == 100 and table.in_flight_bytes == 600
    assert table.reserve(600) == 100  # a second request gets what is left, not 600 more
    assert table.reserve(600) == 0
    table.unreserve(100)  # that one was not sent

    table.hold({"b": b.state}, {"b": 2}, {"b": 200}, reserved=600)  # its reply came

    assert table.in_flight_bytes == 0 and table.held_bytes == 500 and table.room() == 500
    assert table.take(b.state) == 2 and table.take(a.state) == 1
    assert table.room() == 1000


def test_a_released_futures_value_is_dropped():
    owner = _Owner()
    table = owner.future_table
    f = Future("a", owner)
    f.state.finish("int")
    state = f.state
    table.hold({"a": state}, {"a": "x" * 100}, {"a": 100})
    assert table.held_bytes == 100

    del f
    assert table.held_bytes == 0 and state.value is UNFETCHED


def test_the_candidates_come_from_as_completed_waits_and_queued_callbacks():
    owner = _Owner()
    table = owner.future_table
    fs = [Future(f"k{i}", owner) for i in range(5)]
    ac = as_completed(fs[:2])
    table.waited(FutureGroup(fs[2:3]))
    for f in fs:  # their callbacks are not queued: no callback thread runs them here
        f.state.finish("int")
    assert set(table.candidates(fs[4], limit=10)) == {"k2"}  # fs[4]: nobody waits for it

    ac._arrivals(fs[0])  # what the callback thread does as they finish
    ac._arrivals.many([fs[1]])
    assert set(table.candidates(fs[4], limit=10)) == {"k0", "k1", "k2"}

    table.run_callbacks([(weakref.ref(fs[3]), lambda f: None, fs[3])])  # queued, not run
    assert set(table.candidates(fs[4], limit=10)) == {"k0", "k1", "k2", "k3"}
    assert set(table.candidates(fs[0], limit=10)) == {"k1", "k2", "k3"}  # not the one asked
    assert len(table.candidates(fs[4], limit=2)) == 2


def test_as_completed_takes_every_future_done_so_far_at_once():
    owner = _Owner()
    fs = [Future(f"k{i}", owner) for i in range(5)]
    ac = as_completed(fs)
    for i in (3, 0, 1):  # finished in this order, reported together
        fs[i].state.finish("int")
    ac._arrivals.many([fs[3], fs[0], fs[1]])

    assert ac.next_batch(block=False) == [fs[3], fs[0], fs[1]]  # in the order they finished
    assert ac.next_batch(block=False) == [] and ac.count() == 2

    fs[4].state.finish("int")
    ac._arrivals(fs[4])
    assert next(ac) is fs[4] and ac.count() == 1 and not ac.is_empty()


@pytest.mark.timeout(30)
def test_the_callback_thread_hands_a_run_of_futures_to_their_as_completed_at_once(
        monkeypatch):
    calls: list = []
    many = Arrivals.many
    monkeypatch.setattr(Arrivals, "many", lambda self, fs: (calls.append(list(fs)),
                                                             many(self, fs)))
    owner = _Owner()
    table = owner.future_table
    table.start("test-client")
    try:
        fs = [Future(f"k{i}", owner) for i in range(6)]
        ac = as_completed(fs)
        ran: list = []
        fs[2].add_done_callback(ran.append)  # another callback amid the run

        table.run_callbacks(finish_all([f.state for f in fs], ["int"] * 6))

        assert list(ac) == fs  # each once, in the order they finished
        # one call per run of them in a row: one lock and one wake-up for each, and the
        # other callback in its place, after fs[2]'s arrival
        assert calls == [fs[:3], fs[3:]]
        assert ran == [fs[2]]
    finally:
        table.close()


@pytest.mark.timeout(30)
def test_threads_iterating_one_as_completed_get_each_future_once():
    owner = _Owner()
    fs = [Future(f"k{i}", owner) for i in range(2000)]
    ac = as_completed(fs)
    got: list[list] = [[], []]
    errors: list = []

    def drain(mine):
        try:
            mine.extend(ac)
        except Exception as e:  # what the test reports, not a thread's traceback
            errors.append(e)

    threads = [threading.Thread(target=drain, args=(got[i],)) for i in range(2)]
    for t in threads:
        t.start()
    for i in range(0, 2000, 50):  # finished in runs, as a map's are reported
        for f in fs[i:i + 50]:
            f.state.finish("int")
        ac._arrivals.many(fs[i:i + 50])
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads) and errors == []
    assert sorted(got[0] + got[1], key=fs.index) == fs and ac.is_empty()


def test_with_results_takes_the_values_fetched_ahead_together():
    owner = _Owner()
    table = owner.future_table
    fs = [Future(f"k{i}", owner) for i in range(3)]
    for f in fs:
        f.state.finish("int")
    table.hold({f.key: f.state for f in fs}, {"k0": 10, "k1": 11, "k2": 12},
               {"k0": 100, "k1": 100, "k2": 100})

    assert list(as_completed(fs, with_results=True)) == [(fs[0], 10), (fs[1], 11),
                                                          (fs[2], 12)]
    assert table.held_bytes == 0 and all(f.state.value is TAKEN for f in fs)


def test_single_submissions_name_the_finished_ones_in_the_order_they_were_made():
    owner = _Owner()
    table = owner.future_table
    fs = [Future(f"k{i}", owner) for i in range(6)]
    for f in fs:
        table.submitted(f.key, f.state)
    for i in (0, 1, 2, 4, 5):
        fs[i].state.finish("int")
    fs[1].state.error(b"", "", "boom")  # done, but nothing to fetch
    fs[0].state.value = TAKEN  # its result() took it

    assert list(table.candidates(fs[2], limit=10)) == ["k4", "k5"]  # k3 runs still
    assert list(table.candidates(fs[4], limit=1)) == ["k2"]

    fs[2].state.value = TAKEN
    fs[3].release()  # let go before it finished: never waited for at the front
    assert list(table.candidates(fs[0], limit=10)) == ["k4", "k5"]
    assert len(table._submitted._items) == 2  # the settled front is gone

    m = [Future(f"m{i}", owner) for i in range(3)]  # a map's futures ask their map only
    group = FutureGroup(m)
    for f in m:
        f.group = group
        f.state.finish("int")
    assert list(table.candidates(m[0], limit=10)) == ["m1", "m2"]


def test_what_single_submissions_keep_is_bounded():
    owner = _Owner()
    table = owner.future_table
    fs = [Future(f"k{i}", owner) for i in range(20_000)]
    for f in fs:
        table.submitted(f.key, f.state)  # none asked for, none done
    assert len(table._submitted._items) == 16_384


def test_a_value_taken_is_counted_back_once_even_when_held_again():
    owner = _Owner()  # held_limit=1000
    table = owner.future_table
    a, b = Future("a", owner), Future("b", owner)
    for f in (a, b):
        f.state.finish("int")
    table.hold({"a": a.state}, {"a": 1}, {"a": 400})
    assert a.result() == 1  # taken with no lock: its bytes are counted back later ...
    assert table.held_bytes == 0 and table.room() == 1000  # ... when the table looks

    table.hold({"a": a.state, "b": b.state}, {"a": 1, "b": 2}, {"a": 400, "b": 400})
    assert table.held_bytes == 400 and a.state.value is TAKEN  # a: asked for already
    assert b.result() == 2
    a.state.lose()  # recomputed: fetched ahead again, its old bytes not counted twice
    a.state.finish("int")
    table.hold({"a": a.state}, {"a": 10}, {"a": 900})
    assert a.result() == 10 and table.held_bytes == 0 and table.room() == 1000


def test_the_table_lets_go_of_the_states_whose_values_were_taken():
    owner = _Owner()
    owner.future_table.held_limit = 2**40  # never short of room: no look at it for room
    table = owner.future_table
    for i in range(20_000):  # one value fetched ahead, taken and released at a time
        f = Future(f"k{i}", owner)
        f.state.finish("int")
        table.hold({f.key: f.state}, {f.key: i}, {f.key: 10})
        assert f.result() == i
        del f
    # the states it keeps to count their bytes back are swept as they pile up, not kept
    # one per value ever held
    assert len(table._held) <= 4097 and table.held_bytes == 0


@pytest.mark.timeout(30)
def test_a_batchs_callbacks_are_queued_together_at_its_end():
    owner = _Owner()
    table = owner.future_table
    fs = [Future(f"k{i}", owner) for i in range(4)]
    ac = as_completed(fs)
    table.start("test-client")
    try:
        for f in fs[:3]:  # a batch of key-in-memory messages, each handled on its own
            table.defer_callbacks(f.state.finish("int"))
        assert ac.next_batch(block=False) == []  # nothing queued before the batch ends

        table.batch_done()
        assert ac.next_batch(block=True) == fs[:3]  # handed over at once
        assert ac.count() == 1
    finally:
        table.close()


def test_as_completed_does_not_fetch_ahead_for_futures_it_yielded():
    owner = _Owner()
    table = owner.future_table
    fs = [Future(f"k{i}", owner) for i in range(5)]
    ac = as_completed(fs)
    for f in fs:
        f.state.finish("int")
    ac._arrivals.many(fs)  # what the callback thread does as they finish
    assert next(ac) is fs[0] and next(ac) is fs[1]  # yielded, their results not asked for

    assert list(table.candidates(fs[4], limit=10)) == ["k2", "k3"]
    fs[2].state.value = TAKEN  # taken by its result(): settled, not looked at again
    assert list(table.candidates(fs[4], limit=10)) == ["k3"]
    assert list(ac._arrivals.unsettled) == [fs[3], fs[4]]  # the yielded are let go


# --- on a cluster: every idiom, both roads ---------------------------------------------


def _as_completed(client, fs):
    return [f.result() for f in as_completed(fs)]


def _with_results(client, fs):
    return [r for _, r in as_completed(fs, with_results=True)]


def _batches(client, fs):
    return [f.result() for batch in as_completed(fs).batches() for f in batch]


def _result_loop(client, fs):
    return [f.result(timeout=WAIT) for f in fs]


def _wait_then_result(client, fs):
    wait(fs, timeout=WAIT)
    return [f.result() for f in fs]


def _callbacks(client, fs):
    out: list = []
    errors: list = []
    lock = threading.Lock()
    done = threading.Event()

    def cb(f):
        try:
            v = f.result()
        except Exception as e:
            v = None
            errors.append(e)
        with lock:
            out.append(v)
            if len(out) == len(fs):
                done.set()

    for f in fs:
        f.add_done_callback(cb)
    assert done.wait(WAIT), f"{len(out)} of {len(fs)} callbacks ran"
    if errors:
        raise errors[0]
    return out


IDIOMS = {
    "as_completed": _as_completed,
    "with_results": _with_results,
    "batches": _batches,
    "result_loop": _result_loop,
    "wait_then_result": _wait_then_result,
    "callbacks": _callbacks,
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("idiom", list(IDIOMS))
def test_every_idiom_gives_every_result(shared_client, road, idiom):
    fs = road.calls(shared_client, inc, N)

    got = IDIOMS[idiom](shared_client, fs)

    assert sorted(got) == list(range(1, N + 1))
    assert [f.result() for f in fs] == list(range(1, N + 1))  # asked again: asked anew


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [N, 20])  # a bulk map, and a map of tasks
def test_the_executors_map_gives_every_result_in_order(shared_client, n):
    with shared_client.get_executor(pure=False) as ex:
        assert list(ex.map(inc, range(n), timeout=WAIT)) == list(range(1, n + 1))


def _gathers(client, monkeypatch) -> list:
    """The ``Gather`` requests ``client`` sends from now on (the test's own client)."""
    from hpcsched.core.protocol.messages import Gather

    conn = client.scheduler_comm
    sent: list = []
    send_request = conn.send_request

    def counting(msg, *args, **kwargs):
        if isinstance(msg, Gather):
            sent.append(msg)
        return send_request(msg, *args, **kwargs)

    monkeypatch.setattr(conn, "send_request", counting)
    return sent


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [N, 20])  # a bulk map, and a map of tasks
def test_the_executors_map_gathers_the_finished_results_at_once(own_client, n, monkeypatch):
    with own_client.get_executor(pure=False) as ex:
        it = ex.map(inc, range(n), timeout=WAIT)
        wait(list(ex._futures), timeout=WAIT)  # the map's futures, all done before the loop
        sent = _gathers(own_client, monkeypatch)

        assert list(it) == list(range(1, n + 1))

    assert len(sent) == 1 and len(sent[0].keys) == n  # one request, not one per element
    assert not ex._futures


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [N, 20])
def test_the_executors_map_yields_up_to_an_erred_element_then_raises(shared_client, n):
    with shared_client.get_executor(pure=False) as ex:
        it = ex.map(fails_on, range(n), [7] * n, timeout=WAIT)
        wait(list(ex._futures), timeout=WAIT)  # element 7 erred in the batch of all

        assert [next(it) for _ in range(7)] == list(range(1, 8))
        with pytest.raises(ValueError, match="element 7 is bad"):
            next(it)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [N, 20])
def test_the_executors_map_times_out_and_cancels_the_rest(shared_client, n, tmp_path):
    release = tmp_path / "release"
    try:
        with shared_client.get_executor(pure=False) as ex:
            it = ex.map(wait_for_file, [str(release)] * n, timeout=0.5)
            fs = list(ex._futures)
            with pytest.raises(TimeoutError):
                next(it)
            it.close()  # as a for loop left by the exception does, when collected

            assert not ex._futures
            wait(fs, timeout=WAIT)
            assert all(f.cancelled() for f in fs)
    finally:
        release.touch()


@pytest.mark.timeout(90)
def test_one_request_brings_the_finished_results_along(shared_client, road):
    fs = road.calls(shared_client, inc, N)
    wait(fs, timeout=WAIT)

    assert fs[0].result() == 1

    assert _held(fs) == fs[1:]  # the wait's futures, all finished, came with it
    assert [f.result() for f in fs[1:]] == list(range(2, N + 1))
    assert _held(fs) == [] and shared_client.future_table.held_bytes == 0


@pytest.mark.timeout(90)
def test_a_result_loop_brings_the_finished_results_along(shared_client, road):
    import concurrent.futures

    fs = road.calls(shared_client, inc, N)
    # the standard library's wait: none of hpcsched's own hints of what comes next
    concurrent.futures.wait(fs, timeout=WAIT)

    assert fs[0].result() == 1

    assert _held(fs) == fs[1:]  # the map's, or the submissions made after it
    assert [f.result() for f in fs[1:]] == list(range(2, N + 1))
    assert _held(fs) == [] and shared_client.future_table.held_bytes == 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize("idiom", ["as_completed", "with_results", "batches", "callbacks"])
def test_an_erred_task_raises_its_exception_at_result(shared_client, road, idiom):
    fs = road.map(shared_client, fails_on, range(N), [7] * N, pure=False)

    with pytest.raises(ValueError, match="element 7 is bad"):
        IDIOMS[idiom](shared_client, fs)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("first_wait", [False, True])
def test_an_erred_task_in_a_result_loop(shared_client, road, first_wait):
    fs = road.map(shared_client, fails_on, range(N), [7] * N, pure=False)
    if first_wait:
        wait(fs, timeout=WAIT)

    for i, f in enumerate(fs):
        if i == 7:
            with pytest.raises(ValueError, match="element 7 is bad"):
                f.result()
        else:
            assert f.result() == i + 1
    assert fs[7].state.value is UNFETCHED  # an erred one is never fetched ahead


@pytest.mark.timeout(90)
def test_with_results_can_hand_back_the_exception(shared_client, road):
    fs = road.map(shared_client, fails_on, range(N), [3] * N, pure=False)

    got = dict(as_completed(fs, with_results=True, raise_errors=False))

    assert isinstance(got[fs[3]], ValueError)
    assert sorted(v for f, v in got.items() if f is not fs[3]) == \
        [i + 1 for i in range(N) if i != 3]


@pytest.mark.timeout(90)
def test_a_cancelled_future_raises_even_when_its_result_was_fetched_ahead(shared_client, road):
    fs = road.calls(shared_client, inc, N)
    wait(fs, timeout=WAIT)
    assert fs[0].result() == 1
    assert fs[5] in _held(fs)

    shared_client.cancel([fs[5]])

    with pytest.raises(CancelledError):
        fs[5].result()
    assert fs[5] not in _held(fs)
    assert [f.result() for f in fs[6:]] == list(range(7, N + 1))


@pytest.mark.timeout(90)
def test_as_completed_yields_a_future_cancelled_before_it_finished(shared_client, road,
                                                                   tmp_path):
    release = tmp_path / "release"
    blocked = shared_client.submit(wait_for_file, str(release), pure=False)
    try:
        fs = road.calls(shared_client, inc, N)
        shared_client.cancel([blocked])

        seen = list(as_completed([*fs, blocked]))

        assert blocked in seen and blocked.cancelled()
        with pytest.raises(CancelledError):
            blocked.result()
        assert sorted(f.result() for f in seen if f is not blocked) == list(range(1, N + 1))
    finally:
        release.touch()  # the task, if it started, ends


@pytest.fixture
def own_client(shared_cluster):
    """A client of its own on the shared cluster: its table holds this test's futures only."""
    client = Client(shared_cluster, set_as_default=False)
    try:
        yield client
    finally:
        client.close()


@pytest.mark.timeout(90)
def test_a_client_that_never_asks_for_results_receives_none(own_client, road, monkeypatch):
    sent = _gathers(own_client, monkeypatch)
    fs = road.calls(own_client, payload, N, size=10_000)
    wait(fs, timeout=WAIT)
    assert len(list(as_completed(fs))) == N
    ran = threading.Semaphore(0)
    for f in fs:
        f.add_done_callback(lambda f: ran.release())
    for _ in fs:
        assert ran.acquire(timeout=WAIT)

    assert sent == []  # no request for a result, and none in flight
    table = own_client.future_table
    assert table.held_bytes == 0 and table.in_flight_bytes == 0 and not table.on_its_way()
    assert all(f.state.value is UNFETCHED for f in fs)


@pytest.mark.timeout(120)
def test_large_results_stay_on_the_workers_and_what_is_held_is_bounded(shared_cluster, road):
    settings = {"client.prefetch-result-bytes": 50_000, "client.prefetch-held-bytes": 200_000}
    with config.set(settings):
        client = Client(shared_cluster, set_as_default=False)
    try:
        large = road.calls(client, payload, N, size=100_000)
        wait(large, timeout=WAIT)
        assert large[0].result() == bytes([0]) * 100_000
        assert _held(large) == []  # each larger than prefetch-result-bytes

        small = road.calls(client, payload, N, size=10_000)
        wait(small, timeout=WAIT)
        assert small[0].result() == bytes([0]) * 10_000
        held = _held(small)
        assert 0 < len(held) < N - 1  # some 20 of 10 kB fit in 200 kB, not 39
        # what is held and what the reply in flight may bring, together
        assert client.future_table.held_bytes + client.future_table.in_flight_bytes <= 200_000
        assert [f.result() for f in small] == [bytes([i]) * 10_000 for i in range(N)]
        assert client.future_table.held_bytes == 0
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_a_result_loop_asks_for_the_next_results_before_it_needs_them(shared_cluster, road):
    with config.set({"client.prefetch-bytes": 50_000}):
        client = Client(shared_cluster, set_as_default=False)
    try:
        table = client.future_table
        fs = road.calls(client, payload, N, size=10_000)
        wait(fs, timeout=WAIT)

        assert fs[0].result() == bytes([0]) * 10_000

        held = _held(fs)
        assert 0 < len(held) < N - 1  # some 5 of 10 kB came along in 50 kB, not 39
        assert table.in_flight_bytes > 0  # the reply on its way is counted ...
        assert table.room() == table.held_limit - table.held_bytes - table.in_flight_bytes
        on_its_way = [f for f in fs if table.on_its_way(f.key)]
        assert on_its_way  # the next ones, asked for before a result() needs them
        assert not set(on_its_way) & set(held) and fs[0] not in on_its_way
        assert [f.result(timeout=WAIT) for f in fs] == [bytes([i]) * 10_000 for i in range(N)]
        assert table.held_bytes == 0 and not table.on_its_way()
        assert table.in_flight_bytes == 0  # ... until its values are held
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_a_result_the_reply_on_its_way_brought_sends_the_next_request(shared_cluster, road):
    with config.set({"client.prefetch-bytes": 50_000}):
        client = Client(shared_cluster, set_as_default=False)
    try:
        table = client.future_table
        fs = road.calls(client, payload, N, size=10_000)
        wait(fs, timeout=WAIT)
        assert fs[0].result() == bytes([0]) * 10_000
        first = next(i for i, f in enumerate(fs) if table.on_its_way(f.key))
        assert [f.result() for f in fs[1:first]] == [bytes([i]) * 10_000
                                                      for i in range(1, first)]  # held

        assert fs[first].result() == bytes([first]) * 10_000  # the reply on its way's

        # and the next results are asked for at once: one request stays on its way
        assert [i for i, f in enumerate(fs) if table.on_its_way(f.key)][0] > first
        assert [f.result(timeout=WAIT) for f in fs] == [bytes([i]) * 10_000 for i in range(N)]
        assert table.held_bytes == 0 and table.in_flight_bytes == 0
    finally:
        client.close()
