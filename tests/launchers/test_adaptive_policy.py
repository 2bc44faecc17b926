"""The adaptive policy on simulated state: one test per rule, no processes.

Snapshots are drawn by hand (``W`` a worker, ``D`` waiting tasks) except in the last
tests, which read a real :class:`SchedulerState` driven by events.
"""

from __future__ import annotations

import math
import threading

import pytest

from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState
from hpcsched.core.units import parse_interval
from hpcsched.launchers.adaptive import Adaptive
from hpcsched.launchers.adaptive_policy import (
    Policy,
    Snapshot,
    TaskDemand,
    WorkerSnapshot,
    recommend,
    snapshot_state,
)

MB = 2**20


def W(address: str, **kw) -> WorkerSnapshot:  # noqa: N802 - reads like a drawing
    return WorkerSnapshot(address=address, name=kw.pop("name", address), **kw)


def D(count: int, duration: float = 1.0, **kw) -> TaskDemand:  # noqa: N802
    return TaskDemand(kw.pop("group", "inc"), count, duration, **kw)


def snap(*workers: WorkerSnapshot, demand=(), requested=None) -> Snapshot:
    return Snapshot(workers=tuple(workers), demand=tuple(demand), requested=requested)


def run(s: Snapshot, policy: Policy, times: int) -> list:
    """``times`` consecutive recommendations on the same state, hysteresis carried over."""
    out, counts = [], {}
    for _ in range(times):
        r = recommend(s, policy, counts)
        counts = r.close_counts
        out.append(r)
    return out


# ---------------------------------------------------------------- growth
def test_no_workers_and_tasks_waiting_asks_for_one_unit():
    r = recommend(snap(demand=[D(50)]), Policy())
    assert (r.action, r.target, r.kind) == ("up", 1, "no-workers")
    r = recommend(snap(demand=[D(50)]), Policy(workers_per_unit=3))
    assert (r.action, r.target) == ("up", 3)


def test_backlog_above_target_duration_grows_by_the_scale_factor():
    # 2 one-thread workers busy, 20 more tasks of 1 s: 10 s of backlog > 5 s
    s = snap(W("a", processing=1), W("b", processing=1), demand=[D(20)])
    r = recommend(s, Policy(target_duration=5))
    assert (r.action, r.target, r.kind) == ("up", 4, "backlog")
    assert "backlog 10 s > target 5 s (20 tasks waiting)" in r.reason
    r = recommend(s, Policy(target_duration=5, scale_factor=3))
    assert r.target == 6


def test_backlog_below_target_duration_does_not_grow():
    s = snap(W("a", processing=1), W("b", processing=1), demand=[D(8)])  # 4 s < 5 s
    r = recommend(s, Policy(target_duration=5))
    assert r.action == "none"


def test_backlog_counts_tasks_assigned_beyond_a_workers_threads():
    # no queued tasks, but 13 tasks assigned to a 1-thread worker: 12 s of waiting work
    s = snap(W("a", processing=13, waiting_tasks=12, waiting_work=12.0))
    assert s.backlog == 12.0
    r = recommend(s, Policy(target_duration=5))
    assert (r.action, r.target) == ("up", 2)


def test_backlog_uses_the_duration_of_each_task_group():
    short = snap(W("a", processing=1), demand=[D(100, 0.01, group="fast")])  # 1 s
    assert recommend(short, Policy(target_duration=5)).action == "none"
    mixed = snap(W("a", processing=1), demand=[D(100, 0.01, group="fast"),
                                               D(5, 2.0, group="slow")])  # 11 s
    assert recommend(mixed, Policy(target_duration=5)).action == "up"


def test_gpu_tasks_waiting_for_gpus_are_backlog_though_threads_are_free():
    """A worker with 16 threads and 2 GPUs given 16 one-GPU tasks of 10 s runs 2; 14 wait
    for a GPU with threads to spare: 70 s of backlog over its 2 GPUs, and the 16 tasks
    would keep 8 such workers busy."""
    gpu = W("g", nthreads=16, processing=16, resources={"GPU": 2}, used_resources={"GPU": 16},
            resource_waiting={"GPU": (14, 140.0)})
    s = snap(gpu)
    assert s.n_waiting == 14 and s.backlog == 70.0
    r = recommend(s, Policy(target_duration=5, scale_factor=2))
    assert (r.action, r.target, r.kind) == ("up", 2, "backlog")
    r = recommend(s, Policy(target_duration=5, scale_factor=100))
    assert r.target == 8  # one GPU-task pair per worker


