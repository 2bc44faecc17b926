"""Bulk maps in the scheduler state (hpcsched.core.state.bulk): stories of events, then
random ones (the story of tests/core/state/stories.py with maps and ranges added).

A map ``m-a-`` of n elements has the keys ``m-a-0`` .. ``m-a-{n-1}``; its run specs are
opaque bytes. ``validate()`` runs after every step.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from operator import itemgetter
from typing import Any
from unittest.mock import patch

import hypothesis.strategies as st
import pytest
from hypothesis.stateful import initialize, rule

import hpcsched.core.state.bulk.book as book_module
import hpcsched.core.state.bulk.elements as elements_module
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.state import events as ev
from hpcsched.core.state.bulk import MAX_RANGE
from hpcsched.core.state.bulk.elements import PROCESSING
from hpcsched.core.state.events import Send
from hpcsched.core.state.policies import FIRST_WAVE_WORKERS
from hpcsched.core.state.scheduler_state import SchedulerState
from tests.core.state.harness import step
from tests.core.state.stories import WORKERS, SchedulerStory

A, B = "tcp://a", "tcp://b"


def ranges(out: list[Send]) -> list[tuple[str, list[int]]]:
    return [(m.to, list(m.msg.indices)) for m in out if m.msg.op == "compute-range"]


def new_map(s: SchedulerState, n: int, prefix: str = "m-a-", client: str = "c",
            **kw: Any) -> list[Send]:
    if client not in s.clients:
        step(s, ev.AddClient(client))
    return step(s, ev.UpdateMap(client, prefix=prefix, function=b"f",
                                args=[b"a%d" % i for i in range(n)], **kw))


def map_on_a_and_b(s: SchedulerState, n: int = 40) -> tuple[list[Send], list[int]]:
    """Workers A and B (a thread each) join ``s`` and a map of ``n`` elements is
    submitted: (what was sent, the elements given to A)."""
    step(s, ev.AddWorker(A, 1))
    step(s, ev.AddWorker(B, 1))
    out = new_map(s, n)
    return out, [i for w, idx in ranges(out) if w == A for i in idx]


def map_finished_on_a_and_b(s: SchedulerState, n: int) -> dict[str, set[int]]:
    """:func:`map_on_a_and_b` of ``n`` elements, every range given run to its end: the
    elements each worker ran (and holds), by worker."""
    out, _ = map_on_a_and_b(s, n)
    every = list(out)
    for w in (A, B):
        every += finish_ranges(s, w, out)[1]
    return {w: {i for m in every if m.to == w and m.msg.op == "compute-range"
                for i in m.msg.indices} for w in (A, B)}


def finish(s: SchedulerState, worker: str, indices: list[int], prefix: str = "m-a-",
           nbytes: int = 8, seconds: float = 0.5) -> list[Send]:
    n = len(indices)
    return step(s, ev.RangeFinished(worker, prefix=prefix, indices=indices,
                                    nbytes=[nbytes] * n, types=["int"] * n,
                                    starts=[1.0] * n, stops=[1.0 + seconds] * n))


def finish_ranges(s: SchedulerState, worker: str, out: list[Send], nbytes: int = 8
                  ) -> tuple[list[int], list[Send]]:
    """Finish every range given to ``worker`` until none is left: (the indices reported to
    the client, every command sent meanwhile)."""
    reported: list[int] = []
    every = list(out)
    while True:
        given = [i for w, idx in ranges(out) if w == worker for i in idx]
        if not given:
            return reported, every
        out = finish(s, worker, given, nbytes=nbytes)
        every += out
        reported += [i for m in out if m.msg.op == "map-in-memory" for i in m.msg.indices]


def test_a_map_is_given_in_ranges_and_reported_in_batches():
    """Two workers of one thread: the map is cut into ranges (guided self-scheduling), each
    worker holds at most two ranges' worth, and finished elements reach the client in one
    map-in-memory per report; no task exists for any element."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    step(s, ev.AddWorker(B, 1))
    out = new_map(s, 100)
    given = ranges(out)
    assert {w for w, _ in given} == {A, B}
    first = given[0][1]
    assert first == list(range(len(first))) and len(first) == 100 // 8  # 100 / (2 x 4)
    assert not s.tasks
    a_indices = [i for w, idx in given if w == A for i in idx]
    out = finish(s, A, a_indices)
    (report,) = [m for m in out if m.msg.op == "map-in-memory"]
    assert report.to == "c" and report.msg.indices == a_indices
    assert ranges(out) and all(w == A for w, _ in ranges(out))  # A was topped up
    assert s.task_counts()["memory"] == len(a_indices)
    assert s.who_has(["m-a-0"]) == {"m-a-0": [A]}
    assert not s.tasks  # answering who_has made no task either


def test_the_whole_map_completes_and_released_elements_are_freed():
    s = SchedulerState()
    step(s, ev.AddWorker(A, 2))
    out = new_map(s, 50)
    done: list[int] = []
    while True:
        given = [i for _, idx in ranges(out) for i in idx]
        if not given:
            break
        done += given
        out = finish(s, A, given)
    assert sorted(done) == list(range(50))
    out = step(s, ev.ClientReleasesKeys("c", [f"m-a-{i}" for i in range(50)]))
    freed = [k for m in out if m.msg.op == "free-keys" for k in m.msg.keys]
    assert sorted(freed) == sorted(f"m-a-{i}" for i in range(50))
    assert not s.bulk.maps and not s.tasks


@pytest.mark.timeout(30)
def test_one_release_sorts_elements_tasks_and_keys_that_name_no_element():
    """One client-releases-keys of a whole map's worth of keys is handled in one pass:
    its elements in memory are freed on their worker, those running are forgotten when
    reported, a promoted element is released as the task it is, another client's element
    is left alone, and keys that only look like elements ("m-a-07", "m-a-²", past
    the end) name none (they reach the task release, which ignores them)."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    out = new_map(s, 10)
    new_map(s, 4, prefix="m-b-", client="d")
    given = [i for _, idx in ranges(out) for i in idx if _ == A]
    assert given[:4] == [0, 1, 2, 3]
    step(s, ev.TaskErred(A, "m-a-3", exception="boom", exception_text="boom"))
    assert s.tasks["m-a-3"].state == "erred"  # promoted: a task of its own
    finish(s, A, [0, 1])
    assert s.holders_of(["m-a-0", "m-a-07", "m-a-2", "m-a-3", "x-1"]) == \
        ({A: ["m-a-0"]}, ["m-a-2", "m-a-07", "x-1", "m-a-3"])  # the erred task: nowhere
    out = step(s, ev.ClientReleasesKeys("c", [
        "m-a-0", "m-a-07", "m-a-²", "m-a-99", "m-a-", "m-a-3", "m-b-1", "x-1",
        "m-a-2", "m-a-1", "m-a-9"]))
    freed = [k for m in out if m.msg.op == "free-keys" and m.to == A for k in m.msg.keys]
    assert sorted(freed) == ["m-a-0", "m-a-1"]
    assert "m-a-3" not in s.tasks  # released as a task: forgotten
    assert s.holders_of(["m-a-0", "m-a-1"]) == ({}, ["m-a-0", "m-a-1"])  # gone
    m_b = s.bulk.maps["m-b-"]
    assert m_b.n_live == 4  # another client's: untouched
    out = finish(s, A, [2])  # forgotten while it ran on A: freed once reported
    assert [k for m in out if m.msg.op == "free-keys" for k in m.msg.keys] == \
        ["m-a-2"]
    assert not [m for m in out if m.msg.op == "map-in-memory"]


def test_small_results_are_those_in_memory_that_fit_in_order():
    """What a gather may carry along unasked (``Gather.extra``): elements and tasks in
    memory whose result weighs at most ``each`` bytes, in the order asked, while they
    add up to at most ``budget``; a running element, a promoted one that erred, an
    unknown key and a large result are passed over."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    new_map(s, 10)
    step(s, ev.TaskErred(A, "m-a-3", exception="boom", exception_text="boom"))  # promoted
    finish(s, A, [0, 1, 2], nbytes=100)
    finish(s, A, [4], nbytes=5000)  # large
    finish(s, A, [5, 6], nbytes=100)
    asked = [f"m-a-{i}" for i in (6, 0, 1, 2, 3, 4, 5, 7)] + ["x-1"]

    assert s.small_results(asked, budget=10_000, each=1000) == \
        ["m-a-6", "m-a-0", "m-a-1", "m-a-2", "m-a-5"]
    assert s.small_results(asked, budget=250, each=1000) == ["m-a-6", "m-a-0"]
    assert s.small_results(asked, budget=10_000, each=99) == []


