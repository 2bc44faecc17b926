"""Bulk maps end to end (hpcsched.core.state.bulk): ``Client.map`` over many elements, on
a LocalCluster of real worker processes; every element keeps its own future.

The maps here are above ``BULK_MAP_MIN`` elements, so they travel as bulk maps; each
test checks that one (``_is_bulk``: the scheduler holds the map, not a task per element).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from hpcsched.core.client.client import CancelledError, Client, as_completed, wait
from hpcsched.core.client.graphs import BULK_MAP_MIN
from tests.conftest import _local_cluster, wait_until, worker_env

N = max(BULK_MAP_MIN, 100)


def inc(x):
    return x + 1


def fails_on(x, bad):
    if x == bad:
        raise ValueError(f"element {x} is bad")
    return x


def slow(x, delay):
    time.sleep(delay)
    return x


def flaky_element(x, bad, path):
    """Element ``bad`` fails its first two calls (counted in a file: calls may run on any
    worker)."""
    if x != bad:
        return x
    with open(path, "a+") as f:
        f.seek(0)
        n = len(f.read())
        f.write("x")
    if n < 2:
        raise RuntimeError(f"flaky failure {n + 1}")
    return -x


def tagged(x, directory, delay):
    """Counts its calls per element in ``directory``; returns (x, the worker's pid)."""
    with open(os.path.join(directory, str(x)), "a") as f:
        f.write("x")
    time.sleep(delay)
    return x, os.getpid()


def _is_bulk(client: Client, futures: list) -> bool:
    prefix = futures[0].key.rpartition("-")[0] + "-"

    def held(dask_scheduler: Any) -> bool:
        return prefix in dask_scheduler.state.bulk.maps

    return client.run_on_scheduler(held)


@pytest.fixture
def c(shared_client):
    return shared_client


@pytest.mark.timeout(60)
def test_every_element_has_its_own_future(c):
    fs = c.map(inc, range(N))
    assert _is_bulk(c, fs)
    assert len({f.key for f in fs}) == N
    assert c.gather(fs, timeout=30) == list(range(1, N + 1))
    assert all(f.status == "finished" and f.done() for f in fs)
    assert fs[3].result() == 4 and fs[3].state.typename == "int"


@pytest.mark.timeout(60)
def test_one_failing_element_errs_its_own_future_only(c):
    fs = c.map(fails_on, range(N), bad=7, pure=False)
    assert _is_bulk(c, fs)
    with pytest.raises(ValueError, match="element 7 is bad"):
        fs[7].result(timeout=30)
    assert isinstance(fs[7].exception(), ValueError)
    others = [f for i, f in enumerate(fs) if i != 7]
    assert c.gather(others, timeout=30) == [i for i in range(N) if i != 7]
    assert all(f.exception() is None for f in others)
    assert c.gather(fs, errors="skip", timeout=30) == [i for i in range(N) if i != 7]


@pytest.mark.timeout(120)
def test_a_large_gather_comes_in_parts_in_the_right_order(c):
    from hpcsched.core.client.data import GATHER_PART

    n = 2 * GATHER_PART + 7
    fs = c.map(fails_on, range(n), bad=GATHER_PART + 3, pure=False)
    assert c.gather(fs, errors="skip", timeout=60) == [i for i in range(n)
                                                       if i != GATHER_PART + 3]
    with pytest.raises(ValueError, match=f"element {GATHER_PART + 3} is bad"):
        c.gather(fs, timeout=60)
    # the first part was asked for before the second's error was seen: not waited for now
    assert not c.scheduler_comm._requests
    assert c.gather({"a": fs[-1], "b": [fs[0], fs[GATHER_PART]]}, timeout=60) == {
        "a": n - 1, "b": [0, GATHER_PART]}


@pytest.mark.timeout(60)
def test_retries_apply_to_each_element(c, tmp_path):
    path = str(tmp_path / "calls")
    fs = c.map(flaky_element, range(N), bad=5, path=path, retries=2, pure=False)
    assert _is_bulk(c, fs)
    assert fs[5].result(timeout=30) == -5
    assert c.gather(fs, timeout=30) == [-5 if i == 5 else i for i in range(N)]
    with open(path) as f:
        assert f.read() == "xxx"  # two failures, then the success


@pytest.mark.timeout(60)
def test_cancel_one_element(c):
    fs = c.map(slow, range(N), delay=0.01, pure=False)
    assert _is_bulk(c, fs)
    victim = fs[N - 1]
    victim.cancel()
    with pytest.raises(CancelledError):
        victim.result(timeout=30)
    assert victim.cancelled()
    assert c.gather(fs[:-1], timeout=60) == list(range(N - 1))


@pytest.mark.timeout(60)
def test_as_completed_and_wait_over_elements(c):
    fs = c.map(inc, range(N), pure=False)
    assert _is_bulk(c, fs)
    seen = sorted(f.result() for f in as_completed(fs))
    assert seen == list(range(1, N + 1))
    done, not_done = wait(fs, timeout=30)
    assert len(done) == N and not not_done


@pytest.mark.timeout(60)
def test_who_has_of_elements_leaves_them_elements(c):
    """``who_has`` names the worker holding each element's result (none for one not run
    yet), read from the map: the question makes no element a task of its own."""
    fs = c.map(slow, range(N), delay=0.01, pure=False)
    assert _is_bulk(c, fs)
    early = c.who_has(fs)
    assert sorted(early) == sorted(f.key for f in fs)
    assert c.gather(fs, timeout=30) == list(range(N))
    workers = set(c.scheduler_info()["workers"])
    has = c.who_has(fs)
    assert sorted(has) == sorted(f.key for f in fs)
    assert all(len(holders) == 1 and holders[0] in workers for holders in has.values()), has
    keys = [f.key for f in fs]
    assert c.run_on_scheduler(lambda dask_scheduler: [
        k for k in keys if dict.__contains__(dask_scheduler.state.tasks, k)]) == []
    assert _is_bulk(c, fs)


@pytest.mark.timeout(60)
def test_an_element_is_the_input_of_a_later_task(c):
    fs = c.map(inc, range(N), pure=False)
    assert _is_bulk(c, fs)
    total = c.submit(sum, fs, pure=False)
    one = c.submit(inc, fs[10], pure=False)
    assert one.result(timeout=30) == 12
    assert total.result(timeout=30) == sum(range(1, N + 1))
    assert c.gather(fs, timeout=30) == list(range(1, N + 1))


@pytest.mark.timeout(60)
def test_an_element_depended_on_before_it_ran(c):
    fs = c.map(slow, range(N), delay=0.005, pure=False)
    later = c.submit(inc, fs[N - 1], pure=False)  # most likely still queued
    assert later.result(timeout=30) == N
    assert c.gather(fs, timeout=30) == list(range(N))


@pytest.mark.timeout(60)
def test_a_map_over_futures_goes_task_by_task(c):
    xs = c.map(inc, range(N), pure=False)
    ys = c.map(inc, xs)  # arguments are futures: each element depends on another
    assert not _is_bulk(c, ys)
    assert c.gather(ys, timeout=30) == list(range(2, N + 2))


@pytest.mark.timeout(60)
def test_the_same_pure_map_gives_the_same_futures_while_held(c):
    a = c.map(inc, range(N))
    b = c.map(inc, range(N))
    assert [f.key for f in a] == [f.key for f in b]
    assert c.gather(b, timeout=30) == list(range(1, N + 1))
    other = c.map(inc, range(1, N + 1))
    assert {f.key for f in other}.isdisjoint(f.key for f in a)


@pytest.mark.timeout(60)
def test_released_elements_are_forgotten_everywhere(c):
    fs = c.map(inc, range(N), pure=False)
    prefix = fs[0].key.rpartition("-")[0] + "-"
    c.gather(fs, timeout=30)
    del fs

    def gone(dask_scheduler: Any) -> bool:
        return prefix not in dask_scheduler.state.bulk.maps

    wait_until(lambda: c.run_on_scheduler(gone), timeout=20, what="the map to be forgotten")

    def held_keys() -> list:
        return [k for keys in c.run(lambda dask_worker: list(dask_worker.state.data)).values()
                for k in keys if str(k).startswith(prefix)]

    wait_until(lambda: not held_keys(), timeout=20, what="the workers to free the results")


@pytest.mark.timeout(60)
def test_executor_map_accepts_chunksize(c):
    with c.get_executor() as ex:
        assert list(ex.map(inc, range(N), chunksize=16)) == list(range(1, N + 1))
        with pytest.raises(ValueError, match="element 3 is bad"):
            list(ex.map(fails_on, range(N), [3] * N, timeout=30))


def _until_both_workers_ran_some(fs: list) -> dict[int, int]:
    """Results of ``tagged`` elements as they finish, until each of two workers has given
    some (30 in all at least): element -> the pid that ran it."""
    done: dict[int, int] = {}
    for f in as_completed(fs):
        x, pid = f.result()
        done[x] = pid
        if len(done) >= 30 and len(set(done.values())) == 2:
            break
    return done


@pytest.mark.timeout(120)
def test_a_worker_killed_mid_map_loses_only_its_unfinished_elements(tmp_path):
    """Two workers run a map of slow elements; one is SIGKILLed mid-range. Every future
    still gets its right result; only the victim's elements (unfinished, or finished and
    held only by it) run again: those finished on the survivor ran once."""
    n = 200
    cluster = _local_cluster(n_workers=2)
    try:
        with Client(cluster, set_as_default=False) as client:
            fs = client.map(tagged, range(n), directory=str(tmp_path), delay=0.02,
                            pure=False)
            assert _is_bulk(client, fs)
            done = _until_both_workers_ran_some(fs)
            victim_pid = max(set(done.values()))
            survivor_pid = min(set(done.values()))
            (victim,) = [p for p in cluster.worker_processes.values() if p.pid == victim_pid]
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            results = client.gather(fs, timeout=90)
            assert [x for x, _ in results] == list(range(n))
            assert all(pid != victim_pid for _, pid in results)
            calls = {int(name): len(open(tmp_path / name).read())
                     for name in os.listdir(tmp_path)}
            assert sorted(calls) == list(range(n))
            again = {i for i, k in calls.items() if k > 1}
            assert again, "the victim held results, which were recomputed"
            assert not again & {i for i, pid in done.items() if pid == survivor_pid}
    finally:
        cluster.close()


def dies_on(x, bad):
    if x == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@pytest.mark.timeout(180)
def test_an_element_that_kills_its_workers_errs_with_killed_worker_alone():
    """An element that kills every worker running it errs its own future with
    KilledWorker after scheduler.allowed-failures (3) deaths, as a task would; every
    other element of the map gets its result, and the cluster computes on."""
    from hpcsched.core.state.scheduler_state import KilledWorker

    n, bad = 300, 137
    cluster = _local_cluster(n_workers=2)
    try:
        with Client(cluster, set_as_default=False) as client:
            fs = client.map(dies_on, range(n), bad=bad)
            assert _is_bulk(client, fs)
            with pytest.raises(KilledWorker) as e:
                fs[bad].result(timeout=150)
            assert repr(fs[bad].key) in str(e.value) and "3 workers" in str(e.value)
            good = [f for i, f in enumerate(fs) if i != bad]
            assert client.gather(good, timeout=60) == [i for i in range(n) if i != bad]
            assert client.submit(inc, 41).result(timeout=60) == 42
    finally:
        cluster.close()


def slow_on(x, slow, directory, fast_delay):
    """Counts its calls per element in ``directory``; sleeps half a second on the worker at
    ``slow``, ``fast_delay`` elsewhere; returns (x, the worker's address)."""
    from hpcsched import get_worker

    with open(os.path.join(directory, str(x)), "a") as f:
        f.write("x")
    address = get_worker().address
    time.sleep(0.5 if address == slow else fast_delay)
    return x, address


@pytest.mark.timeout(180)
def test_idle_workers_steal_the_tail_of_a_slow_workers_ranges(tmp_path):
    """Three workers; on one every element takes half a second, on the others 5 ms. The
    slow worker's first ranges (25 elements each: 12 s of work there) are taken back,
    their tail half at a time, by the idle workers: the map finishes with the slow
    worker having run a few elements, and every element ran exactly once."""
    n = 300
    cluster = _local_cluster(n_workers=3)
    try:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(3, timeout=60)
            slow = sorted(client.scheduler_info()["workers"])[0]
            fs = client.map(slow_on, range(n), slow=slow, directory=str(tmp_path),
                            fast_delay=0.005, pure=False)
            assert _is_bulk(client, fs)
            results = client.gather(fs, timeout=150)
            assert [x for x, _ in results] == list(range(n))
            on_slow = sum(1 for _, w in results if w == slow)
            assert 1 <= on_slow <= 12, on_slow
            calls = {int(name): len(open(tmp_path / name).read())
                     for name in os.listdir(tmp_path)}
            assert calls == dict.fromkeys(range(n), 1)
    finally:
        cluster.close()


def spin(x, slow_below):
    """Spins 20 ms of CPU for ``x < slow_below``, else 1 ms; returns (x, the worker's
    pid, the wall-clock start and stop)."""
    start = time.time()
    end = time.thread_time() + (0.02 if x < slow_below else 0.001)
    while time.thread_time() < end:
        pass
    return x, os.getpid(), start, time.time()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wanted", [False, True], ids=["elements", "published"])
def test_both_workers_run_until_near_the_end_of_an_uneven_map(c, road, wanted):
    """400 calls on two one-thread workers, the first hundred 20 times as long as the
    rest (2.3 s of CPU in all); ``published``: a dataset holds their futures, which makes
    each element a task of its own, as an array job's are. Handed out in ranges that
    shrink as the map drains, and stolen back from a worker still holding some once the
    other runs dry, the work ends on both workers at about the same time: the gap
    between their last stops is a small part of the run (a whole map handed out at once
    would leave one worker running the slow hundred long after the other stopped)."""
    n = 400
    fs = road.calls(c, spin, n, slow_below=n // 4)
    if wanted:
        c.publish_dataset(uneven_map=fs)
    try:
        results = c.gather(fs, timeout=100)
    finally:
        if wanted:
            c.unpublish_dataset("uneven_map")
    assert [x for x, *_ in results] == list(range(n))
    last: dict[int, float] = {}
    for _, pid, _, stop in results:
        last[pid] = max(last.get(pid, 0.0), stop)
    assert len(last) == 2, last
    span = max(last.values()) - min(start for *_, start, _ in results)
    gap = max(last.values()) - min(last.values())
    assert gap < span / 3, (gap, span)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("wanted", [False, True], ids=["elements", "published"])
def test_a_worker_retired_mid_map_hands_back_its_elements_and_its_results(tmp_path, wanted):
    """A worker retired while it runs a map gives back the elements it has not started and
    its results move to the other worker: every element runs exactly once, and every
    result is there after the worker left. ``published``: a dataset holds the futures,
    which makes each element a task run in the ranges (as an array job's are): those the
    worker has not started go back too, and those it runs end there first."""
    n = 200
    cluster = _local_cluster(n_workers=2)
    try:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            fs = client.map(tagged, range(n), directory=str(tmp_path), delay=0.02,
                            pure=False)
            assert _is_bulk(client, fs)
            if wanted:
                client.publish_dataset(retired_mid_map=fs)
            done = _until_both_workers_ran_some(fs)
            workers = client.scheduler_info()["workers"]
            (leaving,) = [a for a, info in workers.items() if info["pid"] == max(done.values())]
            if wanted:  # the worker retires with tasks in its ranges
                assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.state
                                               .bulk.promotions.unstarted(
                                                   dask_scheduler.state.workers[leaving]))
            assert client.retire_workers([leaving], timeout=120) == [leaving]
            assert leaving not in client.scheduler_info()["workers"]
            results = client.gather(fs, timeout=120)
            assert [x for x, _ in results] == list(range(n))
            calls = {int(name): len(open(tmp_path / name).read())
                     for name in os.listdir(tmp_path)}
            assert calls == dict.fromkeys(range(n), 1)
    finally:
        cluster.close()


@pytest.mark.timeout(120)
def test_retiring_a_worker_moves_the_results_of_a_finished_map(tmp_path):
    """Two workers hold the results of a map of 500 elements; the one holding more retires:
    its results move to the other (no element runs twice), and the workers' descriptions
    count the elements' results as they count tasks'. All are gathered at once after."""
    n = 500
    cluster = _local_cluster(n_workers=2)
    try:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            fs = client.map(tagged, range(n), directory=str(tmp_path), delay=0.002,
                            pure=False)
            assert _is_bulk(client, fs)
            results = client.gather(fs, timeout=60)
            by_pid: dict[int, int] = {}
            for _, pid in results:
                by_pid[pid] = by_pid.get(pid, 0) + 1
            assert len(by_pid) == 2, by_pid  # both workers ran some
            workers = client.scheduler_info()["workers"]
            assert {info["n_keys"] for info in workers.values()} == set(by_pid.values())
            assert all(info["nbytes"] > 0 for info in workers.values())
            leaving = max(workers, key=lambda a: workers[a]["n_keys"])
            assert client.retire_workers([leaving], timeout=60) == [leaving]
            assert client.gather(fs, timeout=30) == results
            calls = {int(name): len(open(tmp_path / name).read())
                     for name in os.listdir(tmp_path)}
            assert calls == dict.fromkeys(range(n), 1)
            left = client.scheduler_info()["workers"]
            assert leaving not in left
            assert sum(info["n_keys"] for info in left.values()) == n
    finally:
        cluster.close()


_held: list = []  # memory an element keeps in its worker process (unmanaged: no result)


def hold_first(x, release, directory, nbytes):
    """Counts its calls per element in ``directory``; element 0 takes ``nbytes`` of process
    memory its worker cannot spill until the file ``release`` exists."""
    import numpy as np

    with open(os.path.join(directory, str(x)), "a") as f:
        f.write("x")
    if x == 0:
        _held.append(np.ones(nbytes // 8))
        deadline = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        _held.clear()
    time.sleep(0.01)
    return x


@pytest.mark.timeout(180)
def test_a_paused_worker_gives_back_the_elements_it_has_not_started(tmp_path):
    """Element 0 holds its worker past the memory pause fraction until the test lets it
    go; the elements queued behind it on that worker are given back and run on the other
    one (work stealing off: only the pause moves them), each exactly once."""
    from hpcsched.core import config

    n, mb = 100, 1_000_000
    release = tmp_path / "release"
    calls = tmp_path / "calls"
    calls.mkdir()
    with config.set({"scheduler.work-stealing": False}):
        cluster = _local_cluster(n_workers=2, memory_limit=400 * mb, worker_env={
            **worker_env(), "HPCSCHED_WORKER__MEMORY__TERMINATE": "false"})
    try:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            fs = client.map(hold_first, range(n), release=str(release),
                            directory=str(calls), nbytes=360 * mb, pure=False)
            assert _is_bulk(client, fs)
            assert client.gather(fs[1:], timeout=90) == list(range(1, n))
            assert "paused" in {w["status"] for w in client.scheduler_info()["workers"].values()}
            assert not fs[0].done()
            release.write_text("go")
            assert fs[0].result(timeout=60) == 0
            counted = {int(name): len(open(calls / name).read()) for name in os.listdir(calls)}
            assert counted == dict.fromkeys(range(n), 1)
    finally:
        cluster.close()


def timed(x, delay):
    """(x, when it started, when it ended), after ``delay`` seconds."""
    start = time.time()
    time.sleep(delay)
    return x, start, time.time()


def via_worker_client(x):
    """Submits ``inc(x)`` from inside the element and waits for it (worker_client
    secedes meanwhile)."""
    from hpcsched import worker_client

    with worker_client() as c:
        return c.submit(inc, x).result(timeout=60)


@pytest.mark.timeout(120)
def test_elements_and_tasks_share_a_one_thread_workers_slot():
    """On one worker with one thread, a task submitted while a map runs never runs at the
    same time as an element of the map: both hold the worker's one thread slot."""
    cluster = _local_cluster(n_workers=1)
    try:
        with Client(cluster, set_as_default=False) as client:
            fs = client.map(timed, range(N), delay=0.01, pure=False)
            assert _is_bulk(client, fs)
            wait_until(lambda: any(f.done() for f in fs), timeout=60)
            task = client.submit(timed, -1, 0.3, pure=False)
            _, t0, t1 = task.result(timeout=60)
            elements = client.gather(fs, timeout=60)
            assert [x for x, _, _ in elements] == list(range(N))
            overlapping = [x for x, s, e in elements if s < t1 and e > t0]
            assert overlapping == [], (overlapping, t0, t1)
    finally:
        cluster.close()


@pytest.mark.timeout(120)
def test_elements_that_wait_for_tasks_through_worker_client_give_their_slot_up():
    """Elements on a one-thread worker that submit a task with ``worker_client()`` and
    wait for it: the element secedes, and the task it waits for gets the slot."""
    cluster = _local_cluster(n_workers=1)
    try:
        with Client(cluster, set_as_default=False) as client:
            fs = client.map(via_worker_client, range(N))
            assert _is_bulk(client, fs)
            assert client.gather(fs, timeout=90) == [x + 1 for x in range(N)]
            assert client.submit(inc, 41).result(timeout=60) == 42
    finally:
        cluster.close()