def test_ready_gpu_tasks_are_weighed_against_the_gpus_not_the_threads():
    # 64 threads and 1 GPU, 10 one-GPU tasks of 2 s queued: 20 s for the one GPU
    s = snap(W("g", nthreads=64, processing=1, resources={"GPU": 1}, used_resources={"GPU": 1}),
             demand=[D(10, 2.0, resources={"GPU": 1})])
    assert s.backlog == 20.0
    assert recommend(s, Policy(target_duration=5)).action == "up"
    # the same tasks without a GPU need: 20 s over 64 threads is no backlog
    cpu = snap(W("c", nthreads=64, processing=1), demand=[D(10, 2.0)])
    assert recommend(cpu, Policy(target_duration=5)).action == "none"


def test_growth_never_asks_for_more_workers_than_there_are_tasks():
    s = snap(W("a", processing=1), demand=[D(2, 10.0)])  # 3 tasks for 1-thread workers
    assert recommend(s, Policy(scale_factor=10)).target == 3
    two_threads = snap(W("a", nthreads=2, processing=2), demand=[D(2, 10.0)])
    assert recommend(two_threads, Policy(scale_factor=10)).target == 2


def test_growth_is_capped_at_maximum_and_then_waits():
    s = snap(W("a", processing=1), W("b", processing=1), W("c", processing=1),
             demand=[D(100)])
    r = recommend(s, Policy(maximum=4))
    assert (r.action, r.target) == ("up", 4)
    at_max = snap(*s.workers, W("d", processing=1), demand=[D(100)])
    r = recommend(at_max, Policy(maximum=4))
    assert (r.action, r.kind) == ("none", "at-maximum")


def test_memory_nearly_full_grows_without_backlog():
    s = snap(W("a", memory_limit=100 * MB, nbytes=85 * MB, n_keys=3),
             W("b", memory_limit=100 * MB, nbytes=80 * MB, n_keys=3))
    r = recommend(s, Policy(memory_high=0.8))
    assert (r.action, r.target, r.kind) == ("up", 4, "memory")
    assert "memory 82% of limits > 80%" in r.reason
    assert recommend(s, Policy(memory_high=0.9)).action != "up"


def test_growth_counts_in_whole_units():
    s = snap(W("a", processing=1, unit="j1"), W("b", processing=1, unit="j1"),
             W("c", processing=1, unit="j2"), demand=[D(100)])
    r = recommend(s, Policy(workers_per_unit=2))
    assert (r.action, r.target) == ("up", 6)  # ceil(3 * 2 / 2) jobs of 2
    r = recommend(s, Policy(workers_per_unit=2, maximum=5))
    assert r.target == 4  # maximum 5 workers = 2 whole jobs


# ---------------------------------------------------------------- pending capacity
def test_pending_workers_count_as_requested_capacity():
    # 1 connected + 1 pending: doubling to 2 is already asked for
    s = snap(W("a", processing=1), demand=[D(100)], requested=2)
    r = recommend(s, Policy())
    assert (r.action, r.kind) == ("none", "pending")
    assert "1 requested workers not yet connected" in r.reason
    # growth is measured from connected workers, not from the requested total
    s = snap(W("a", processing=1), demand=[D(100)], requested=3)
    assert recommend(s, Policy()).action == "none"


def test_a_slow_queue_never_makes_it_submit_again():
    """Nothing connects for many intervals: the first request stands, nothing more."""
    policy = Policy(maximum=4)
    requested = 0
    for _ in range(20):
        r = recommend(snap(demand=[D(50)], requested=requested), policy)
        if r.action == "up":
            requested = r.target
    assert requested == 1
    # and with one worker running and the rest stuck: at most doubling, never beyond
    requested = 1
    for _ in range(20):
        r = recommend(snap(W("a", processing=1), demand=[D(50)], requested=requested), policy)
        assert r.action != "down"
        if r.action == "up":
            requested = r.target
    assert requested == 2


# ---------------------------------------------------------------- bounds
def test_minimum_is_kept_even_without_work():
    r = recommend(snap(), Policy(minimum=2))
    assert (r.action, r.target, r.kind) == ("up", 2, "minimum")
    r = recommend(snap(), Policy(minimum=3, workers_per_unit=2))
    assert r.target == 4  # whole jobs


def test_never_shrinks_below_minimum():
    s = snap(W("a"), W("b"), W("c"))
    rs = run(s, Policy(minimum=2, wait_count=1), 1)
    assert rs[0].action == "down" and len(rs[0].retire) == 1