def test_small_results_of_a_run_of_elements_in_memory():
    """The rest of a map asked along in order (a run, looked at with no call per key):
    all of them when they fit, else those that fit in order; a large one passed over."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    out = new_map(s, 100)
    while given := [i for w, idx in ranges(out) if w == A for i in idx]:  # all run on A
        out = finish(s, A, [i for i in given if i != 7], nbytes=100)
        if 7 in given:
            out += finish(s, A, [7], nbytes=5000)  # large
    run = [f"m-a-{i}" for i in range(1, 100)]
    small = [k for k in run if k != "m-a-7"]

    assert s.small_results(run, budget=100_000, each=5000) == run
    assert s.small_results(run, budget=100_000, each=1000) == small
    assert s.small_results(run, budget=250, each=1000) == run[:2]
    assert s.small_results(run[::-1], budget=250, each=1000) == run[::-1][:2]
    assert s.small_results(run, budget=100_000, each=99) == []


@pytest.mark.timeout(30)
def test_a_run_of_elements_is_gathered_and_released_as_a_run():
    """A gather's part and a dropped list of futures name a run of one map's elements
    (ascending; a list drops its items last first: descending). Such a run is answered
    from the map's arrays at once: each worker is asked for, or told to free, exactly
    the elements it holds; a run with one element not in memory is looked at key by key
    (that element is missing, or forgotten until its worker reports it)."""
    s = SchedulerState()
    on = map_finished_on_a_and_b(s, 200)
    assert on[A] and on[B] and on[A] | on[B] == set(range(200))
    keys = [f"m-a-{i}" for i in range(200)]
    held, missing = s.holders_of(keys[10:150])
    assert not missing and set(held) == {A, B}
    assert {w: set(k) for w, k in held.items()} == \
        {w: {f"m-a-{i}" for i in on[w] if 10 <= i < 150} for w in (A, B)}
    assert s.holders_of(keys[10:150][::-1]) == (held, [])  # descending: the same answer
    # element 120 becomes a task (it is lost on its worker and runs again)
    where = A if 120 in on[A] else B
    step(s, ev.MissingData("c", "m-a-120", where))
    assert s.holders_of(keys[100:140])[1] == ["m-a-120"]
    out = step(s, ev.ClientReleasesKeys("c", keys[:100][::-1]))
    freed = {w: {k for m in out if m.to == w and m.msg.op == "free-keys" for k in m.msg.keys}
             for w in (A, B)}
    assert freed == {w: {f"m-a-{i}" for i in on[w] if i < 100} for w in (A, B)}
    out = step(s, ev.ClientReleasesKeys("c", keys[100:][::-1]))
    freed = {k for m in out if m.msg.op == "free-keys" for k in m.msg.keys}
    assert freed >= {f"m-a-{i}" for i in range(100, 200) if i != 120}
    assert not s.bulk.maps or s.bulk.maps["m-a-"].n_live == 0


@pytest.mark.timeout(30)
def test_elements_in_the_order_they_finished_are_gathered_and_released():
    """What ``as_completed`` asks for and drops names a map's elements in the order they
    finished, interleaved between workers: no run, yet one map. Each worker is asked
    for, or told to free, exactly the elements it holds, in the order asked, and the
    counts follow."""
    s = SchedulerState()
    on = map_finished_on_a_and_b(s, 200)
    order = [i for pair in zip(sorted(on[A]), sorted(on[B]), strict=False) for i in pair]
    order += sorted((on[A] | on[B]) - set(order))  # interleaved, the longer one's tail last
    assert sorted(order) == list(range(200))
    keys = [f"m-a-{i}" for i in order]

    held, missing = s.holders_of(keys[:150])
    assert s.small_results(keys[:20], budget=10_000, each=100) == keys[:20]
    out = step(s, ev.ClientReleasesKeys("c", keys[:150]))
    assert not missing
    assert {w: set(k) for w, k in held.items()} == \
        {w: {f"m-a-{i}" for i in on[w] if i in order[:150]} for w in (A, B)}
    freed = {w: [k for m in out if m.to == w and m.msg.op == "free-keys" for k in m.msg.keys]
             for w in (A, B)}
    assert freed == held  # each worker's in the order asked, once
    assert s.bulk.maps["m-a-"].n_live == 50
    assert s.workers[A].n_elements + s.workers[B].n_elements == 50
    out = step(s, ev.ClientReleasesKeys("c", keys[150:]))
    assert sorted(k for m in out if m.msg.op == "free-keys" for k in m.msg.keys) == \
        sorted(keys[150:])
    assert not s.bulk.maps


@pytest.mark.timeout(30)
@pytest.mark.parametrize("odd", ["m-a-07", "m-a- 7", "m-a-+7", "m-a-٧", "m-a-1_0", "m-a-500",
                                 "m-a--7", "m-a-40", b"m-a-7", 7, None, "x-1", "m-a-7x"])
def test_an_odd_key_among_a_maps_names_no_element_and_changes_nothing_else(odd):
    """A key that is not exactly one of the map's (a sign, a space, leading zeros, another
    digit set, past the end, not a str, of no map) names no element: nothing held
    (a repeated key is answered twice and freed once), and the other keys, out of order,
    are answered and released as they would be."""
    s = SchedulerState()
    out, _ = map_on_a_and_b(s, 200)
    for w in (A, B):
        finish_ranges(s, w, out)
    keys = [f"m-a-{i}" for i in range(40, 0, -3)] + [odd] + \
        [f"m-a-{i}" for i in range(100, 60, -2)]
    named = [k for k in keys if k is not odd]
    held, missing = s.holders_of(keys)
    assert missing == ([] if odd == "m-a-40" else [odd])  # names nothing held anywhere
    assert sorted(k for ks in held.values() for k in ks) == \
        sorted(named + ([odd] if odd == "m-a-40" else []))
    out = step(s, ev.ClientReleasesKeys("c", keys))
    assert sorted(k for m in out if m.msg.op == "free-keys" for k in m.msg.keys) == \
        sorted(named)
    assert s.bulk.maps["m-a-"].n_live == 200 - len(named)


def test_a_failing_element_becomes_a_task_and_is_retried_alone():
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    out = new_map(s, 10, retries=1)
    given = [i for _, idx in ranges(out) for i in idx]
    assert 3 in given
    out = step(s, ev.TaskErred(A, "m-a-3", exception="boom", exception_text="boom"))
    ts = s.tasks["m-a-3"]
    assert ts.state == "processing" and ts.retries == 0  # retried: sent as a task
    (compute,) = [m for m in out if m.msg.op == "compute-task"]
    assert compute.msg.run_spec == RunSpec(b"f", b"a3")
    out = step(s, ev.TaskErred(A, "m-a-3", exception="boom", exception_text="boom"))
    (erred,) = [m for m in out if m.msg.op == "task-erred"]
    assert erred.to == "c" and erred.msg.key == "m-a-3"
    # the other elements are unaffected; the failed one's range report is ignored for it
    out = finish(s, A, [i for i in given if i != 3])
    (report,) = [m for m in out if m.msg.op == "map-in-memory"]
    assert 3 not in report.msg.indices
    assert s.tasks["m-a-3"].state == "erred"


def test_a_worker_whose_elements_all_fail_is_given_the_rest():
    """A's elements all raise: a worker reports them with a task-erred each and no
    range-finished. What it runs for the map drops to nothing, and it is topped up from
    the queue (it waited idle, the rest of the map queued, for ever)."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    out = new_map(s, 3)
    given = [i for _, idx in ranges(out) for i in idx]
    assert given and len(given) < 3
    out = []
    for i in given:
        out += step(s, ev.TaskErred(A, f"m-a-{i}", exception="boom", exception_text="boom"))
    assert sorted(given + [i for _, idx in ranges(out) for i in idx]) == [0, 1, 2]


def test_elements_released_while_they_run_that_raise_are_reported():
    """The client drops a map's futures while A runs its elements, which then raise (a
    task-erred each, no range-finished): their reports are due no more, and A runs the
    next map (it counted them still, and was too full for any range, for ever)."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    out = new_map(s, 2)
    given = [i for _, idx in ranges(out) for i in idx]
    assert given == [0, 1]
    step(s, ev.ClientReleasesKeys("c", ["m-a-0", "m-a-1"]))
    for i in given:
        step(s, ev.TaskErred(A, f"m-a-{i}", exception="boom", exception_text="boom"))
    assert not s.bulk.maps and not s.bulk.outstanding.get(A)
    out = new_map(s, 2, prefix="m-b-")
    assert [i for _, idx in ranges(out) for i in idx] == [0, 1]


def test_a_failed_element_released_is_forgotten_as_a_task():
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    new_map(s, 4)
    step(s, ev.TaskErred(A, "m-a-0", exception="boom", exception_text="boom"))
    assert s.tasks["m-a-0"].state == "erred"
    step(s, ev.ClientReleasesKeys("c", ["m-a-0", "m-a-1"]))
    assert "m-a-0" not in s.tasks
    assert s.bulk.maps["m-a-"].state[1] == 4  # forgotten in the map


def test_an_element_is_the_dependency_of_a_later_task():
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    first = new_map(s, 4)
    out = step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": ["m-a-1"]}}, ["z"]))
    assert s.tasks["z"].state == "waiting" and s.tasks["m-a-1"].state == "processing"
    assert not [m for m in out if m.msg.op == "compute-task"]
    out = finish(s, A, [1])  # a range holding a promoted element reports it as well
    (compute,) = [m for m in out if m.msg.op == "compute-task"]
    assert compute.msg.key == "z" and compute.msg.who_has == {"m-a-1": [A]}
    assert any(m.msg.op == "key-in-memory" and m.msg.key == "m-a-1" for m in out)
    assert not [m for m in out if m.msg.op == "map-in-memory"]
    reported, _ = finish_ranges(s, A, first + out)
    assert sorted(reported) == [0, 2, 3]


def test_a_queued_element_depended_on_waits_for_its_range():
    """No worker yet: the element depended on becomes a task that waits in the map's
    queue; the worker that joins gets it in a range with its neighbours, and the
    dependent runs where it is."""
    s = SchedulerState()
    new_map(s, 4)
    step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": ["m-a-2"]}}, ["z"]))
    assert s.tasks["m-a-2"].state == "waiting"
    out = step(s, ev.AddWorker(A, 1))
    reported, every = finish_ranges(s, A, out)
    assert 2 in [i for _, idx in ranges(every) for i in idx]
    assert sorted(reported) == [0, 1, 3]  # m-a-2 is reported as a task
    (compute,) = [m for m in every if m.msg.op == "compute-task"]
    assert compute.msg.key == "z" and compute.msg.who_has == {"m-a-2": [A]}
    assert not s.bulk.maps["m-a-"].held and not s.graph.held


def test_neighbours_depended_on_run_in_one_range_and_their_dependent_moves_nothing():
    """A reduction submitted while its map is queued: each pair of neighbouring elements
    runs in one range, so each addition finds both inputs on its worker."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    step(s, ev.AddWorker(B, 1))
    step(s, ev.AddClient("c"))
    out = step(s, ev.UpdateGraph("c", {"x": {"run_spec": "x", "deps": []}}, ["x"]))
    # A and B are busy: the map and the additions over it are queued
    out += new_map(s, 40)
    adds = {f"add-{i}": {"run_spec": "add", "deps": [f"m-a-{i}", f"m-a-{i + 1}"]}
            for i in range(0, 40, 2)}
    out += step(s, ev.UpdateGraph("c", adds, list(adds)))
    assert all(s.tasks[f"m-a-{i}"].state in ("waiting", "processing") for i in range(40))
    queues = {A: [], B: []}
    moved = computed = cuts = 0
    while True:
        for m in out:
            if m.msg.op == "compute-range":
                queues[m.to].append(list(m.msg.indices))
                cuts += 1
            elif m.msg.op == "compute-task":
                computed += 1
                moved += sum(m.to not in holders for holders in m.msg.who_has.values())
                queues[m.to].append(m.msg.key)
        busy = [w for w in (A, B) if queues[w]]
        if not busy:
            break
        out = []
        for w in busy:
            item = queues[w].pop(0)
            if isinstance(item, list):
                out += finish(s, w, item, seconds=1e-3)
            else:
                out += step(s, ev.TaskFinished(w, item, nbytes=28, typename="int",
                                               start=1.0, stop=1.001))
    assert computed == 21  # x and the twenty additions: no element ran as a task
    # only a pair that two ranges cut apart moves one input (as elements run alone as
    # tasks, about half the additions would)
    assert moved < cuts <= 10, (moved, cuts)
    assert all(s.tasks[k].state == "memory" for k in adds)


