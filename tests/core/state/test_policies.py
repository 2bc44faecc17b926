"""Scheduling policies, each decision shown on a small drawn graph.

The policies are dask.distributed's
(https://distributed.dask.org/en/stable/scheduling-policies.html).

State-machine level: ``SchedulerState`` (and ``WorkerState`` where the worker
decides) driven by events, no processes, no clock; ``validate()`` after every
step. Graphs are drawn bottom-up (dependencies below their dependents). Each
test names the policy it proves; removing that policy makes it fail.

Workers are ``tcp://a``, ``tcp://b``; the client is ``c``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from hpcsched.core.graph.mars import assign_initial
from hpcsched.core.graph.order import order
from hpcsched.core.protocol.messages import SCHEDULER_TO_WORKER, WORKER_TO_SCHEDULER, decode
from hpcsched.core.state import events as ev
from hpcsched.core.state import policies
from hpcsched.core.state.events import Execute, Send
from hpcsched.core.state.scheduler_state import SchedulerState
from hpcsched.core.state.worker_state import WorkerState
from tests.core.state.harness import step

A, B, C = "tcp://a", "tcp://b", "tcp://c"
MB = 1_000_000


# ---------------------------------------------------------------- helpers
def cluster(*workers: tuple[str, int] | str, **kw: Any) -> SchedulerState:
    """A SchedulerState with workers ``(address, nthreads)`` (or addresses: 1 thread)."""
    kw.setdefault("work_stealing", False)
    resources_of = kw.pop("resources_of", {})
    s = SchedulerState(**kw)
    for w in workers:
        addr, n = (w, 1) if isinstance(w, str) else w
        step(s, ev.AddWorker(addr, n, name=addr.split("//")[1],
                             resources=resources_of.get(addr, {})))
    step(s, ev.AddClient("c"))
    return s


def graph(deps: dict[str, list[str]]) -> dict:
    return {k: {"run_spec": f"spec-{k}", "deps": list(d)} for k, d in deps.items()}


def submit(s: SchedulerState, deps: dict[str, list[str]], keys: list[str], **kw: Any
           ) -> list[Send]:
    return step(s, ev.UpdateGraph("c", graph(deps), keys, **kw))


def computes(out: list[Send], to: str | None = None) -> list[str]:
    return [m.wire()["key"] for m in out if m.wire()["op"] == "compute-task"
            and (to is None or m.to == to)]


def finish(s: SchedulerState, key: str, nbytes: int = 8, duration: float = 0.01,
           now: float = 0.0) -> list[Send]:
    w = s.tasks[key].processing_on.address
    step(s, ev.TaskStarted(w, key, now=now))
    return step(s, ev.TaskFinished(w, key, nbytes=nbytes, typename="int", start=now,
                                   stop=now + duration, now=now))


def where(s: SchedulerState, key: str) -> str:
    ts = s.tasks[key]
    if ts.state == "processing":
        return ts.processing_on.address
    (ws,) = ts.who_has
    return ws.address


def run_best_first(s: SchedulerState, first: list[str]) -> list[str]:
    """Run the graph to the end, each worker running its best-priority task like a real
    one would; return the keys in the order the scheduler sent them out."""
    sent = list(first)
    while True:
        running = [ts for ts in s.tasks.values() if ts.state == "processing"]
        if not running:
            return sent
        busy: dict = {}
        for ts in sorted(running, key=lambda t: t.priority):
            busy.setdefault(ts.processing_on, ts)
        for ts in busy.values():
            sent += computes(finish(s, ts.key))


def queued(s: SchedulerState) -> list[str]:
    return [ts.key for ts in sorted((t for t in s.tasks.values() if t.state == "queued"),
                                    key=lambda t: t.priority)]


# ================================================================ 1. static priorities
def test_scheduler_uses_static_order_not_key_order():
    """A tree reduction whose key names interleave the two branches::

                 total
                /     \\
             s-0       s-1
            /   \\     /   \\
          x-0   x-2  x-1   x-3

    One worker, one thread, saturation 1.0: the x's are root-ish and queued.
    With ``order()`` priorities a branch is finished before the next is started:
    x-0 x-2 s-0 x-1 x-3 s-1 total. With key order, x-1 would follow x-0 and
    both branches would be half-done at once.
    """
    deps = {"x-0": [], "x-1": [], "x-2": [], "x-3": [], "s-0": ["x-0", "x-2"],
            "s-1": ["x-1", "x-3"], "total": ["s-0", "s-1"]}
    s = cluster(A, worker_saturation=1.0)
    out = submit(s, deps, ["total"])
    o = order(deps)
    for k, ts in s.tasks.items():
        assert ts.priority == (1, 0, o[k])
    sent = run_best_first(s, computes(out))
    assert sent == ["x-0", "x-2", "s-0", "x-1", "x-3", "s-1", "total"]


def test_roots_go_out_in_priority_order_whatever_the_order_of_requested_keys():
    """Ten independent pairs, the requested keys listed in reverse::

        y-0  y-1  ...  y-9
         |    |         |
        x-0  x-1  ...  x-9

    Two workers of one thread (saturation 1.1: two slots each): the four x's with
    the best priorities go out first, the rest wait in the queue in order.
    """
    deps = {**{f"x-{i}": [] for i in range(10)}, **{f"y-{i}": [f"x-{i}"] for i in range(10)}}
    s = cluster(A, B, queue_block_size=1)  # dask's queuing (blocks: test_scheduler_blocks)
    out = submit(s, deps, [f"y-{i}" for i in range(10)][::-1])
    o = order(deps)
    xs = sorted((k for k in deps if k.startswith("x")), key=o.__getitem__)
    assert computes(out) == xs[:4]
    assert queued(s) == xs[4:]


# ================================================================ 2. fairness
def test_earlier_submission_runs_before_later_one_from_the_queue():
    """Two submissions of five roots each; the second comes while the first still
    waits in the queue::

        a-0 a-1 a-2 a-3 a-4      (update-graph 1)
        b-0 b-1 b-2 b-3 b-4      (update-graph 2)

    Static priorities of b-0 (0) beat those of a-1..a-4, but the generation comes
    first: all a's go out before any b.
    """
    s = cluster(A, worker_saturation=1.0)
    out = submit(s, {f"a-{i}": [] for i in range(5)}, [f"a-{i}" for i in range(5)])
    out += submit(s, {f"b-{i}": [] for i in range(5)}, [f"b-{i}" for i in range(5)])
    assert s.tasks["b-0"].priority[2] < s.tasks["a-1"].priority[2]
    sent = run_best_first(s, computes(out))
    assert sent == [f"a-{i}" for i in range(5)] + [f"b-{i}" for i in range(5)]


def test_priority_is_generation_then_user_priority_then_static():
    """dask's priority tuple ``(generation, -user priority, static priority)``; each
    update-graph is a new generation, ``submit`` and ``map`` included."""
    s = cluster(A)
    submit(s, {"a-0": [], "a-1": ["a-0"]}, ["a-1"])
    submit(s, {"b-0": []}, ["b-0"], priority=10)
    submit(s, {"c-0": []}, ["c-0"], static_priorities={"c-0": 7})
    assert s.tasks["a-1"].priority == (1, 0, 1)
    assert s.tasks["b-0"].priority == (2, -10, 0)
    assert s.tasks["c-0"].priority == (3, 0, 7)


def test_worker_runs_the_earlier_submission_first():
    """On a worker, busy with ``x``, two ready tasks arrive: ``late`` (generation 2)
    before ``early`` (generation 1). When the thread frees, ``early`` runs."""
    w = WorkerState(A, 1)
    assert [c.key for c in step(w, ev.ComputeTask("x", "f", priority=(1, 0, 0)))
            if type(c) is Execute] == ["x"]
    step(w, ev.ComputeTask("late", "f", priority=(2, 0, 0)))
    step(w, ev.ComputeTask("early", "f", priority=(1, 0, 5)))
    out = step(w, ev.ExecuteSuccess("x", 1, 8))
    assert [c.key for c in out if type(c) is Execute] == ["early"]


# ================================================================ 3. worker ready heap
def test_worker_runs_the_dependent_of_a_finished_task_next():
    """Worker a (one thread) runs ``L``; root ``z`` waits ready. Then ``x`` finishes
    on b and the scheduler sends its dependent ``y`` to a::

          y
          |
        x(on b)   z   L        static priorities: x 0, y 1, z 2, L 3

    When L ends, ``y`` runs before ``z`` although ``z`` was ready first (the
    ready heap by priority: depth-first, LIFO in effect); a first-in-first-out
    worker would run ``z``.
    """
    w = WorkerState(A, 1)
    out = step(w, ev.ComputeTask("L", "f", priority=(1, 0, 3)))
    assert [c.key for c in out if type(c) is Execute] == ["L"]
    step(w, ev.ComputeTask("z", "f", priority=(1, 0, 2)))
    out = step(w, ev.ComputeTask("y", "f", priority=(1, 0, 1), who_has={"x": [B]},
                                 nbytes={"x": 8}))
    assert [c.keys for c in out if type(c) is ev.GatherDep] == [["x"]]
    step(w, ev.GatherDepSuccess(B, {"x": 1}))
    out = step(w, ev.ExecuteSuccess("L", 1, 8))
    assert [c.key for c in out if type(c) is Execute] == ["y"]
    out = step(w, ev.ExecuteSuccess("y", 1, 8))
    assert [c.key for c in out if type(c) is Execute] == ["z"]


# ================================================================ 4. root-ish and queuing
@pytest.mark.parametrize("n, rootish", [(4, False), (5, True)])
def test_rootish_means_group_larger_than_twice_the_threads(n: int, rootish: bool):
    """``inc-0 .. inc-{n-1}``, no dependencies, on 2 one-thread workers: root-ish
    (and so queued beyond 2 x ceil(1.0 x 1) tasks) only when n > 2 x 2 threads."""
    s = cluster(A, B, worker_saturation=1.0)
    out = submit(s, {f"inc-{i}": [] for i in range(n)}, [f"inc-{i}" for i in range(n)])
    assert policies.is_rootish(s.tasks["inc-0"], s.total_nthreads) is rootish
    assert len(computes(out)) == (2 if rootish else n)
    assert len(queued(s)) == (n - 2 if rootish else 0)


@pytest.mark.parametrize("n_deps, rootish", [(4, True), (5, False)])
def test_rootish_allows_fewer_than_five_shared_dependencies(n_deps: int, rootish: bool):
    """Like ``from_zarr``: twelve loads sharing a few inputs (one thread)::

        load-0 load-1 ... load-11
           \\     |     /
          src-0 .. src-{n_deps-1}      (in memory; load-i needs src-(i % n_deps))

    Four distinct dependencies: still root-ish (queued); five: not.
    """
    s = cluster(A, worker_saturation=1.0)
    for j in range(n_deps):
        in_memory(s, f"src-{j}", A, 100)
    loads = {f"load-{i}": [f"src-{i % n_deps}"] for i in range(12)}
    submit(s, loads, list(loads))
    assert policies.is_rootish(s.tasks["load-0"], s.total_nthreads) is rootish
    n_processing = len(s.workers[A].processing)
    assert (n_processing == 1) is rootish
    assert bool(queued(s)) is rootish


def test_restrictions_disable_rootish():
    """Ten tasks, ``resources={"GPU": 1}``, on a worker declaring GPU=1: not
    root-ish (restricted), so none is queued (the worker limits concurrency)."""
    s = cluster((A, 1), worker_saturation=1.0, resources_of={A: {"GPU": 1}})
    out = submit(s, {f"gpu-{i}": [] for i in range(10)}, [f"gpu-{i}" for i in range(10)],
                 resources={"GPU": 1})
    assert len(computes(out)) == 10 and not queued(s)
    assert not policies.is_rootish(s.tasks["gpu-0"], s.total_nthreads)


@pytest.mark.parametrize("nthreads, saturation", [(1, 1.1), (4, 1.1), (10, 1.1), (3, 1.0),
                                                  (3, 2.0)])
def test_worker_gets_at_most_ceil_saturation_times_threads(nthreads: int, saturation: float):
    """100 root tasks on one worker: ceil(saturation x nthreads) go out, the rest
    are queued in priority order."""
    s = cluster((A, nthreads), worker_saturation=saturation)
    keys = [f"inc-{i}" for i in range(100)]
    out = submit(s, {k: [] for k in keys}, keys)
    slots = math.ceil(saturation * nthreads)
    assert computes(out) == keys[:slots]
    assert queued(s) == keys[slots:]


def test_queued_roots_wait_while_a_dependent_can_run():
    """One worker, one thread, saturation 1.0::

        y-0 y-1 y-2
         |   |   |
        x-0 x-1 x-2

    When x-0 finishes, its dependent y-0 takes the thread and x-1 stays queued;
    only when y-0 finishes does x-1 go out. The worker never holds two tasks.
    """
    deps = {**{f"x-{i}": [] for i in range(3)}, **{f"y-{i}": [f"x-{i}"] for i in range(3)}}
    s = cluster(A, worker_saturation=1.0, rootish_factor=1)
    out = submit(s, deps, [f"y-{i}" for i in range(3)])
    assert computes(out) == ["x-0"] and queued(s) == ["x-1", "x-2"]
    out = finish(s, "x-0")
    assert computes(out) == ["y-0"] and queued(s) == ["x-1", "x-2"]
    assert len(s.workers[A].processing) == 1
    out = finish(s, "y-0")
    assert computes(out) == ["x-1"]


def test_queue_released_to_the_worker_whose_thread_freed():
    """Two workers, 6 roots, saturation 1.0: when b finishes, the best queued task
    goes to b (a is still full)."""
    s = cluster(A, B, worker_saturation=1.0, queue_block_size=1)  # dask's queuing
    keys = [f"inc-{i}" for i in range(6)]
    out = submit(s, {k: [] for k in keys}, keys)
    assert sorted(computes(out)) == keys[:2]
    on_b = computes(out, to=B)[0]
    out = finish(s, on_b)
    assert computes(out, to=B) == [keys[2]] and not computes(out, to=A)


@pytest.mark.parametrize("duration, nbytes, held", [
    (1e-4, 8, 100),        # 10 ms of 100 us tasks (policies.SHORT_RUN)
    (1e-6, 8, 256),        # ... at most SHORT_RUN_TASKS per thread
    (1e-4, 100_000, 10),   # ... no more than 1 MiB of results (queue-block-bytes)
    (0.02, 8, 1),          # tasks of 20 ms: the slots, as in dask
])
def test_worker_holds_milliseconds_of_short_queued_roots(duration: float, nbytes: int,
                                                         held: int):
    """One worker, one thread, saturation 1.0, 1,000 root tasks: one goes out. Once the
    first has finished, its group's tasks are known to take ``duration`` seconds and give
    ``nbytes``: the worker then holds 10 ms of such tasks at once (one message), not one
    per round trip, within a megabyte of their results; long tasks keep it to its slot."""
    s = cluster(A, worker_saturation=1.0)
    keys = [f"inc-{i}" for i in range(1000)]
    out = submit(s, {k: [] for k in keys}, keys)
    assert computes(out) == keys[:1]
    out = finish(s, keys[0], nbytes=nbytes, duration=duration)
    assert computes(out) == keys[1:1 + held]  # in priority order
    assert len(s.workers[A].processing) == held
    assert queued(s) == keys[1 + held:]


def test_short_roots_held_within_their_bound_while_dependents_run():
    """Tasks of 100 us on one worker of one thread (saturation 1.0)::

        y-0 y-1 ... y-299
         |   |        |
        x-0 x-1 ... x-299

    The x's are queued; the worker, running its best-priority task each time, holds
    many x's at once once their duration is known, never more than 10 ms of them (100),
    and each y goes to it as its x finishes (no y is queued); every task runs once."""
    n = 300
    deps = {**{f"x-{i}": [] for i in range(n)}, **{f"y-{i}": [f"x-{i}"] for i in range(n)}}
    s = cluster(A, worker_saturation=1.0, rootish_factor=1)
    out = submit(s, deps, [f"y-{i}" for i in range(n)])
    sent = computes(out)
    most = 0
    while True:
        running = sorted((ts for ts in s.tasks.values() if ts.state == "processing"),
                         key=lambda t: t.priority)
        if not running:
            break
        xs = sum(ts.key.startswith("x") for ts in running)
        assert xs <= 100
        most = max(most, xs)
        assert not [ts for ts in s.tasks.values() if ts.state == "queued" and ts.key[0] == "y"]
        sent += computes(finish(s, running[0].key, duration=1e-4))
    assert most == 100
    assert sorted(sent) == sorted(deps)
    assert all(s.tasks[f"y-{i}"].state == "memory" for i in range(n))


# ================================================================ 5. co-assignment, Mars
SEED_GRAPH = {
    # the seed's example, with key numbers that interleave the siblings
    "X": [],
    "load-0": ["X"], "load-1": ["X"], "load-2": ["X"], "load-3": ["X"],
    "inc-0": ["load-0"], "inc-1": ["load-1"], "inc-2": ["load-2"], "inc-3": ["load-3"],
    "sum-0": ["inc-0", "inc-2"], "sum-1": ["inc-1", "inc-3"],
}


def test_co_assignment_puts_siblings_on_one_worker():
    """The seed's example, queuing off (``worker-saturation: inf``)::

             sum-0         sum-1
             /    \\        /    \\
         inc-0   inc-2  inc-1   inc-3
           |       |      |       |
        load-0  load-2  load-1  load-3
            \\       \\    /       /
                       X

    ``load-0``/``load-2`` feed one sum, ``load-1``/``load-3`` the other. Taken in
    priority order in batches of len(group)/threads per worker, each pair lands
    on one worker (root-ish factor 1 so that four loads are root-ish on 2 threads).
    """
    s = cluster(A, B, worker_saturation=math.inf, rootish_factor=1)
    assert s.rootish_policy == "co-assign"
    out = submit(s, SEED_GRAPH, ["sum-0", "sum-1"])
    assert computes(out) == ["X"]
    out = finish(s, "X")
    assert len(computes(out)) == 4
    assert where(s, "load-0") == where(s, "load-2")
    assert where(s, "load-1") == where(s, "load-3")
    assert where(s, "load-0") != where(s, "load-1")
    run_best_first(s, [])
    assert s.tasks["sum-0"].state == s.tasks["sum-1"].state == "memory"


def test_co_assignment_batches_follow_priority_on_a_larger_reduction():
    """Sixteen roots reduced in pairs (default factor 2; 2 workers x 1 thread), keys
    interleaved so that ``r-i`` pairs with ``r-(i+8)``::

        p-0      p-1     ...   p-7
        / \\      / \\            / \\
      r-0 r-8  r-1 r-9   ...  r-7 r-15

    Batches of 8: every pair shares its worker, each worker gets 8 roots.
    """
    deps = {f"r-{i}": [] for i in range(16)}
    deps.update({f"p-{i}": [f"r-{i}", f"r-{i + 8}"] for i in range(8)})
    s = cluster(A, B, worker_saturation=math.inf)
    out = submit(s, deps, [f"p-{i}" for i in range(8)])
    assert len(computes(out)) == 16
    for i in range(8):
        assert where(s, f"r-{i}") == where(s, f"r-{i + 8}"), i
    assert len(s.workers[A].processing) == len(s.workers[B].processing) == 8


def test_mars_policy_assigns_roots_by_breadth_first_search():
    """``rootish-policy: mars``: initial tasks go where Mars' BFS put them, even
    balance per worker (not per thread, unlike co-assignment)::

        p-0     p-1    p-2    p-3    p-4
        / \\     / \\    / \\    / \\    / \\
      r-0 r-5 r-1 r-6 ...            r-4 r-9

    a has 3 threads, b 1: co-assignment would give a 7 roots (its share of
    threads); Mars gives each 5, siblings together.
    """
    deps = {f"r-{i}": [] for i in range(10)}
    deps.update({f"p-{i}": [f"r-{i}", f"r-{i + 5}"] for i in range(5)})
    s = cluster((A, 3), (B, 1), worker_saturation=math.inf, rootish_policy="mars")
    out = submit(s, deps, [f"p-{i}" for i in range(5)])
    expected = assign_initial(deps, [A, B])
    assert s.mars_assignment == expected
    assert {k: where(s, k) for k in expected} == expected
    assert sorted(len(computes(out, to=w)) for w in (A, B)) == [5, 5]
    assert sum(where(s, f"r-{i}") == where(s, f"r-{i + 5}") for i in range(5)) >= 4


def test_co_assignment_skips_a_worker_that_left():
    """A TaskGroup remembers the worker of its last batch; if that worker leaves,
    its tasks and the next ones go to a current worker."""
    s = cluster(A, B, worker_saturation=math.inf)
    submit(s, {f"inc-{i}": [] for i in range(5)}, [f"inc-{i}" for i in range(5)])
    gone = s.groups["inc"].last_worker.address
    step(s, ev.RemoveWorker(gone))
    submit(s, {"inc-9": []}, ["inc-9"])
    assert all(where(s, f"inc-{i}") != gone for i in (*range(5), 9))


# ================================================================ 6. decide_worker
def in_memory(s: SchedulerState, key: str, worker: str, nbytes: int) -> None:
    """Put ``key`` (with a client holding it) in memory on ``worker`` (via scatter)."""
    step(s, ev.ScatterData("c", f"sc-{key}", {key: b""}, {key: nbytes}, workers=[worker]))
    step(s, ev.AddKeys(worker, {key: nbytes}, scatter_id=f"sc-{key}"))
    assert where(s, key) == worker


def test_decide_worker_prefers_the_holder_of_the_larger_input():
    """``z`` needs ``p`` (100 MB, on a) and ``q`` (1 MB, on b)::

          z
         / \\
        p   q

    Moving 1 MB costs less than 100 MB: z goes to a, although a stores more
    bytes (the tie-break alone would pick b)."""
    s = cluster(A, B, C)
    in_memory(s, "p", A, 100 * MB)
    in_memory(s, "q", B, 1 * MB)
    out = submit(s, {"z": ["p", "q"]}, ["z"])
    assert computes(out, to=A) == ["z"]


def test_decide_worker_avoids_a_busy_holder():
    """``z`` needs ``p`` (on a) and ``q`` (on b), 1 MB each; a is busy with two
    ``slow`` tasks measured at 5 s each. z goes to b, where it starts sooner,
    although b stores more bytes (the tie-break alone would pick a); idle c holds
    nothing and is not a candidate."""
    s = cluster(A, B, C)
    in_memory(s, "p", A, MB)
    in_memory(s, "q", B, MB)
    in_memory(s, "extra", B, 10 * MB)
    # a measured duration for the slow group: 5 s
    out = submit(s, {"slow-0": ["p"]}, ["slow-0"])
    assert computes(out, to=A) == ["slow-0"]
    finish(s, "slow-0", duration=5.0)
    out = submit(s, {"slow-1": ["p"], "slow-2": ["p"]}, ["slow-1", "slow-2"])
    assert sorted(computes(out, to=A)) == ["slow-1", "slow-2"]
    assert s.workers[A].occupancy == pytest.approx(10.0)
    out = submit(s, {"z": ["p", "q"]}, ["z"])
    assert computes(out) == ["z"] and where(s, "z") == B


def test_decide_worker_ties_go_to_the_worker_storing_fewer_bytes():
    """Equal inputs on a and b, equal (no) occupancy; a also stores a 50 MB result:
    ``z`` goes to b."""
    for big_on, other in ((A, B), (B, A)):
        s = cluster(A, B, C)
        in_memory(s, "big", big_on, 50 * MB)
        in_memory(s, "p", A, MB)
        in_memory(s, "q", B, MB)
        out = submit(s, {"z": ["p", "q"]}, ["z"])
        assert computes(out, to=other) == ["z"]
        # the objective says why: same start time, fewer bytes stored on the other
        out = submit(s, {"z2": ["p", "q"]}, ["z2"], workers=["c"])
        ts = s.tasks["z2"]
        o_big = policies.worker_objective(ts, s.workers[big_on], s.bandwidth)
        o_other = policies.worker_objective(ts, s.workers[other], s.bandwidth)
        assert o_big[0] == pytest.approx(o_other[0] - s.workers[other].occupancy)
        assert o_other[1] < o_big[1]


def test_task_without_dependencies_goes_to_the_least_occupied_worker():
    s = cluster(A, B)
    submit(s, {"busy-0": [], "busy-1": []}, ["busy-0", "busy-1"], workers=[A])
    out = submit(s, {"free": []}, ["free"])
    assert computes(out, to=B) == ["free"]


def test_workers_restriction_beats_data_locality():
    """``z`` depends on ``p`` held by a, but ``workers=["b"]`` (a name): z runs on b."""
    s = cluster(A, B)
    in_memory(s, "p", A, MB)
    out = submit(s, {"z": ["p"]}, ["z"], workers=["b"])
    assert computes(out, to=B) == ["z"]


def test_resources_are_respected_and_wait_for_a_worker_that_declares_them():
    """``resources={"GPU": 1}``: only b declares a GPU; with no such worker the task
    waits (no-worker) until one joins."""
    s = cluster(A, (B, 1), resources_of={B: {"GPU": 2}})
    out = submit(s, {"train": []}, ["train"], resources={"GPU": 1})
    assert computes(out, to=B) == ["train"]
    out = submit(s, {"big": []}, ["big"], resources={"GPU": 4})
    assert not computes(out) and s.tasks["big"].state == "no-worker"
    out = step(s, ev.AddWorker(C, 1, name="c", resources={"GPU": 8}))
    assert computes(out, to=C) == ["big"]


def test_worker_runs_one_task_per_declared_resource_unit():
    """A worker with 2 threads and GPU=1 gets two GPU tasks: one runs, the other
    waits for the GPU, not for a thread; an unrestricted task takes the free thread."""
    w = WorkerState(A, 2, resources={"GPU": 1})
    out = step(w, ev.ComputeTask("g1", "f", priority=(1, 0, 0), resource_restrictions={"GPU": 1}))
    out += step(w, ev.ComputeTask("g2", "f", priority=(1, 0, 1),
                                  resource_restrictions={"GPU": 1}))
    assert [c.key for c in out if type(c) is Execute] == ["g1"]
    out = step(w, ev.ComputeTask("cpu", "f", priority=(1, 0, 2)))
    assert [c.key for c in out if type(c) is Execute] == ["cpu"]
    out = step(w, ev.ExecuteSuccess("g1", 1, 8))
    assert [c.key for c in out if type(c) is Execute] == ["g2"]


# ================================================================ 7. work stealing
def backlog(nbytes: int, thief_threads: int = 1
            ) -> tuple[SchedulerState, dict[str, WorkerState]]:
    """a holds ``p`` (nbytes); four tasks need it, so all go to a (1 thread); b idle::

        t-0 t-1 t-2 t-3
          \\  \\  /  /
              p  (on a)

    Real WorkerStates answer for a and b.
    """
    s = cluster(A, (B, thief_threads), work_stealing=True)
    workers = {A: WorkerState(A, 1), B: WorkerState(B, thief_threads)}
    in_memory(s, "p", A, nbytes)
    step(workers[A], ev.UpdateData({"p": b"x"}))
    out = submit(s, {f"t-{i}": ["p"] for i in range(4)}, [f"t-{i}" for i in range(4)])
    assert sorted(computes(out, to=A)) == [f"t-{i}" for i in range(4)]
    deliver(s, workers, out)
    return s, workers


def deliver(s: SchedulerState, workers: dict[str, WorkerState], out: list) -> list:
    """Carry scheduler messages to the WorkerStates (transfers between them succeed at
    once) and their replies back, except task results, which tests send; returns the
    keys of the Execute commands issued."""
    executed = []
    while out:
        nxt = []
        for m in out:
            if type(m) is Execute:
                executed.append(m.key)
                continue
            if m.to not in workers:
                continue
            op = m.wire()["op"]
            if op in SCHEDULER_TO_WORKER:
                event = decode(SCHEDULER_TO_WORKER, m.wire())
                replies = step(workers[m.to], event)
                for c in replies:
                    if type(c) is ev.GatherDep:  # the peer hands its data over
                        peer = workers[c.worker]
                        replies += step(workers[m.to], ev.GatherDepSuccess(
                            c.worker, {k: peer.data[k] for k in c.keys}))
                    elif type(c) is Execute:
                        executed.append(c.key)
                    elif type(c) is Send and c.wire()["op"] == "steal-response":
                        nxt += step(s, decode(WORKER_TO_SCHEDULER, c.wire(), worker=m.to))
                    elif type(c) is Send and c.wire()["op"] == "task-started":
                        nxt += step(s, ev.TaskStarted(m.to, c.wire()["key"]))
        out = nxt
    return executed


def test_idle_worker_steals_cheap_backlog():
    """1 KB input, tasks of 0.5 s (the default estimate): moving is cheap, so b
    takes not-started tasks from a; a keeps the one it runs."""
    s, workers = backlog(1000)
    out = step(s, ev.Tick(now=1.0))
    reqs = [m.wire()["key"] for m in out if m.wire()["op"] == "steal-request"]
    assert reqs and all(m.to == A for m in out if m.wire()["op"] == "steal-request")
    assert "t-0" not in reqs  # running on a
    executed = deliver(s, workers, out)
    moved = [k for k in reqs if where(s, k) == B]
    assert moved and executed == moved[:1]  # b runs one (one thread) and holds the rest
    assert len(s.workers[B].processing) <= s.workers[B].nthreads


def test_no_stealing_when_transfer_costs_more_than_the_work():
    """Same backlog but the input is 1 GB (10 s at 100 MB/s, tasks of 0.5 s)."""
    s, _ = backlog(1_000_000_000)
    out = step(s, ev.Tick(now=1.0))
    assert not [m for m in out if m.wire()["op"] == "steal-request"]


def test_no_stealing_of_tiny_tasks_whose_input_must_move():
    """a holds ``p`` (8 bytes) and three tasks of a group known to take 10 µs, b is idle.
    Moving 8 bytes takes no time at the bandwidth, but a move costs a request, a reply
    and a transfer (a latency, as in dask's stealing): far more than running the task
    where its input is. With an input already on b the same tasks move."""
    s = cluster(A, B, work_stealing=True)
    in_memory(s, "p", A, 8)
    submit(s, {"t-0": ["p"]}, ["t-0"])
    finish(s, "t-0", duration=1e-5)
    out = submit(s, {f"t-{i}": ["p"] for i in range(1, 4)}, [f"t-{i}" for i in range(1, 4)])
    assert sorted(computes(out, to=A)) == ["t-1", "t-2", "t-3"]
    assert not [m for m in step(s, ev.Tick(now=1.0)) if m.wire()["op"] == "steal-request"]
    # the input is on b too: nothing moves but the task, which b may as well run
    step(s, ev.AddKeys(B, {"p": 8}))
    assert [m.to for m in step(s, ev.Tick(now=2.0)) if m.wire()["op"] == "steal-request"]


def test_stealing_off_sends_no_request():
    s, _ = backlog(1000)
    s.maintenance.work_stealing = False
    assert not [m for m in step(s, ev.Tick(now=1.0)) if m.wire()["op"] == "steal-request"]


def test_steal_handshake_never_runs_a_task_twice():
    """b (3 idle threads) asks for t-1, t-2, t-3; before the requests reach a, a
    finishes t-0 and t-1 and starts t-2. The three races of the handshake:

    * t-1 finished before the request: a answers "memory", the result stands;
    * t-2 started before the request: a answers "executing" and keeps it;
    * t-3 not started: a gives it up ("released") and b runs it.

    Every task executes exactly once across both workers.
    """
    s, workers = backlog(1000, thief_threads=3)
    reqs = [m for m in step(s, ev.Tick(now=1.0)) if m.wire()["op"] == "steal-request"]
    assert sorted(m.wire()["key"] for m in reqs) == ["t-1", "t-2", "t-3"]
    ran = ["t-0"]
    responses: dict = {}

    def on_worker(w: str, event: Any) -> None:
        for c in step(workers[w], event):
            if type(c) is Execute:
                ran.append(c.key)
                continue
            msg = c.wire()  # as it goes on the wire
            op = msg["op"]
            if op == "steal-response":
                responses[msg["key"]] = msg["state"]
            if op in ("steal-response", "task-started", "task-finished"):
                event = decode(WORKER_TO_SCHEDULER, msg, worker=w)
                ran.extend(deliver(s, workers, step(s, event)))

    on_worker(A, ev.ExecuteSuccess("t-0", 1, 8))
    on_worker(A, ev.ExecuteSuccess("t-1", 1, 8))
    assert ran == ["t-0", "t-1", "t-2"]
    for m in reqs:
        on_worker(A, ev.StealRequest(m.wire()["key"]))
    assert responses == {"t-1": "memory", "t-2": "executing", "t-3": "released"}
    assert where(s, "t-2") == A and where(s, "t-3") == B
    on_worker(A, ev.ExecuteSuccess("t-2", 1, 8))
    on_worker(B, ev.ExecuteSuccess("t-3", 1, 8))
    assert sorted(ran) == ["t-0", "t-1", "t-2", "t-3"]
    assert all(s.tasks[f"t-{i}"].state == "memory" for i in range(4))
    assert [where(s, f"t-{i}") for i in range(4)] == [A, A, A, B]


# ================================================================ 10. configuration
def knobs() -> dict:
    """The scheduling knobs as a Scheduler built now sees them (not started)."""
    from hpcsched.core import config
    from hpcsched.core.scheduler.server import Scheduler

    st = Scheduler("inproc://").state
    return {"saturation": st.settings.worker_saturation, "policy": st.rootish_policy,
            "stealing": st.work_stealing, "fuse": config.get("scheduler.fuse"),
            "block": st.blocks.limit, "block_bytes": st.blocks.max_bytes}


def test_config_defaults(clean_config: Any):
    assert knobs() == {"saturation": 1.1, "policy": "queue", "stealing": True, "fuse": True,
                       "block": 4, "block_bytes": 2**20}


def test_config_yaml_then_env_then_kwargs(clean_config: Any, monkeypatch: pytest.MonkeyPatch):
    """defaults < YAML (``HPCSCHED_CONFIG``) < ``HPCSCHED_…`` environment < keyword
    arguments, for each scheduling knob."""
    from hpcsched.core import config
    from hpcsched.core.scheduler.server import Scheduler

    path = clean_config / "sched.yaml"
    path.write_text("scheduler:\n  worker-saturation: 2.0\n  rootish-policy: mars\n"
                    "  work-stealing: false\n  fuse: false\n  queue-block-size: 4\n"
                    "  queue-block-bytes: 64 kB\n")
    monkeypatch.setenv("HPCSCHED_CONFIG", str(path))
    config.refresh()
    assert knobs() == {"saturation": 2.0, "policy": "mars", "stealing": False, "fuse": False,
                       "block": 4, "block_bytes": 64_000}

    monkeypatch.setenv("HPCSCHED_SCHEDULER__WORKER_SATURATION", "inf")
    monkeypatch.setenv("HPCSCHED_SCHEDULER__ROOTISH_POLICY", "queue")
    monkeypatch.setenv("HPCSCHED_SCHEDULER__WORK_STEALING", "true")
    monkeypatch.setenv("HPCSCHED_SCHEDULER__FUSE", "true")
    monkeypatch.setenv("HPCSCHED_SCHEDULER__QUEUE_BLOCK_SIZE", "1")
    monkeypatch.setenv("HPCSCHED_SCHEDULER__QUEUE_BLOCK_BYTES", "4MiB")
    # queuing needs a finite saturation: inf turns "queue" into co-assignment
    assert knobs() == {"saturation": math.inf, "policy": "co-assign", "stealing": True,
                       "fuse": True, "block": 1, "block_bytes": 4 * 2**20}

    st = Scheduler("inproc://", worker_saturation=1.0, rootish_policy="queue",
                   work_stealing=False, queue_block_size=8, queue_block_bytes=100).state
    assert (st.settings.worker_saturation, st.rootish_policy, st.work_stealing) == (1.0, "queue", False)
    assert (st.blocks.limit, st.blocks.max_bytes) == (8, 100)
    assert config.get("scheduler.fuse", False) is False


@pytest.mark.timeout(30)
def test_the_environment_is_read_at_every_get(clean_config: Any, monkeypatch: pytest.MonkeyPatch):
    """Settings read from the environment follow it as a program changes it (what is
    remembered is only how a name and a text parse), and a parsed list is the caller's own."""
    from hpcsched.core import config

    assert config.get("comm.max-frames") == config.DEFAULTS["comm.max-frames"]
    monkeypatch.setenv("HPCSCHED_COMM__MAX_FRAMES", "7")
    assert config.get("comm.max-frames") == 7
    monkeypatch.setenv("HPCSCHED_COMM__MAX_FRAMES", "9")
    assert config.get("comm.max-frames") == 9
    monkeypatch.delenv("HPCSCHED_COMM__MAX_FRAMES")
    assert config.get("comm.max-frames") == config.DEFAULTS["comm.max-frames"]
    monkeypatch.setenv("HPCSCHED_SCHEDULER__EXTENSIONS", "[a, b]")
    first = config.get("scheduler.extensions")
    first.append("c")
    assert config.get("scheduler.extensions") == ["a", "b"]


def test_worker_saturation_from_the_environment_drives_queuing(
        clean_config: Any, monkeypatch: pytest.MonkeyPatch):
    """``HPCSCHED_SCHEDULER__WORKER_SATURATION=1.0``: a 2-thread worker gets
    ceil(1.0 x 2) = 2 of 10 root tasks, not ceil(1.1 x 2) = 3."""
    from hpcsched.core.scheduler.server import Scheduler

    monkeypatch.setenv("HPCSCHED_SCHEDULER__WORKER_SATURATION", "1.0")
    s = Scheduler("inproc://").state
    step(s, ev.AddWorker(A, 2))
    step(s, ev.AddClient("c"))
    out = submit(s, {f"inc-{i}": [] for i in range(10)}, [f"inc-{i}" for i in range(10)])
    assert len(computes(out)) == 2