def test_above_maximum_drops_pending_first_then_the_least_busy():
    s = snap(W("a", processing=3), W("b", processing=0), W("c", processing=1), requested=5)
    r = recommend(s, Policy(maximum=1))
    assert (r.action, r.kind, r.cancel_pending) == ("down", "maximum", 2)
    assert r.retire == ("b", "c") and r.target == 1


def test_bad_bounds_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="minimum=5 is above maximum=2"):
        Policy(minimum=5, maximum=2)
    with pytest.raises(ValueError, match="less than one job of 4 worker processes"):
        Policy(maximum=2, workers_per_unit=4)
    with pytest.raises(ValueError, match="rounds up to 4 workers"):
        Policy(minimum=3, maximum=3, workers_per_unit=2)
    with pytest.raises(ValueError, match="wait_count"):
        Policy(wait_count=0)
    with pytest.raises(ValueError, match="scale_factor"):
        Policy(scale_factor=0.5)
    with pytest.raises(ValueError, match="memory_high"):
        Policy(memory_high=1.5)
    with pytest.raises(ValueError, match="not be negative"):
        Policy(minimum=-1)
    assert Policy(maximum=5, workers_per_unit=2).max_workers == 4
    assert Policy(maximum=math.inf).max_workers == math.inf


# ---------------------------------------------------------------- shrink
def test_idle_workers_retire_only_after_wait_count_consecutive_recommendations():
    s = snap(W("a"), W("b"), W("c"))
    rs = run(s, Policy(wait_count=3), 3)
    assert [r.action for r in rs] == ["none", "none", "down"]
    assert [r.kind for r in rs[:2]] == ["idle-wait", "idle-wait"]
    assert set(rs[2].retire) == {"a", "b", "c"} and rs[2].target == 0


def test_hysteresis_counts_consecutive_recommendations_only():
    idle = snap(W("a"), W("b", processing=1))
    busy = snap(W("a", processing=1), W("b", processing=1))
    policy = Policy(wait_count=2)
    r1 = recommend(idle, policy, {})
    assert r1.action == "none" and r1.close_counts == {"a": 1}
    r2 = recommend(busy, policy, r1.close_counts)  # interrupted: the count starts again
    assert r2.close_counts == {}
    r3 = recommend(idle, policy, r2.close_counts)
    assert r3.action == "none"
    r4 = recommend(idle, policy, r3.close_counts)
    assert r4.action == "down" and r4.retire == ("a",)


def test_growth_resets_the_hysteresis():
    r = recommend(snap(W("a", processing=1), demand=[D(100)]), Policy(), {"b": 2})
    assert r.action == "up" and r.close_counts == {}


def test_shrink_retires_the_idle_workers_with_the_least_data():
    s = snap(W("a", nbytes=300, n_keys=1), W("b", nbytes=0), W("c", nbytes=20, n_keys=1),
             W("d", nbytes=10, n_keys=1))
    (r,) = run(s, Policy(minimum=2, wait_count=1), 1)
    assert r.retire == ("b", "d")


def test_a_worker_holding_data_is_never_retired_without_a_survivor():
    s = snap(W("a", nbytes=5, n_keys=1), W("b", nbytes=50, n_keys=2), W("c", nbytes=7, n_keys=1))
    (r,) = run(s, Policy(wait_count=1), 1)
    assert set(r.retire) == {"a", "c"}  # b, with the most data, takes theirs
    (r,) = run(snap(W("b", nbytes=50, n_keys=2)), Policy(wait_count=1), 1)
    assert r.action == "none"
    (r,) = run(snap(W("a"), W("b")), Policy(wait_count=1), 1)  # no data: all may go
    assert set(r.retire) == {"a", "b"}


def test_shrink_keeps_enough_memory_for_the_data():
    # 150 MB stored; survivors must hold it below 80% of their limits (>= 187.5 MB)
    s = snap(*(W(x, memory_limit=100 * MB, nbytes=50 * MB, n_keys=1) for x in "abc"))
    (r,) = run(s, Policy(memory_high=0.8, wait_count=1), 1)
    assert len(r.retire) == 1


def test_busy_workers_and_runnable_tasks_prevent_shrinking():
    s = snap(W("a", processing=1), W("b"), demand=[D(3, 0.1)])  # b could take those tasks
    assert run(s, Policy(wait_count=1), 1)[0].action == "none"
    s = snap(W("a", processing=1), W("b"))
    assert run(s, Policy(wait_count=1), 1)[0].retire == ("b",)