def test_a_held_element_whose_dependent_is_dropped_is_not_run():
    """The dependent of a queued element is released before any worker comes: the
    element's task is forgotten, and the map still runs (and reports) the others."""
    s = SchedulerState()
    new_map(s, 4)
    step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": ["m-a-2"]}}, ["z"]))
    step(s, ev.ClientReleasesKeys("c", ["z", "m-a-2"]))
    assert "m-a-2" not in s.tasks and "z" not in s.tasks
    out = step(s, ev.AddWorker(A, 1))
    reported, every = finish_ranges(s, A, out)
    assert sorted(i for _, idx in ranges(every) for i in idx) == [0, 1, 3]
    assert sorted(reported) == [0, 1, 3]
    step(s, ev.ClientReleasesKeys("c", ["m-a-0", "m-a-1", "m-a-3"]))
    assert not s.bulk.maps and not s.graph.held


def test_held_elements_of_a_client_that_leaves_are_forgotten():
    s = SchedulerState()
    new_map(s, 4)
    step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": ["m-a-2"]}}, ["z"]))
    step(s, ev.RemoveClient("c"))
    assert not s.bulk.maps and not s.tasks and not s.graph.held
    out = step(s, ev.AddWorker(A, 1))
    assert not ranges(out) and not [m for m in out if m.msg.op == "compute-task"]


def test_a_paused_worker_gives_back_the_held_elements_of_its_ranges():
    """Every element of a map is depended on: A's ranges hold only held tasks (none counts
    in what A runs for the map, and the map, all its elements tasks, is gone). A pauses:
    it gives those back too, and they run elsewhere as tasks."""
    s = SchedulerState()
    new_map(s, 2)
    step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": ["m-a-0", "m-a-1"]}}, ["z"]))
    out = step(s, ev.AddWorker(A, 1))
    assert sorted(i for _, idx in ranges(out) for i in idx) == [0, 1]
    assert not s.bulk.maps
    out = step(s, ev.WorkerStatusChange(A, "paused"))
    (ask,) = [m for m in out if m.msg.op == "release-range" and m.to == A]
    assert ask.msg.count >= 2
    step(s, ev.RangeReleased(A, released={"m-a-": [1, 0]}))
    assert all(s.tasks[k].processing_on is None for k in ("m-a-0", "m-a-1"))
    out = step(s, ev.AddWorker(B, 1))
    computed = [m.msg.key for m in out if m.msg.op == "compute-task" and m.to == B]
    assert sorted(computed) == ["m-a-0", "m-a-1"]
    for k in computed:
        out = step(s, ev.TaskFinished(B, k, nbytes=8, typename="int", start=1.0, stop=1.1))
    (compute,) = [m for m in out if m.msg.op == "compute-task"]
    assert compute.msg.key == "z"


def test_a_held_element_given_back_after_its_map_is_gone_runs_as_a_task():
    """A runs an element of m-b- (given first) while a range of m-a-'s one element, held
    for z, waits behind it; m-a- is gone (its only element is a task). A pauses and gives
    back what it has not started: the held element, whose map is gone. It is placed
    again, not left processing on A, which will never run it."""
    s = SchedulerState()
    step(s, ev.AddWorker(B, 1))
    new_map(s, 1, prefix="m-a-")
    step(s, ev.AddWorker(A, 1))
    out = new_map(s, 4, prefix="m-b-")
    on_a = sorted(i for w, idx in ranges(out) if w == A for i in idx)
    step(s, ev.RemoveWorker(B, "gone"))  # m-a-0 (and what B had of m-b-) queued again
    step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": ["m-a-0"]}}, ["z"]))
    assert s.tasks["m-a-0"].state == "waiting"
    out = finish(s, A, on_a[:1], prefix="m-b-")
    assert ("m-a-", [0]) in [(m.msg.prefix, list(m.msg.indices)) for m in out
                             if m.msg.op == "compute-range"]
    assert "m-a-" not in s.bulk.maps
    out = step(s, ev.WorkerStatusChange(A, "paused"))
    assert [m.msg.count for m in out if m.msg.op == "release-range"] == [2]
    # m-b-'s element has started: A gives back the one behind it
    step(s, ev.RangeReleased(A, released={"m-a-": [0]}))
    assert s.tasks["m-a-0"].processing_on is None
    out = step(s, ev.WorkerStatusChange(A, "running"))
    assert [m.msg.key for m in out if m.msg.op == "compute-task"] == ["m-a-0"]


def test_a_held_element_in_a_range_is_not_blamed_for_its_workers_death_as_a_started_task():
    """m-a-1, held for z, is given to A in a range behind m-a-0, which kills A before
    m-a-1 starts. The range's elements count the death (m-a-0 becomes a suspect, to run
    alone); m-a-1 counts it as they do, not as a task said started: with
    allowed_failures=1 it would otherwise err with KilledWorker, never having run."""
    s = SchedulerState(allowed_failures=1)
    new_map(s, 8)
    step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": ["m-a-1"]}}, ["z"]))
    out = step(s, ev.AddWorker(A, 1))
    assert ranges(out) == [(A, [0, 1])]
    step(s, ev.AddWorker(B, 1))
    out = step(s, ev.RemoveWorker(A, "killed"))
    assert not [m for m in out if m.msg.op == "task-erred"]
    held = s.tasks["m-a-1"]
    assert held.state == "processing" and held.suspicious == 0
    assert s.tasks["m-a-0"].suspicious == 1  # the range's element: a suspect, run alone


def test_cancel_of_one_element():
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    first = new_map(s, 4)
    assert [0, 1] == [i for _, idx in ranges(first) for i in idx]
    out = step(s, ev.CancelKeys("c", ["m-a-1"]))  # running on A
    assert any(m.msg.op == "cancelled-keys" and m.msg.keys == ["m-a-1"] for m in out)
    out = step(s, ev.CancelKeys("c", ["m-a-2"]))  # still queued
    assert any(m.msg.op == "cancelled-keys" and m.msg.keys == ["m-a-2"] for m in out)
    assert "m-a-2" not in s.tasks and "m-a-1" not in s.tasks
    reported, every = finish_ranges(s, A, first)
    assert sorted(reported) == [0, 3]
    assert any(m.msg.op == "free-keys" and "m-a-1" in m.msg.keys for m in every)
    assert not s.bulk.maps["m-a-"].free