def test_workers_holding_resources_that_waiting_tasks_need_are_not_idle():
    gpu = W("gpu", resources={"GPU": 1})
    # a GPU task waits for its dependency (running on "a"): the GPU worker must stay
    demand = [D(1, ready=False, resources={"GPU": 1})]
    s = snap(W("a", processing=1), gpu, W("cpu"), demand=demand)
    (r,) = run(s, Policy(wait_count=1), 1)
    assert r.retire == ("cpu",)
    # unrestricted tasks waiting for dependencies do not pin anyone
    s = snap(W("a", processing=1), gpu, W("cpu"), demand=[D(1, ready=False)])
    assert set(run(s, Policy(wait_count=1), 1)[0].retire) == {"gpu", "cpu"}


def test_workers_named_by_waiting_tasks_are_not_idle():
    demand = [D(2, ready=False, workers=frozenset({"w-b"}))]
    s = snap(W("a", processing=1), W("tcp://b", name="w-b"), W("c"), demand=demand)
    (r,) = run(s, Policy(wait_count=1), 1)
    assert r.retire == ("c",)
    loose = [D(2, ready=False, workers=frozenset({"w-b"}), loose=True)]
    s = snap(W("a", processing=1), W("tcp://b", name="w-b"), W("c"), demand=loose)
    assert set(run(s, Policy(wait_count=1), 1)[0].retire) == {"tcp://b", "c"}


def test_shrink_retires_whole_units_only():
    s = snap(W("a1", processing=1, unit="job-a"), W("a2", unit="job-a"),
             W("b1", unit="job-b"), W("b2", unit="job-b"))
    (r,) = run(s, Policy(workers_per_unit=2, wait_count=1), 1)
    assert r.retire == ("b1", "b2") and r.target == 2


def test_pending_workers_go_first_when_capacity_is_idle():
    s = snap(W("a", nbytes=8, n_keys=1), W("b", processing=1), requested=4)
    rs = run(s, Policy(wait_count=2), 2)
    assert rs[0].action == "none"
    assert (rs[1].action, rs[1].cancel_pending, rs[1].retire) == ("down", 2, ("a",))
    assert rs[1].target == 1
    # nothing to do at all and nothing connected: the pending jobs are dropped
    (r,) = run(snap(requested=2), Policy(wait_count=1), 1)
    assert (r.action, r.cancel_pending, r.target) == ("down", 2, 0)
    # ... but not below the minimum
    (r,) = run(snap(requested=2), Policy(minimum=1, wait_count=1), 1)
    assert (r.cancel_pending, r.target) == (1, 1)


def test_no_loop_between_growing_and_shrinking():
    """A simulated cluster under a steady load: once grown, it never retires a worker."""
    policy = Policy(wait_count=2, target_duration=2)
    workers = ["w0"]
    counts, actions = {}, []
    for _ in range(30):
        n = len(workers)
        tasks = 8  # 8 tasks of 1 s always in the system
        running = [W(a, processing=1 if i < tasks else 0) for i, a in enumerate(workers)]
        s = snap(*running, demand=[D(max(tasks - n, 0))])
        r = recommend(s, policy, counts)
        counts = r.close_counts
        actions.append(r.action)
        if r.action == "up":
            workers += [f"w{i}" for i in range(n, r.target)]
        elif r.action == "down":
            workers = [w for w in workers if w not in r.retire]
    assert "down" not in actions
    assert actions.count("up") <= 2 and len(workers) in (2, 4)


# ---------------------------------------------------------------- from a real SchedulerState
def _state_with_tasks(n_tasks: int, workers: dict[str, dict], **graph_kw) -> SchedulerState:
    s = SchedulerState()
    s.handle(ev.AddClient("client", now=0.0))
    for address, kw in workers.items():
        s.handle(ev.AddWorker(address, **kw))
    tasks = {f"inc-{i}": {"run_spec": ("run", i), "deps": []} for i in range(n_tasks)}
    s.handle(ev.UpdateGraph("client", tasks, list(tasks), **graph_kw))
    return s


def test_snapshot_of_a_scheduler_without_workers():
    s = _state_with_tasks(10, {})
    snapshot = snapshot_state(s, requested=0)
    assert [(d.group, d.count, d.ready) for d in snapshot.demand] == [("inc", 10, True)]
    assert snapshot.demand[0].duration == s.unknown_task_duration
    assert snapshot.backlog == math.inf
    assert recommend(snapshot, Policy()).target == 1


def test_snapshot_counts_queued_tasks_and_measured_durations():
    s = _state_with_tasks(40, {"tcp://a": {"nthreads": 2, "memory_limit": 1000},
                               "tcp://b": {"nthreads": 2, "memory_limit": 1000}})
    counts = s.task_counts()
    # root-ish tasks queue: each worker takes ceil(2 threads * saturation 1.1) = 3
    assert counts["processing"] == 6 and counts["queued"] == 34
    key = next(ts.key for ts in s.workers["tcp://a"].processing)
    s.handle(ev.TaskStarted("tcp://a", key, now=0.0))
    s.handle(ev.TaskFinished("tcp://a", key, nbytes=600, start=0.0, stop=2.0, now=2.0))
    snapshot = snapshot_state(s, requested=2)
    (d,) = snapshot.demand
    assert d.ready and d.duration == 2.0 and d.count == counts["queued"] - 1
    a = next(w for w in snapshot.workers if w.address == "tcp://a")
    # a got a queued task in place of the finished one; b holds one beyond its threads
    assert (a.nbytes, a.n_keys, a.memory_limit, a.processing) == (600, 1, 1000, 3)
    assert sum(w.waiting_tasks for w in snapshot.workers) == 2
    assert snapshot.backlog == pytest.approx((d.count * 2.0 + 2 * 2.0) / 4)
    r = recommend(snapshot, Policy(target_duration=5))
    assert (r.action, r.target) == ("up", 4)


def test_snapshot_counts_gpu_tasks_waiting_on_a_worker_for_its_gpus():
    """The scheduler gives a worker tasks up to its threads' saturation whatever they ask
    of its GPUs; those beyond its GPUs wait there, and adaptive sees them waiting."""
    s = SchedulerState()
    s.handle(ev.AddClient("client", now=0.0))
    s.handle(ev.AddWorker("tcp://gpu", 8, resources={"GPU": 2}))
    tasks = {f"train-{i}": {"run_spec": ("run", i), "deps": []} for i in range(8)}
    s.handle(ev.UpdateGraph("client", tasks, list(tasks), resources={"GPU": 1}))
    (w,) = snapshot_state(s).workers
    assert w.processing == 8 and w.waiting_tasks == 0  # threads to spare ...
    assert w.used_resources == {"GPU": 8}
    n, work = w.resource_waiting["GPU"]
    assert n == 6 and work == pytest.approx(6 * s.unknown_task_duration)  # ... GPUs not
    snapshot = snapshot_state(s)
    assert snapshot.n_waiting == 6
    assert snapshot.backlog == pytest.approx(6 * s.unknown_task_duration / 2)
    r = recommend(snapshot, Policy(target_duration=1, scale_factor=10))
    assert (r.action, r.target) == ("up", 4)  # 8 one-GPU tasks, 2 GPUs a worker


def test_snapshot_records_restricted_tasks_waiting_for_dependencies():
    s = SchedulerState()
    s.handle(ev.AddClient("client", now=0.0))
    s.handle(ev.AddWorker("tcp://cpu", 1))
    s.handle(ev.AddWorker("tcp://gpu", 1, resources={"GPU": 1}))
    s.handle(ev.UpdateGraph("client", {"load": {"run_spec": "x", "deps": []}}, ["load"],
                            workers=["tcp://cpu"]))
    s.handle(ev.UpdateGraph("client", {"train": {"run_spec": "y", "deps": ["load"]}},
                            ["train"], resources={"GPU": 1}))
    snapshot = snapshot_state(s)
    (d,) = snapshot.demand
    assert (d.group, d.ready, dict(d.resources)) == ("train", False, {"GPU": 1})
    assert snapshot.waiting_restrictions() == [{"GPU": 1}]
    r = recommend(snapshot, Policy(wait_count=1))
    assert r.action == "none"  # cpu is busy, gpu is needed by "train"


# ---------------------------------------------------------------- bulk maps' elements
# A large Client.map is a bulk map (hpcsched.core.state.bulk): its elements are no tasks,
# yet adaptive must see them as it sees tasks -- queued ones as demand, those given to a
# worker as assigned to it, their results as its data.
SWEEP = "sweep-1a2b-"


def _map(s: SchedulerState, n: int) -> list:
    if "c" not in s.clients:
        s.handle(ev.AddClient("c", now=0.0))
    return s.handle(ev.UpdateMap("c", prefix=SWEEP, function=b"f", args=[b"x"] * n))