def test_a_worker_that_dies_mid_range_loses_only_its_unfinished_elements():
    s = SchedulerState()
    out, on_a = map_on_a_and_b(s)
    half = on_a[: len(on_a) // 2]
    finish(s, A, half)
    out = step(s, ev.RemoveWorker(A, "killed"))
    lost = sorted(m.msg.key for m in out if m.msg.op == "lost-data")
    assert lost == sorted(f"m-a-{i}" for i in half)  # only A held them
    assert all(w == B for w, _ in ranges(out))
    m = s.bulk.maps["m-a-"]
    b_slot = s.bulk.slots[B]
    for i in on_a:  # queued again, or given to B at once
        assert m.state[i] == 0 or (m.state[i] == 1 and m.where[i] == b_slot), i


def test_a_worker_dropped_past_its_ttl_hands_its_elements_to_the_idle_workers():
    """B is cut off the network: it reported a few elements, then nothing, not even the
    answer to a steal (release-range). A ran everything else and is idle, its heartbeats
    arriving. The tick past ``worker_ttl`` that drops B sends its elements -- those it
    held results of (lost) and those it had not finished -- to A at once, in that tick:
    no later event is due that would. Every element is then reported once, on A."""
    s = SchedulerState(worker_ttl=10.0)
    step(s, ev.AddWorker(A, 1, now=0.0))
    step(s, ev.AddWorker(B, 1, now=0.0))
    out = new_map(s, 100)
    on_b = [i for w, idx in ranges(out) if w == B for i in idx]
    finish(s, B, on_b[:3])
    reported = drain(s, [m for m in out if m.to == A])
    assert not s.bulk.pending and A in s.bulk.hungry and s.bulk.outstanding[B] > 1
    assert released(step(s, ev.Tick(now=5.0))) == [(B, (len(on_b) - 3) // 2)]
    step(s, ev.Heartbeat(A, now=12.0))
    out = step(s, ev.Tick(now=12.0))
    assert B not in s.workers
    assert sorted(m.msg.key for m in out if m.msg.op == "lost-data") == \
        sorted(f"m-a-{i}" for i in on_b[:3])
    to_a = [i for w, idx in ranges(out) if w == A for i in idx]
    assert to_a and set(to_a) <= set(on_b)  # B's elements, given to A in the same tick
    reported += drain(s, out)
    assert sorted(reported) == list(range(100))
    assert s.task_counts() == {"memory": 100}
    assert not s.tasks  # lost and run again as elements: no task was made


def test_malformed_blocks_are_refused_without_change():
    s = SchedulerState()
    step(s, ev.AddClient("c"))
    with pytest.raises(ev.MalformedMessage):
        s.handle(ev.UpdateMap("c", prefix="m-a-", function=b"f", args=[b"x"], offset=3))
    with pytest.raises(ev.MalformedMessage):
        s.handle(ev.UpdateMap("c", prefix="no-dash", function=b"f", args=[b"x"]))
    assert not s.bulk.maps
    new_map(s, 2)
    with pytest.raises(ev.MalformedMessage):
        s.handle(ev.UpdateMap("c", prefix="m-a-", function=b"f", args=[b"x"], offset=5))
    step(s, ev.AddWorker(A, 1))
    with pytest.raises(ev.MalformedMessage):
        s.handle(ev.RangeFinished(A, prefix="m-a-", indices=[0, 1], nbytes=[1], types=[],
                                  starts=[], stops=[]))
    s.validate()


def test_a_late_report_from_a_worker_that_came_back_changes_no_count():
    """A's elements are forgotten (their client left) while it runs them; A leaves and
    comes back as a new worker, given nothing yet; its report of an element from before
    is a stray: the result is freed, no counter moves."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    step(s, ev.AddWorker(B, 1))
    out = new_map(s, 4)
    assert not s.bulk.pending
    on_a = [i for w, idx in ranges(out) if w == A for i in idx]
    step(s, ev.RemoveClient("c"))
    step(s, ev.RemoveWorker(A, "gone"))
    step(s, ev.AddWorker(A, 1))
    out = finish(s, A, on_a[:1])
    assert [m.msg.keys for m in out if m.msg.op == "free-keys"] == [[f"m-a-{on_a[0]}"]]
    assert s.bulk.maps["m-a-"].n_orphans == 2  # B's, whose reports are due


def test_a_prefix_whose_elements_became_tasks_is_not_reused():
    """A map is dropped while one of its elements lives on as a task (depended on): a new
    map under the same prefix, whose keys would be that task's, is refused."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    new_map(s, 4)
    step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": ["m-a-1"]}}, ["z"]))
    step(s, ev.ClientReleasesKeys("c", ["m-a-0", "m-a-2", "m-a-3"]))
    finish(s, A, [0])
    assert "m-a-" not in s.bulk.maps and "m-a-1" in s.tasks
    with pytest.raises(ev.MalformedMessage, match="earlier map"):
        s.handle(ev.UpdateMap("c", prefix="m-a-", function=b"f", args=[b"x"]))
    s.validate()


def test_the_prefixes_of_dropped_maps_are_let_go_once_their_tasks_are(monkeypatch):
    """A client that runs maps all day, each with an element made a task, does not grow
    the scheduler's record of the prefixes that may not be reused: a prefix is let go
    once its tasks are all forgotten, and kept while one lives."""
    monkeypatch.setattr(book_module, "SPENT_PRUNE", 8)  # a map of one element weighs 2
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    sizes = []
    for k in range(40):
        p = f"m-{k}-"
        new_map(s, 4, prefix=p)
        step(s, ev.UpdateGraph("c", {f"z{k}": {"run_spec": "z", "deps": [p + "1"]}},
                               [f"z{k}"]))
        step(s, ev.ClientReleasesKeys("c", [p + "0", p + "2", p + "3"]))
        finish(s, A, [0], prefix=p)
        assert p not in s.bulk.maps and p + "1" in s.tasks
        if k != 3:  # the task of m-3-'s element 1 lives on; the others are forgotten
            step(s, ev.ClientReleasesKeys("c", [f"z{k}", p + "1"]))
        sizes.append(len(s.bulk.spent))
    assert max(sizes) <= 5 and "m-3-" in s.bulk.spent
    with pytest.raises(ev.MalformedMessage, match="earlier map"):
        s.handle(ev.UpdateMap("c", prefix="m-3-", function=b"f", args=[b"x"]))
    s.validate()


def test_the_record_of_dropped_maps_is_bounded_in_elements_not_in_maps(monkeypatch):
    """Maps all of whose elements are made tasks (their futures passed on) weigh by their
    elements: the record stays near its bound however large the maps are."""
    monkeypatch.setattr(book_module, "SPENT_PRUNE", 64)
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    sizes = []
    for k in range(30):
        p = f"m-{k}-"
        out = new_map(s, 20, prefix=p)
        step(s, ev.UpdateGraph("c", {f"z{k}": {"run_spec": "z",
                                                "deps": [p + str(i) for i in range(20)]}},
                               [f"z{k}"]))
        step(s, ev.ClientReleasesKeys("c", [p + str(i) for i in range(20)]))
        while ranges(out):  # the elements run, in ranges, until none is left to give
            out = finish(s, A, [i for _, idx in ranges(out) for i in idx], prefix=p)
        assert p not in s.bulk.maps and len(s.bulk.spent[p]) == 20
        step(s, ev.ClientReleasesKeys("c", [f"z{k}"]))
        sizes.append(sum(len(idx) for idx in s.bulk.spent.values()))
    assert max(sizes) <= 64 + 20, sizes
    s.validate()


def test_ranges_are_capped_and_shrink_towards_the_end():
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    out = new_map(s, 100_000)
    sizes = [len(idx) for _, idx in ranges(out)]
    assert sizes[0] == MAX_RANGE
    done: list[int] = []
    last = sizes
    while True:
        given = [i for _, idx in ranges(out) for i in idx]
        if not given:
            break
        last = [len(idx) for _, idx in ranges(out)]
        done += given
        out = finish(s, A, given)
    assert len(done) == 100_000
    assert min(last) == 1  # the last ranges are single elements


@pytest.mark.timeout(120)
def test_a_queued_map_costs_a_tenth_of_its_tasks():
    """Scheduler memory of 100,000 queued map elements, against the same map as tasks."""
    n = 100_000
    args = [b"x" * 20 + b"%d" % i for i in range(n)]

    def measure(make: Any) -> int:
        s = SchedulerState()
        s.handle(ev.AddClient("c"))
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        make(s)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        return used

    def as_map(s: SchedulerState) -> None:
        s.handle(ev.UpdateMap("c", prefix="f-tok-", function=b"f", args=args))

    def as_tasks(s: SchedulerState) -> None:
        s.handle(ev.UpdateGraph("c", {f"f-tok{i:08x}": {"run_spec": (b"f", a, False),
                                                        "deps": []}
                                      for i, a in enumerate(args)},
                                [f"f-tok{i:08x}" for i in range(n)],
                                static_priorities={f"f-tok{i:08x}": i for i in range(n)}))

    bulk, tasks = measure(as_map), measure(as_tasks)
    assert bulk * 10 <= tasks, (bulk, tasks)


def released(out: list[Send]) -> list[tuple[str, int]]:
    return [(m.to, m.msg.count) for m in out if m.msg.op == "release-range"]


def give_back(s: SchedulerState, worker: str, indices: list[int], prefix: str = "m-a-"
              ) -> list[Send]:
    return step(s, ev.RangeReleased(worker, released={prefix: indices} if indices else {}))


def in_memory(out: list[Send]) -> list[int]:
    return [i for m in out if m.msg.op == "map-in-memory" for i in m.msg.indices]


def drain(s: SchedulerState, out: list[Send]) -> list[int]:
    """Every worker finishes every range given it, until none is given: the indices
    reported to the client meanwhile."""
    reported: list[int] = []
    while ranges(out):
        given: dict[str, list[int]] = {}
        for w, idx in ranges(out):
            given.setdefault(w, []).extend(idx)
        out = []
        for w, idx in given.items():
            out += finish(s, w, idx)
        reported += in_memory(out)
    return reported


def test_an_idle_worker_steals_the_tail_of_a_slow_workers_range():
    """A and B, one thread each. A finishes everything it is given, B reports nothing
    (its elements' speed is unknown: worth stealing). Once no element is queued, a tick
    asks B to give back half of what it holds beyond its thread; B gives back the tail
    it has not started, which goes to A. No element is given to two workers at once;
    every element is reported once."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    step(s, ev.AddWorker(B, 1))
    out = new_map(s, 100)
    on_b = [i for w, idx in ranges(out) if w == B for i in idx]
    out = [m for m in out if m.to == A]
    reported: list[int] = []
    while ranges(out):
        out = finish(s, A, [i for _, idx in ranges(out) for i in idx])
        reported += in_memory(out)
        on_b += [i for w, idx in ranges(out) if w == B for i in idx]
        out = [m for m in out if m.to == A]
    assert not s.bulk.pending and A in s.bulk.hungry
    assert released(step(s, ev.Tick(now=1.0))) == [(B, len(on_b) // 2)]
    assert not released(step(s, ev.Tick(now=1.1)))  # one request at a time
    tail = on_b[len(on_b) - len(on_b) // 2:]
    out = give_back(s, B, tail)
    to_a = [i for w, idx in ranges(out) if w == A for i in idx]
    assert to_a and set(to_a) <= set(tail)  # the idle worker takes them (the rest queue)
    assert not [w for w, _ in ranges(out) if w == B]
    assert s.bulk.outstanding[B] == len(on_b) - len(tail)
    # B ran the head of its ranges: reported, they count; a copy of a given-back element
    # (a buggy worker's) is dropped, not counted
    head = on_b[: len(on_b) - len(tail)]
    late = finish(s, B, head + tail[:1])
    assert in_memory(late) == head
    assert any(x.msg.op == "free-keys" and x.msg.keys == [f"m-a-{tail[0]}"] for x in late)
    reported += head + drain(s, out + late)
    assert sorted(reported) == list(range(100))
    assert s.task_counts() == {"memory": 100}


def test_a_worker_that_joins_once_everything_is_given_steals():
    s = SchedulerState()
    step(s, ev.AddWorker(A, 4))
    out = new_map(s, 40)
    on_a = [i for _, idx in ranges(out) for i in idx]
    while s.bulk.pending:  # A runs some of what it is given until the rest is given too
        out = finish(s, A, on_a[:2])
        on_a = on_a[2:] + [i for _, idx in ranges(out) for i in idx]
    step(s, ev.AddWorker(B, 1))
    assert B in s.bulk.hungry
    (asked,) = released(step(s, ev.Tick(now=1.0)))
    assert asked == (A, (len(on_a) - 4 + 1) // 2) and asked[1] > 1
    out = give_back(s, A, on_a[-asked[1]:])
    assert sorted(i for w, idx in ranges(out) if w == B for i in idx) == on_a[-asked[1]:]


def map_of_tasks_on_a_and_b(s: SchedulerState, n: int) -> list[Send]:
    """A map of ``n`` elements, every one of them made a task before a worker comes (a
    task ``z`` depends on them all: they are held, and run in ranges), then A and B, a
    thread each: what was sent."""
    new_map(s, n)
    step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": [f"m-a-{i}" for i in range(n)]}},
                           ["z"]))
    return step(s, ev.AddWorker(A, 1)) + step(s, ev.AddWorker(B, 1))


def test_elements_made_tasks_are_handed_out_as_the_map_drains():
    """Every element of a map of 400 is a task (held: a client wants them, or a task
    depends on them), yet each worker is given only what it holds for a while, in ranges
    that shrink as the map drains, exactly as if they were plain elements: the tasks
    its ranges run are its load. (Counting only plain elements, the map would go out
    whole at the first reports, and no worker would have a tail left to give to one
    that runs dry.)"""
    s = SchedulerState()
    held = ranges(map_of_tasks_on_a_and_b(s, 400))  # given, not reported, in order
    given = {A: 0, B: 0}
    sizes: list[int] = []
    for w, idx in held:
        given[w] += len(idx)
    out: list[Send] = []
    while held:  # the workers finish their ranges in the order given
        w, idx = held.pop(0)
        out = finish(s, w, idx)
        for w2, idx2 in ranges(out):
            given[w2] += len(idx2)
            sizes.append(len(idx2))
        held += ranges(out)
        load = s.bulk.handout.load(A) + s.bulk.handout.load(B)
        assert load == sum(len(idx) for _, idx in held) <= 400 // 2, load  # never all
    assert given[A] + given[B] == 400 and min(given.values()) >= 100
    assert sizes[-1] < sizes[0] / 4  # guided: smaller as the map drains
    (z,) = [m for m in out if m.msg.op == "compute-task"]
    assert z.msg.key == "z"


def test_an_idle_worker_steals_the_tail_of_a_worker_whose_elements_are_tasks():
    """As :func:`test_an_idle_worker_steals_the_tail_of_a_slow_workers_range`, every
    element a task: B holds ranges and reports nothing, A runs what it is given until
    nothing is queued. A tick asks B for half of what it holds beyond its thread; the
    tasks B gives back run on A as tasks, none of them twice, and ``z`` runs after all."""
    s = SchedulerState()
    out = map_of_tasks_on_a_and_b(s, 100)
    on_b = [i for w, idx in ranges(out) if w == B for i in idx]
    out = [m for m in out if m.to == A]
    while ranges(out):
        out = finish(s, A, [i for _, idx in ranges(out) for i in idx])
        on_b += [i for w, idx in ranges(out) if w == B for i in idx]
        out = [m for m in out if m.to == A]
    assert not s.bulk.pending and A in s.bulk.hungry
    assert 1 < len(on_b) < 50 and s.bulk.handout.load(B) == len(on_b)
    assert released(step(s, ev.Tick(now=1.0))) == [(B, len(on_b) // 2)]
    assert not released(step(s, ev.Tick(now=1.1)))  # one request at a time
    tail = on_b[len(on_b) - len(on_b) // 2:]
    out = give_back(s, B, tail)
    assert s.bulk.handout.load(B) == len(on_b) - len(tail)
    to_a: list[str] = []  # A runs them as tasks, as its threads free (root-ish queuing)
    while sent := [m.msg.key for m in out if m.msg.op == "compute-task"]:
        assert not [m for m in out if m.to == B and m.msg.op in ("compute-task", "compute-range")]
        to_a += sent
        out = []
        for key in sent:
            out += step(s, ev.TaskFinished(A, key, nbytes=8, typename="int", start=1.0, stop=1.1))
    assert sorted(to_a) == sorted(f"m-a-{i}" for i in tail)
    out = finish(s, B, on_b[: len(on_b) - len(tail)])
    (z,) = [m for m in out if m.msg.op == "compute-task"]
    assert z.msg.key == "z" and s.task_counts()["memory"] == 100


def test_an_element_made_a_task_that_erred_is_no_longer_its_workers_load():
    """A element given to A is made a task, then raises: A holds it no more (a worker
    whose held tasks raised would otherwise count them and be given less, or nothing)."""
    s = SchedulerState()
    out, on_a = map_on_a_and_b(s, 40)
    step(s, ev.UpdateGraph("c", {"y": {"run_spec": "y", "deps": [f"m-a-{on_a[0]}"]}}, ["y"]))
    before = s.bulk.handout.load(A)
    assert s.bulk.promotions.in_range(A) == 1
    out = step(s, ev.TaskErred(A, f"m-a-{on_a[0]}", exception="boom", exception_text="boom"))
    assert s.bulk.promotions.in_range(A) == 0
    assert s.bulk.handout.load(A) == before - 1 + sum(len(idx) for w, idx in ranges(out)
                                                       if w == A)


@pytest.mark.parametrize(("seconds", "stolen"), [(0.001, False), (0.1, True)])
def test_only_elements_worth_a_round_trip_are_stolen(seconds, stolen):
    """B ran an element in ``seconds`` and holds a few more: a millisecond's worth is not
    worth a round trip (a tick asks nothing), a tenth of a second's is."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    step(s, ev.AddWorker(B, 1))
    out = new_map(s, 20)
    on_b = [i for w, idx in ranges(out) if w == B for i in idx]
    finish(s, B, on_b[:1], seconds=seconds)
    drain(s, [m for m in out if m.to == A])
    assert not s.bulk.pending and s.bulk.outstanding[B] > 1
    assert bool(released(step(s, ev.Tick(now=1.0)))) == stolen


def test_a_paused_worker_gives_back_what_it_has_not_started():
    s = SchedulerState()
    out, on_a = map_on_a_and_b(s)
    out = step(s, ev.WorkerStatusChange(A, status="paused"))
    assert released(out) == [(A, len(on_a))]
    out = give_back(s, A, on_a[1:])  # the first one runs
    assert not [w for w, _ in ranges(out) if w == A]
    assert s.bulk.outstanding[A] == 1
    out = finish(s, A, on_a[:1])  # reported while paused: in memory, nothing more given
    assert not ranges(out) and s.bulk.maps["m-a-"].state[on_a[0]] == 2
    out = step(s, ev.WorkerStatusChange(A, status="running"))
    assert [w for w, _ in ranges(out)] and all(w == A for w, _ in ranges(out))


def test_a_retiring_worker_gives_back_its_elements_and_its_results_move():
    """Retired, A gives back what it has not started and its results become tasks, which
    the retirement copies to B; the element still running is waited for, then moved too;
    A closes holding nothing only it has, and no element is computed again."""
    s = SchedulerState()
    out, on_a = map_on_a_and_b(s)
    finish(s, A, on_a[:3])
    out = step(s, ev.RetireWorkers("r1", "c", [A]))
    assert released(out) == [(A, len(on_a) - 3)]
    moved = {k for m in out if m.msg.op == "acquire-replicas" for k in m.msg.who_has}
    assert moved == {f"m-a-{i}" for i in on_a[:3]}
    assert all(m.to == B for m in out if m.msg.op == "acquire-replicas")
    assert not [m for m in out if m.msg.op == "close"]
    give_back(s, A, on_a[4:])
    step(s, ev.AddKeys(B, keys={k: 8 for k in moved}))
    assert not [m for m in step(s, ev.Tick(now=1.0)) if m.msg.op == "close"]  # one runs
    finish(s, A, on_a[3:4])
    out = step(s, ev.Tick(now=2.0))
    assert {k for m in out if m.msg.op == "acquire-replicas" for k in m.msg.who_has} == {
        f"m-a-{on_a[3]}"}
    out = step(s, ev.AddKeys(B, keys={f"m-a-{on_a[3]}": 8}))
    out += step(s, ev.Tick(now=3.0))
    assert [m.to for m in out if m.msg.op == "close"] == [A]
    assert A not in s.workers
    assert not [m for m in out if m.msg.op == "lost-data"]
    assert all(s.who_has([f"m-a-{i}"])[f"m-a-{i}"] == [B] for i in on_a[:4])


def _suspects_on_b() -> tuple[SchedulerState, list[int], list[str], list[Send]]:
    """A dies with elements unfinished; with allowed_failures=2 each is a suspect at once
    (a task of its own, to run alone). (state, B's elements, the suspects sent to B, what
    A's death sent)."""
    s = SchedulerState(allowed_failures=2)
    step(s, ev.AddWorker(A, 1))
    step(s, ev.AddWorker(B, 1))
    out = new_map(s, 40)
    on_b = [i for w, idx in ranges(out) if w == B for i in idx]
    out = step(s, ev.RemoveWorker(A, "killed"))
    suspects = [m.msg.key for m in out if m.msg.op == "compute-task" and m.to == B]
    assert on_b and suspects and all(s.tasks[k].suspicious == 1 for k in suspects)
    return s, on_b, suspects, out


def test_a_suspect_runs_alone_on_a_worker_that_gives_back_its_elements():
    """A dies with elements unfinished; with allowed_failures=2 each is a suspect at once,
    a task of its own that must run alone (a further death is its own). B, where they
    go, is given no range while one of them is B's, gives back the elements it has not
    started when one starts, and takes ranges again once they are done."""
    s, on_b, suspects, out = _suspects_on_b()
    assert not ranges(out)
    out = step(s, ev.TaskStarted(B, suspects[0]))
    assert released(out) == [(B, len(on_b))]
    give_back(s, B, on_b[1:])
    assert not ranges(finish(s, B, on_b[:1]))  # B reports; still no range for it
    while suspects:  # each one B finishes makes room for the next (queued) one
        out = step(s, ev.TaskFinished(B, suspects.pop(), nbytes=8, typename="int",
                                      start=1.0, stop=1.1))
        assert not ranges(out)
        suspects += [m.msg.key for m in out if m.msg.op == "compute-task"]
    out = step(s, ev.Tick(now=1.0))
    assert ranges(out) and all(w == B for w, _ in ranges(out))


def test_a_worker_whose_retirement_is_given_up_takes_elements_again():
    """A retires, gives back its elements; B, which was to take A's results, leaves: the
    retirement is given up (the results have nowhere to go), and A, running again, is
    given the queued elements on the next tick."""
    s = SchedulerState()
    out, on_a = map_on_a_and_b(s)
    finish(s, A, on_a[:1])
    step(s, ev.RetireWorkers("r1", "c", [A]))
    give_back(s, A, on_a[1:])
    step(s, ev.RemoveWorker(B, "gone"))
    assert s.bulk.pending and not s.bulk.outstanding.get(A)
    out = step(s, ev.Tick(now=1.0))
    assert s.workers[A].status == "running"
    assert [w for w, _ in ranges(out)] and all(w == A for w, _ in ranges(out))


def test_the_workers_descriptions_and_retire_n_count_elements_and_their_results():
    """A worker's description and which workers a retirement of ``n`` picks (the least
    busy, then the least data) count the elements given to it and the results it holds,
    as tasks are counted. A's results weigh 1,000 bytes each, B's 8: B is the one to
    retire, where the tasks alone would name neither."""
    s = SchedulerState()
    out, on_a = map_on_a_and_b(s)
    info = s.workers_info()
    assert info[A]["processing"] == len(on_a) == s.bulk.outstanding[A]
    assert 0 < info[B]["processing"] == s.bulk.outstanding[B] < len(on_a)
    assert s.workers_to_retire(None, None, 1) == [B]  # the less busy
    finish_ranges(s, A, out, nbytes=1000)
    finish_ranges(s, B, out)
    assert s.task_counts() == {"memory": 40} and not s.tasks
    info = s.workers_info()
    n_a, n_b = info[A]["n_keys"], info[B]["n_keys"]
    assert n_a + n_b == 40 and n_a and n_b
    assert (info[A]["nbytes"], info[B]["nbytes"]) == (1000 * n_a, 8 * n_b)
    assert info[A]["processing"] == info[B]["processing"] == 0
    assert not s.workers[A].has_what and not s.workers[B].has_what  # no task made
    assert s.workers_to_retire(None, None, 1) == [B]
    assert s.workers_to_retire([A], None, 1) == [A, B]


def test_an_element_promoted_while_it_is_given_back_runs_as_a_task():
    """A release is asked; before the answer an element B holds is depended on (a task
    of its own now, counted as running on B); B's answer gives it back: it is placed
    again as a task, and runs once."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    step(s, ev.AddWorker(B, 1))
    out = new_map(s, 20)
    on_b = [i for w, idx in ranges(out) if w == B for i in idx]
    step(s, ev.WorkerStatusChange(B, status="paused"))
    last = on_b[-1]
    step(s, ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": [f"m-a-{last}"]}}, ["z"]))
    ts = s.tasks[f"m-a-{last}"]
    assert ts.state == "processing" and ts.processing_on.address == B
    out = give_back(s, B, on_b[1:])
    computes = [(m.to, m.msg.key) for m in out if m.msg.op == "compute-task"]
    assert computes == [(A, f"m-a-{last}")]
    assert s.tasks[f"m-a-{last}"].processing_on.address == A


@pytest.mark.timeout(300)
def test_a_departure_costs_what_the_worker_had_not_the_map():
    """1,000 workers run a 1,000,000-element map for three rounds of reports, then leave
    one by one. Each departure visits the elements given to that worker (its runs), not
    the map's arrays: the thousand departures take a few seconds of CPU at most, where a
    scan of the map per departure takes tens. Every result held is lost once (its
    client hears lost-data), every element ends up queued again, and the counters agree
    with the arrays."""
    n, n_workers = 1_000_000, 1000
    s = SchedulerState()
    s.handle(ev.AddClient("c"))
    for w in range(n_workers):
        s.handle(ev.AddWorker(f"tcp://w{w}", 1))
    out = s.handle(ev.UpdateMap("c", prefix="m-a-", function=b"f", args=[b"a"] * n))
    while s.fill_pending:  # the map's first wave, a few workers per turn of the server
        out += s.handle(ev.FillQueue())
    for _ in range(3):
        given: dict[str, list[int]] = {}
        for w, idx in ranges(out):
            given.setdefault(w, []).extend(idx)
        out = []
        for w, idx in given.items():
            k = len(idx)
            out += s.handle(ev.RangeFinished(w, prefix="m-a-", indices=idx, nbytes=[8] * k,
                                             types=["int"] * k, starts=[1.0] * k,
                                             stops=[1.1] * k))
    held = s.task_counts()["memory"]
    assert held > n // 2
    lost = 0
    start = time.process_time()
    for w in range(n_workers):
        lost += sum(m.msg.op == "lost-data" for m in s.handle(ev.RemoveWorker(f"tcp://w{w}", "gone")))
    spent = time.process_time() - start
    assert spent < 15, f"{n_workers} departures took {spent:.1f} s of CPU"
    assert lost == held
    assert s.task_counts() == {"queued": n} and not s.tasks
    assert not s.bulk.given_maps and not s.bulk.outstanding and not s.bulk.hungry
    s.validate()


def _run_map_on_many(seconds: float, n: int = 5000, n_workers: int = 1000) -> set[str]:
    """A map of ``n`` elements of ``seconds`` each on ``n_workers`` one-thread workers,
    driven as the server drives it: each turn, a ``FillQueue`` while ``fill_pending``,
    and one worker's report of what it was given. The workers given elements."""
    s = SchedulerState()
    s.handle(ev.AddClient("c"))
    for w in range(n_workers):
        s.handle(ev.AddWorker(f"tcp://w{w}", 1))
    out = s.handle(ev.UpdateMap("c", prefix="m-a-", function=b"f", args=[b"a"] * n))
    assert len({w for w, _ in ranges(out)}) <= FIRST_WAVE_WORKERS
    held: dict[str, list[int]] = {}  # given and not reported yet, per worker
    while True:
        for w, idx in ranges(out):
            held.setdefault(w, []).extend(idx)
        if s.fill_pending:  # the server's next turn: after the messages of this one
            for w, idx in ranges(s.handle(ev.FillQueue())):
                held.setdefault(w, []).extend(idx)
        pending = [w for w, idx in held.items() if idx]
        if not pending:
            break
        w = pending[0]  # one report per turn of the server
        idx, held[w] = held[w], []
        k = len(idx)
        out = s.handle(ev.RangeFinished(w, prefix="m-a-", indices=idx, nbytes=[8] * k,
                                        types=["int"] * k, starts=[1.0] * k,
                                        stops=[1.0 + seconds] * k))
    s.validate()
    used = set(held)
    assert s.task_counts() == {"memory": n}
    return used


def test_a_map_of_short_elements_goes_to_a_few_of_many_workers():
    """1,000 workers, 5,000 elements of 2 us: the first wave goes to 16 workers, whose
    first report measures the elements; from then on a range holds 5 ms of work, so that
    a few workers run the map instead of a thousand each running five elements."""
    assert len(_run_map_on_many(2e-6)) <= 2 * FIRST_WAVE_WORKERS


def test_a_map_of_long_elements_still_reaches_every_worker():
    """The same map of one-second elements: the first wave goes on, 16 workers per turn
    of the server, until every worker has elements."""
    assert len(_run_map_on_many(1.0)) == 1000


# ------------------------------------------------------------------ random events
MAPS = ["m-a-", "m-b-"]
ELEMENTS = [f"{p}{i}" for p in MAPS for i in range(6)]
elements = st.sampled_from(ELEMENTS)
PENDING = ("waiting", "queued", "no-worker", "processing")  # a task not done, not erred
SPARE = "tcp://spare"  # a worker that joins the drain when none runs
DRAIN_ROUNDS = 50  # of answers, after which a cluster still busy is stuck in a loop


class BulkMapStory(SchedulerStory):
    """The fuzz story of the scheduler state with bulk maps: clients send maps, workers
    finish (or fail) the ranges given them, elements are released, cancelled, retried,
    depended on, while workers come and go."""

    def __init__(self) -> None:
        super().__init__()
        self.given: list[tuple[str, str, int]] = []  # (worker, prefix, index) in ranges
        self.releases: list[tuple[str, int]] = []  # (worker, count) of release-range

    @rule(client=st.sampled_from(["c1", "c2"]), which=st.sampled_from(MAPS),
          n=st.integers(1, 6), retries=st.integers(0, 1))
    def submit_map(self, client: str, which: str, n: int, retries: int) -> None:
        if client not in self.s.clients:
            self.handle(ev.AddClient(client))
        m = self.s.bulk.maps.get(which)
        offset = len(m.args) if m is not None else 0
        self.handle(ev.UpdateMap(client, prefix=which, function=b"f",
                                 args=[b"a"] * n, offset=offset, retries=retries,
                                 now=self.tick()))

    def note(self, out: list) -> None:
        """Also the ranges any event gave (a worker's arrival, a pause, a tick hand out
        ranges too), each worker's in the order given (stable sort), and the
        release-range requests."""
        super().note(out)
        given = [(cmd.to, cmd.msg.prefix, i) for cmd in out if cmd.msg.op == "compute-range"
                 for i in cmd.msg.indices]
        self.given += sorted(given, key=itemgetter(0))
        self.releases += sorted((cmd.to, cmd.msg.count) for cmd in out
                                if cmd.msg.op == "release-range")

    @rule(i=st.integers(0, 10_000), k=st.integers(1, 4))
    def finish_range(self, i: int, k: int) -> None:
        if not self.given:
            return
        j = i % len(self.given)
        picked, self.given[j:j + k] = self.given[j:j + k], []
        for worker, prefix, index in picked:
            self.handle(ev.RangeFinished(worker, prefix=prefix, indices=[index], nbytes=[8],
                                         types=["int"], starts=[1.0], stops=[1.1],
                                         now=self.tick()))

    @rule()
    def finish_all_given(self) -> None:
        """Every worker reports every element given to it, one report per map."""
        by: dict[tuple[str, str], list[int]] = {}
        for worker, prefix, index in self.given:
            by.setdefault((worker, prefix), []).append(index)
        self.given = []
        for (worker, prefix), indices in by.items():
            n = len(indices)
            self.handle(ev.RangeFinished(worker, prefix=prefix, indices=indices, nbytes=[8] * n,
                                         types=["int"] * n, starts=[1.0] * n,
                                         stops=[1.1] * n, now=self.tick()))

    @rule(i=st.integers(0, 10_000))
    def element_fails(self, i: int) -> None:
        if not self.given:
            return
        worker, prefix, index = self.given.pop(i % len(self.given))
        self.handle(ev.TaskErred(worker, f"{prefix}{index}", exception="boom",
                                 exception_text="boom", now=self.tick()))

    @rule()
    def all_given_fail(self) -> None:
        """Every element given raises (a function that fails for every argument): the
        workers report a task-erred for each, and no range-finished."""
        given, self.given = self.given, []
        for worker, prefix, index in given:
            self.handle(ev.TaskErred(worker, f"{prefix}{index}", exception="boom",
                                     exception_text="boom", now=self.tick()))

    @rule(client=st.sampled_from(["c1", "c2"]), key=elements)
    def release_element(self, client: str, key: str) -> None:
        self.handle(ev.ClientReleasesKeys(client, [key], now=self.tick()))

    @rule(client=st.sampled_from(["c1", "c2"]), key=elements)
    def cancel_element(self, client: str, key: str) -> None:
        self.handle(ev.CancelKeys(client, [key], now=self.tick()))

    @rule(client=st.sampled_from(["c1", "c2"]), key=elements)
    def depend_on_element(self, client: str, key: str) -> None:
        if client not in self.s.clients:
            self.handle(ev.AddClient(client))
        self.handle(ev.UpdateGraph(client, {"k0": {"run_spec": "s", "deps": [key]}}, ["k0"],
                                   now=self.tick()))

    @rule(worker=st.sampled_from(["tcp://w1", "tcp://w2", "tcp://w3"]), key=elements)
    def stray_range(self, worker: str, key: str) -> None:
        prefix, _, i = key.rpartition("-")
        self.handle(ev.RangeFinished(worker, prefix=prefix + "-", indices=[int(i)],
                                     nbytes=[8], types=["int"], starts=[1.0], stops=[1.1],
                                     now=self.tick()))

    @rule(i=st.integers(0, 10_000), k=st.integers(1, 4))
    def give_back(self, i: int, k: int) -> None:
        """A worker gives back elements it was given and has not started (asked or not)."""
        if not self.given:
            return
        self.release_tail(self.given[i % len(self.given)][0], k)

    @rule(i=st.integers(0, 10_000), started=st.integers(0, 2))
    def answer_release(self, i: int, started: int) -> None:
        """A worker answers a release-range as a real one does (worker.ranges): it
        gives back at most the count asked of the elements it has not started, the last
        given first. The first ``started`` of those it was given run (they are reported
        later, by the rules that finish or fail elements)."""
        if not self.releases:
            return
        worker, count = self.releases.pop(i % len(self.releases))
        self.release_tail(worker, count, started)

    def release_tail(self, worker: str, count: int, started: int = 0) -> None:
        """``worker`` gives back the last ``count`` elements it was given (one
        range-released, maybe of none), but for the first ``started`` of them."""
        mine = [j for j, g in enumerate(self.given) if g[0] == worker][started:]
        back_at = set(mine[len(mine) - min(count, len(mine)):])
        back: dict[str, list[int]] = {}
        for j in sorted(back_at):
            back.setdefault(self.given[j][1], []).append(self.given[j][2])
        self.given = [g for j, g in enumerate(self.given) if j not in back_at]
        self.handle(ev.RangeReleased(worker, released=back, now=self.tick()))

    @rule(client=st.sampled_from(["c1", "c2"]), which=st.sampled_from(MAPS),
          lo=st.integers(0, 8), n=st.integers(2, 8), descending=st.booleans())
    def release_run(self, client: str, which: str, lo: int, n: int, descending: bool) -> None:
        """A client gathers, then drops, many futures of a map at once (a list drops its
        items last first). Runs are looked up from the map's arrays from two keys on
        (RUN_MIN, lowered for this story): the answer is each key's own."""
        m = self.s.bulk.maps.get(which)
        if m is not None and len(m.state) >= 2:  # mostly a run inside the map
            lo %= len(m.state) - 1
            n = min(n, len(m.state) - lo)
        keys = [f"{which}{i}" for i in range(lo, lo + n)]
        if descending:
            keys.reverse()
        with patch.object(elements_module, "RUN_MIN", 2):
            held, missing = self.s.holders_of(keys)
            placed = {k: w for w, ks in held.items() for k in ks}
            assert len(placed) + len(missing) == n
            for k in keys:
                holders = {ws.address for ws in self.s.holders(k)}
                assert placed.get(k) in holders if holders else k in missing, k
            self.handle(ev.ClientReleasesKeys(client, keys, now=self.tick()))

    # ------------------------------------------------------------ the cluster drains
    def teardown(self) -> None:
        """The cluster drains: once the workers have answered everything they were sent
        (:meth:`drain`), nothing a client wants is left pending: no task waits, is
        queued or processing, no element is queued, held or processing, no worker is
        counted as running elements, no release-range is unanswered. (Two hangs it
        found: a map whose elements all raised stayed queued; a worker whose element,
        forgotten as it ran, raised was counted full for ever.) A run that failed already
        is not drained: its own failure is the one to report."""
        if sys.exc_info()[0] is not None:
            return
        self.drain()
        s = self.s
        stuck = sorted(f"{k} {ts.state}" for k, ts in s.tasks.items()
                       if (ts.state in PENDING or ts.state == "released" and ts.who_wants)
                       and not _waits_for_growth(ts, sum(
                           ws.status != "closing_gracefully" for ws in s.workers.values())))
        maps = {p: (m.n_free, sorted(m.held), m.state.count(PROCESSING))
                for p, m in s.bulk.maps.items()
                if m.n_free or m.held or PROCESSING in m.state}
        counted = {w: n for w, n in s.bulk.outstanding.items() if n}
        assert not (stuck or maps or counted or s.bulk.releasing), \
            (stuck, maps, counted, s.bulk.releasing)

    def drain(self) -> None:
        """Workers run until nothing is left to answer: paused ones run again (a worker
        joins if none runs), the server's FillQueue and a tick pass, and every message
        sent is answered: release-range, steals (the victim runs the task), ranges and
        tasks finished, copies arrived."""
        s = self.s
        for _ in range(DRAIN_ROUNDS):
            if not any(ws.status == "running" for ws in s.workers.values()):
                self.handle(ev.AddWorker(SPARE, 2, now=self.tick()))
            for address, ws in list(s.workers.items()):
                if ws.status == "paused":
                    self.handle(ev.WorkerStatusChange(address, "running", now=self.tick()))
            while s.fill_pending:
                self.handle(ev.FillQueue(now=self.tick()))
            self.tick_event()
            if not (self.given or self.releases or self.steals or self.copies or self.asked):
                return
            while self.releases:
                self.answer_release(0, started=0)
            while self.steals:
                self.steal_answered(0, "executing")
            self.finish_all_given()
            while self.asked:
                self.finish_asked(0, nbytes=8)
            while self.copies:
                self.copy_arrives(0)
            s.validate()
        raise AssertionError(f"still sending after {DRAIN_ROUNDS} rounds of answers")


BulkMapStory.TestCase.settings = SchedulerStory.TestCase.settings
test_bulk_maps_under_random_events = pytest.mark.timeout(300)(BulkMapStory.TestCase)


class BusyBulkMapStory(BulkMapStory):
    """The same story on a cluster at work from its first step: a worker runs a map.
    Above, many runs spend most of their steps with no worker or no map; each of the
    two hangs the drained cluster revealed (elements that raise as they run, or after
    their release) took it tens to hundreds of runs to meet, this story a few to tens."""

    @initialize(nthreads=st.integers(1, 3), n=st.integers(1, 6))
    def a_worker_runs_a_map(self, nthreads: int, n: int) -> None:
        self.add_worker(WORKERS[0], nthreads)
        self.submit_map("c1", MAPS[0], n, retries=0)


BusyBulkMapStory.TestCase.settings = SchedulerStory.TestCase.settings
test_busy_bulk_maps_under_random_events = pytest.mark.timeout(300)(BusyBulkMapStory.TestCase)


def test_a_silent_death_among_unfinished_elements_is_theirs_not_the_queued_suspects():
    """Suspects say when they start (the word may not get out before one kills its
    worker). B dies with no task said started while elements of its ranges were
    unfinished: those elements count the death, not the suspects queued behind them,
    which would otherwise err with KilledWorker for what an element did."""
    s, on_b, suspects, _ = _suspects_on_b()
    out = step(s, ev.RemoveWorker(B, "killed"))
    assert not [m for m in out if m.msg.op == "task-erred"]
    assert all(s.tasks[k].suspicious == 1 for k in suspects)


def test_a_silent_death_holding_only_suspects_blames_the_one_it_ran_first():
    """B holds only suspects (its elements done) and dies with none said started: the
    first given to it (given together, in the order its thread runs them) was running;
    the ones queued behind it are not blamed."""
    s, on_b, suspects, _ = _suspects_on_b()
    finish(s, B, on_b)
    first = next(ts.key for ts in s.workers[B].processing if ts.suspicious)
    assert first == min(suspects, key=lambda k: s.tasks[k].priority)
    step(s, ev.RemoveWorker(B, "killed"))
    assert s.tasks[first].suspicious == 2 and s.tasks[first].state == "erred"
    assert all(s.tasks[k].suspicious == 1 for k in suspects if k != first)


def test_no_lookup_or_view_makes_an_element_a_task_only_promote_does():
    """Looking elements' keys up in the task table, and every view (who_has, has_what,
    processing, the counts, a worker's bytes and keys), sees the elements as tasks and
    makes no task of any; ``promote`` is the one call that does, and moves the result's
    bytes from the worker's elements to its tasks."""
    s = SchedulerState()
    out, on_a = map_on_a_and_b(s, 40)
    on_b = [i for w, idx in ranges(out) if w == B for i in idx]
    finish(s, A, on_a, nbytes=100)
    keys = [f"m-a-{i}" for i in range(40)]
    for key in keys:
        assert key not in s.tasks and s.tasks.get(key) is None
        with pytest.raises(KeyError):
            s.tasks[key]
    a_keys = sorted(f"m-a-{i}" for i in on_a)
    assert sorted(s.has_what(A)) == a_keys and s.has_what(B) == []
    assert sorted(s.processing(B)) == sorted(f"m-a-{i}" for i in on_b)
    assert s.who_has(a_keys[:2]) == {k: [A] for k in a_keys[:2]}
    assert sorted(s.who_has()) == a_keys  # every result held, and only those
    group = s.bulk.maps["m-a-"].group
    assert s.group_counts()[(group, "memory")] == len(on_a)
    running = len(s.processing(A)) + len(on_b)  # A was topped up when it reported
    assert s.group_counts()[(group, "processing")] == running
    assert s.task_counts()["memory"] == len(on_a)
    wa = s.workers[A]
    assert (wa.nbytes, wa.n_elements, wa.info()["n_keys"]) == (100 * len(on_a), len(on_a),
                                                               len(on_a))
    assert s.load(s.workers[B]) == (len(on_b), 1)  # one thread runs, the rest wait
    assert not s.tasks
    ts = s.promote(a_keys[0])
    assert ts is not None and ts.state == "memory" and s.tasks[a_keys[0]] is ts
    assert (wa.nbytes, wa.n_elements, len(wa.has_what)) == (100 * len(on_a),
                                                            len(on_a) - 1, 1)
    assert sorted(s.has_what(A)) == a_keys  # once each, as a task or as an element
    s.validate()


def test_released_elements_leave_their_workers_bytes():
    """A worker's bytes count its elements' results until the client drops them, as a run
    (a map's futures dropped together) or one by one."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    out = new_map(s, 200)
    every: list[int] = []
    while given := [i for w, idx in ranges(out) if w == A for i in idx]:
        every += given
        out = finish(s, A, given, nbytes=10)
    wa = s.workers[A]
    assert (wa.nbytes, wa.n_elements) == (2000, 200)
    step(s, ev.ClientReleasesKeys("c", [f"m-a-{i}" for i in range(100)]))  # a run
    assert (wa.nbytes, wa.n_elements) == (1000, 100)
    step(s, ev.ClientReleasesKeys("c", [f"m-a-{i}" for i in range(100, 200, 2)]))
    assert (wa.nbytes, wa.n_elements) == (500, 50)
    step(s, ev.RemoveClient("c"))
    assert (wa.nbytes, wa.n_elements) == (0, 0)


def test_a_rebalance_of_all_data_moves_elements_results():
    """A map ran on A alone; B joins and a rebalance of all data (no keys named) moves
    half of A's bytes: its elements' results, largest first, become tasks that B is asked
    to copy, and A keeps the rest as elements."""
    s = SchedulerState()
    step(s, ev.AddWorker(A, 1))
    out = new_map(s, 40)
    while given := [i for w, idx in ranges(out) if w == A for i in idx]:
        out = step(s, ev.RangeFinished(A, prefix="m-a-", indices=given,
                                       nbytes=[100 + i for i in given], types=["int"] * len(given),
                                       starts=[1.0] * len(given), stops=[1.5] * len(given)))
    step(s, ev.AddWorker(B, 1))
    total = sum(100 + i for i in range(40))
    assert s.workers[A].nbytes == total
    out = step(s, ev.RebalanceKeys("r1", "c"))
    (order,) = [m for m in out if m.msg.op == "acquire-replicas"]
    assert order.to == B
    moved = sorted(order.msg.who_has)
    assert moved == sorted(f"m-a-{i}" for i in range(40 - len(moved), 40))  # the largest
    assert all(order.msg.who_has[k] == [A] for k in moved)
    assert sum(order.msg.nbytes.values()) >= total / 2 - 140
    assert s.workers[A].n_elements == 40 - len(s.tasks)


def _waits_for_growth(ts: Any, n_workers: int) -> bool:
    """Whether ``ts`` holds more workers' slots than there are workers to run it (``n_workers``:
    not those retiring), or waits for a task that does: it runs once the cluster grows,
    not before."""
    stack, seen = [ts], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t.state == "no-worker" and t.width > n_workers:
            return True
        stack.extend(t.waiting_on)
    return False


def test_a_report_counts_the_bytes_of_only_the_elements_it_puts_in_memory():
    """A report that holds, beside the worker's own elements, one given to another worker
    (a copy nobody asked for, freed): the worker's bytes count each of its own results at
    its own size, and not the copy's."""
    s = SchedulerState()
    out, on_a = map_on_a_and_b(s)
    on_b = [i for w, idx in ranges(out) if w == B for i in idx]
    indices = [*on_a, on_b[0]]
    sizes = [10 * (j + 1) for j in range(len(on_a))] + [7000]
    n = len(indices)
    out = step(s, ev.RangeFinished(A, prefix="m-a-", indices=indices, nbytes=sizes,
                                   types=["int"] * n, starts=[1.0] * n, stops=[1.5] * n))
    wa = s.workers[A]
    assert (wa.nbytes, wa.n_elements) == (sum(sizes[:-1]), len(on_a))
    assert [m.msg.keys for m in out if m.to == A and m.msg.op == "free-keys"] == [
        [f"m-a-{on_b[0]}"]]
    assert s.bulk.maps["m-a-"].nbytes[on_a[-1]] == sizes[len(on_a) - 1]
    s.validate()


@pytest.mark.timeout(60)
def test_a_worker_whose_map_was_cancelled_is_not_asked_to_give_back_ever_again():
    """A story the random ones found: a map of two elements on a one-thread worker, a
    second worker joins (hungry: a thief), both elements are cancelled as tasks. The
    first worker's count of the tasks its ranges run still held them; each round of
    stealing asked it for elements it no longer had, and it answered with none, for
    ever. The cluster drains."""
    story = BusyBulkMapStory()
    story.a_worker_runs_a_map(nthreads=1, n=2)
    story.add_worker(nthreads=1, worker="tcp://w2")
    story.cancel_element(client="c1", key="m-a-0")
    story.cancel_element(client="c1", key="m-a-1")
    story.teardown()


@pytest.mark.timeout(60)
def test_a_task_held_back_behind_a_wide_task_cancelled_runs_when_the_workers_free():
    """A story the random ones found: both workers run a map's elements, a wide task of
    two gathers (keeping none yet: their threads are taken), a narrow task of worse
    priority waits behind it, then the wide task is cancelled. The narrow task became
    no-worker with nothing to try it again once the elements ended. The cluster drains."""
    story = BusyBulkMapStory()
    story.a_worker_runs_a_map(nthreads=1, n=2)
    story.add_worker(nthreads=1, worker="tcp://w2")
    story.submit_map(client="c1", n=2, retries=0, which="m-a-")
    story.submit(client="c1", priority=0, ranks=2,
                 tasks={"k0": {"run_spec": "spec-k0", "deps": []},
                        "x-7": {"run_spec": "spec-x-7", "deps": []}})
    story.submit(client="c1", priority=0, ranks=1,
                 tasks={"k0": {"run_spec": "spec-k0", "deps": []}})
    assert story.s.placement.behind, "the narrow task waits behind the wide one"
    story.cancel(client="c1", key="x-7")
    story.teardown()