def _given(out: list, worker: str) -> list[int]:
    return [i for m in out if m.to == worker and m.msg.op == "compute-range"
            for i in m.msg.indices]


def _finish(s: SchedulerState, worker: str, indices: list[int], nbytes: int = 100,
            seconds: float = 2.0) -> list:
    n = len(indices)
    out = s.handle(ev.RangeFinished(worker, prefix=SWEEP, indices=indices, nbytes=[nbytes] * n,
                                    types=["int"] * n, starts=[0.0] * n, stops=[seconds] * n))
    s.validate()
    return out


def _run_all(s: SchedulerState, worker: str, out: list, nbytes: int = 100) -> None:
    """``worker`` finishes the ranges given to it until it is given none."""
    while given := _given(out, worker):
        out = _finish(s, worker, given, nbytes)


def test_a_maps_queued_elements_are_ready_demand_of_unknown_duration():
    s = SchedulerState()
    _map(s, 40)
    snapshot = snapshot_state(s, requested=0)
    (d,) = snapshot.demand
    assert (d.group, d.count, d.ready) == ("sweep-1a2b", 40, True)
    assert d.duration == s.unknown_task_duration
    r = recommend(snapshot, Policy())
    assert (r.action, r.target, r.kind) == ("up", 1, "no-workers")


def test_elements_given_beyond_a_workers_threads_wait_for_their_maps_measured_time():
    """One worker of one thread is given two ranges; the first is reported (2 s an element,
    100 bytes a result) and it is topped up: what it holds beyond its thread waits, as
    the queued elements do, 2 s each; the results are its data."""
    s = SchedulerState()
    s.handle(ev.AddWorker("tcp://a", 1))
    out = _map(s, 100)
    first = [m.msg.indices for m in out if m.msg.op == "compute-range"][0]
    _finish(s, "tcp://a", list(first))
    held = s.bulk.outstanding["tcp://a"]
    queued = s.task_counts()["queued"]
    assert held > 1 and queued > 0
    snapshot = snapshot_state(s, requested=1)
    (d,) = snapshot.demand
    assert (d.count, d.duration) == (queued, 2.0)
    (a,) = snapshot.workers
    assert (a.processing, a.waiting_tasks, a.waiting_work) == (held, held - 1, (held - 1) * 2.0)
    assert (a.nbytes, a.n_keys) == (100 * len(first), len(first))
    assert snapshot.backlog == pytest.approx((queued + held - 1) * 2.0)
    r = recommend(snapshot, Policy(maximum=3, target_duration=5))
    assert (r.action, r.target, r.kind) == ("up", 2, "backlog")


def _map_of_tasks(s: SchedulerState, n: int) -> list:
    """A map of ``n`` elements, each made a task before a worker comes (a task ``z``
    depends on them all, as a client wanting them does: an array job's, a published
    map's): they stay in the map's queue and run in the ranges given to workers."""
    _map(s, n)
    return s.handle(ev.UpdateGraph("c", {"z": {"run_spec": "z", "deps": [
        f"{SWEEP}{i}" for i in range(n)]}}, ["z"]))


def test_tasks_a_workers_ranges_run_wait_as_its_elements_do():
    """The map of the test above, every element a task: one worker of one thread is given
    ranges, the first is reported (2 s a task), and it is topped up. What its ranges hold
    beyond its thread waits 2 s each, as plain elements would, not as tasks started (the
    tasks of a range are all marked executing: any may have started)."""
    s = SchedulerState()
    _map_of_tasks(s, 100)
    out = s.handle(ev.AddWorker("tcp://a", 1))
    _finish(s, "tcp://a", _given(out, "tcp://a"))
    held = s.bulk.handout.load("tcp://a")
    assert held > 1 and s.bulk.outstanding.get("tcp://a", 0) == 0  # tasks, no elements
    snapshot = snapshot_state(s, requested=1)
    (d,) = snapshot.demand
    (a,) = snapshot.workers
    assert (a.processing, a.waiting_tasks, a.waiting_work) == (held, held - 1, (held - 1) * 2.0)
    assert snapshot.backlog == pytest.approx((d.count + held - 1) * 2.0)
    r = recommend(snapshot, Policy(maximum=3, target_duration=5))
    assert (r.action, r.target, r.kind) == ("up", 2, "backlog")


def test_tasks_ranges_run_after_their_map_left_the_book_still_wait():
    """The map is all given out and leaves the book (nothing of it queued, its tasks
    are tasks now) while the worker's last ranges still run some: they are its work."""
    s = SchedulerState()
    _map_of_tasks(s, 100)
    out = s.handle(ev.AddWorker("tcp://a", 1))
    given = _given(out, "tcp://a")
    while s.bulk.maps:  # A reports its tasks one by one, in order
        given += _given(_finish(s, "tcp://a", given[:1]), "tcp://a")
        del given[0]
    held = s.bulk.handout.load("tcp://a")
    assert held == len(given) > 1
    (a,) = snapshot_state(s, requested=1).workers
    assert (a.processing, a.waiting_tasks, a.waiting_work) == (held, held - 1, (held - 1) * 2.0)


def test_a_worker_whose_range_tasks_were_released_is_idle():
    """The client lets go of ``z`` and of the map while A's ranges run its tasks: they are
    released, and A, whose count of them may still hold them (pruned later), processes
    nothing: it may retire."""
    s = SchedulerState()
    _map_of_tasks(s, 100)
    s.handle(ev.AddWorker("tcp://a", 1))
    assert s.bulk.promotions.in_range("tcp://a") > 0
    s.handle(ev.ClientReleasesKeys("c", ["z", *(f"{SWEEP}{i}" for i in range(100))]))
    s.validate()
    assert not s.workers["tcp://a"].processing
    (a,) = snapshot_state(s).workers
    assert (a.processing, a.waiting_tasks, a.waiting_work) == (0, 0, 0.0)


def test_a_worker_running_elements_is_not_idle():
    """A and B share a map; B has finished its part and nothing is queued any more, while A
    still runs the ranges given to it: B may retire (its results move to A), A may not.
    (A's backlog is below a target of ten minutes: no growth either.)"""
    s = SchedulerState()
    s.handle(ev.AddWorker("tcp://a", 1))
    s.handle(ev.AddWorker("tcp://b", 1))
    out = _map(s, 40)
    _run_all(s, "tcp://b", out)
    assert not s.bulk.pending and s.bulk.outstanding["tcp://a"] > 0
    snapshot = snapshot_state(s)
    a, b = snapshot.workers
    assert a.processing == s.bulk.outstanding["tcp://a"] and b.processing == 0
    assert b.n_keys > 0
    r = recommend(snapshot, Policy(minimum=1, wait_count=1, target_duration=600))
    assert (r.action, r.retire) == ("down", ("tcp://b",))


def test_idle_workers_holding_a_maps_results_retire_least_data_first_within_memory():
    """The map is done: A's results weigh 1,000 bytes each, B's 10. B (least data) retires
    and A stays; but when A's memory (a limit of 1,000 bytes) could not hold all the
    results, A retires and B, whose memory can, stays."""
    for limit, retired in ((10**9, ("tcp://b",)), (1000, ("tcp://a",))):
        s = SchedulerState()
        s.handle(ev.AddWorker("tcp://a", 1, memory_limit=limit))
        s.handle(ev.AddWorker("tcp://b", 1, memory_limit=10**9))
        out = _map(s, 40)
        _run_all(s, "tcp://a", out, nbytes=1000)
        _run_all(s, "tcp://b", out, nbytes=10)
        assert s.task_counts() == {"memory": 40} and not s.tasks
        snapshot = snapshot_state(s)
        a, b = snapshot.workers
        assert a.nbytes == 1000 * a.n_keys and b.nbytes == 10 * b.n_keys
        assert a.n_keys + b.n_keys == 40 and b.n_keys > 0
        r = recommend(snapshot, Policy(minimum=1, wait_count=1, memory_high=0.5))
        assert r.retire == retired, (limit, r)


# ---------------------------------------------------------------- the Adaptive object
class FakeCluster:
    """Records calls; workers never connect (a queue that does not start anything)."""

    def __init__(self, coroutine: bool = False):
        self.calls: list = []
        self.coroutine = coroutine
        self.requested = 0
        self.workers_per_unit = 1

    def _requested(self) -> int:
        return self.requested

    def scale_up(self, n, **kwargs):
        self.calls.append(("up", n, kwargs))
        self.requested = max(self.requested, n)
        if self.coroutine:
            async def done():
                return None
            return done()

    def scale_down(self, workers):
        self.calls.append(("down", list(workers)))


class FakeScheduler:
    def __init__(self, state: SchedulerState):
        self.state = state
        self.lock = threading.Lock()

    def call(self, fn, timeout=None):
        with self.lock:
            return fn(self)


class MemoryAdaptive(Adaptive):
    def get_scale_up_kwargs(self) -> dict:
        kwargs = super().get_scale_up_kwargs()
        memory = [r["memory"] for r in self.last_snapshot.waiting_restrictions()
                  if "memory" in r]
        if memory:
            kwargs["memory"] = max(memory)
        return kwargs


@pytest.mark.parametrize("coroutine", [False, True], ids=["function", "coroutine"])
def test_adaptive_step_calls_scale_up_with_subclass_kwargs(coroutine):
    state = _state_with_tasks(5, {}, resources={"memory": 4e9})
    cluster = FakeCluster(coroutine)
    a = MemoryAdaptive(FakeScheduler(state), cluster, maximum=4, interval=0.05, start=False)
    r = a.adapt()
    assert r.action == "up" and cluster.calls == [("up", 1, {"memory": 4e9})]
    for _ in range(5):  # the worker never connects: no second submission
        a.adapt()
    assert len(cluster.calls) == 1
    assert [d.action for d in a.log] == ["up", "none"]
    assert "no workers and 5 tasks waiting" in str(a.log[0])


def test_adaptive_thread_sleeps_between_steps_and_stops():
    state = _state_with_tasks(5, {})
    cluster = FakeCluster()
    a = Adaptive(FakeScheduler(state), cluster, maximum=4, interval=0.05)
    try:
        from tests.conftest import wait_until

        wait_until(lambda: cluster.calls, timeout=5, what="a scale_up call")
        assert a.running and "running" in repr(a)
    finally:
        a.stop()
    assert not a._thread.is_alive() and not a.running
    assert len(cluster.calls) == 1


def test_adaptive_refuses_a_cluster_without_scale_methods_and_bad_intervals():
    state = SchedulerState()
    with pytest.raises(TypeError, match="scale_up"):
        Adaptive(FakeScheduler(state), object(), start=False)
    with pytest.raises(ValueError, match="interval"):
        Adaptive(FakeScheduler(state), FakeCluster(), interval=0, start=False)
    assert parse_interval("500ms") == 0.5 and parse_interval("2s") == 2.0
    assert parse_interval(3) == 3.0
    with pytest.raises(ValueError, match="not a duration"):
        parse_interval("soon")


def test_adaptive_drops_pending_workers_through_scale_when_nothing_needs_them():
    class ScalableCluster(FakeCluster):
        def scale(self, n):
            self.calls.append(("scale", n))

    cluster = ScalableCluster()
    cluster.requested = 2  # two jobs still in the queue, and no work any more
    a = Adaptive(FakeScheduler(SchedulerState()), cluster, wait_count=2, start=False)
    assert a.adapt().action == "none"
    r = a.adapt()
    assert (r.action, r.cancel_pending, r.target) == ("down", 2, 0)
    assert cluster.calls == [("scale", 0)]
    assert "2 pending workers not needed" in str(a.log[-1])


def test_adaptive_maps_workers_to_their_jobs_for_whole_job_retirement():
    from hpcsched.jobqueue.job import Job

    cluster = FakeCluster()
    cluster.workers_per_unit = 2
    cluster.jobs = {"17": Job("17", "hpcsched-ab12-0", "log", 2),
                    "18": Job("18", "hpcsched-ab12-1", "log", 2)}
    state = SchedulerState()
    for i, name in enumerate(["hpcsched-ab12-0-0", "hpcsched-ab12-0-1",
                              "hpcsched-ab12-1-0", "hpcsched-ab12-1-1"]):
        state.handle(ev.AddWorker(f"tcp://w{i}", 1, name=name))
    a = Adaptive(FakeScheduler(state), cluster, wait_count=1, start=False)
    assert a.policy.workers_per_unit == 2
    snapshot = a.snapshot()
    assert [w.unit for w in snapshot.workers] == ["job:17", "job:17", "job:18", "job:18"]
    assert a.unit_of("someone-else-3") == "someone-else"
    state.handle(ev.AddClient("c", now=0.0))
    state.handle(ev.UpdateGraph("c", {"x": {"run_spec": 1, "deps": []}}, ["x"],
                                workers=["tcp://w1"]))
    r = a.adapt()  # w1 (job 17) computes x: only job 18 may go, both of its workers
    assert r.action == "down" and r.retire == ("tcp://w2", "tcp://w3")
    assert cluster.calls == [("down", ["tcp://w2", "tcp://w3"])]
