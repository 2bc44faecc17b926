"""Adaptive scaling of several pools (a CPU pool and a GPU pool), on drawn snapshots.

``W`` draws a worker, ``D`` waiting tasks; ``POOL_OF`` says which pool each worker
address is in. Each test states what each pool should do and why.
"""

from __future__ import annotations

import math

import pytest

from hpcsched.launchers.adaptive_policy import Policy, Snapshot, TaskDemand, WorkerSnapshot
from hpcsched.launchers.adaptive_pools import Pool, pool_policies, recommend_pools, split

GPU = {"GPU": 1.0}


def W(address: str, **kw) -> WorkerSnapshot:  # noqa: N802 - reads like a drawing
    return WorkerSnapshot(address=address, name=address, nthreads=2, **kw)


def D(count: int, duration: float = 1.0, **kw) -> TaskDemand:  # noqa: N802
    return TaskDemand(kw.pop("group", "inc"), count, duration, **kw)


def pools(cpu_requested=None, gpu_requested=None, gpu_max=2, wait_count=2) -> list[Pool]:
    return [Pool("default", Policy(maximum=8, wait_count=wait_count, target_duration=1),
                 {}, cpu_requested),
            Pool("gpu", Policy(maximum=gpu_max, wait_count=wait_count, target_duration=1),
                 {"GPU": 4.0}, gpu_requested)]


def gpu_worker(address: str, **kw) -> WorkerSnapshot:
    return W(address, resources={"GPU": 4.0}, **kw)


def test_gpu_tasks_grow_the_gpu_pool_and_cpu_tasks_the_cpu_pool():
    """No worker yet; 40 CPU tasks and 3 one-GPU tasks wait.

    Each pool gets one job for the tasks only it is for: the GPU tasks cannot run on a
    CPU worker, and the CPU tasks are the first pool's, not the GPU pool's.
    """
    snap = Snapshot(demand=(D(40), D(3, 5.0, group="train", resources=GPU)), requested=0)
    recs = recommend_pools(snap, pools(0, 0), {})
    assert (recs["default"].action, recs["default"].target) == ("up", 1)
    assert (recs["gpu"].action, recs["gpu"].target) == ("up", 1)
    assert "3 tasks waiting" in recs["gpu"].reason


def test_cpu_tasks_alone_never_bring_a_gpu_job():
    """A backlog of CPU work on one CPU worker: the CPU pool grows, the GPU pool stays at
    nothing (nothing it alone can run waits)."""
    snap = Snapshot(workers=(W("c1", processing=2),), demand=(D(100, 2.0),), requested=1)
    recs = recommend_pools(snap, pools(1, 0), {"c1": "default"})
    assert recs["default"].action == "up"
    assert recs["gpu"].action == "none" and recs["gpu"].target == 0


def test_an_idle_gpu_worker_is_retired_while_cpu_work_waits():
    """The GPU stage is done: its worker holds nothing and runs nothing, and 50 CPU tasks
    wait. The CPU tasks could run on it, but they are the CPU pool's demand: the GPU job
    is retired after wait_count intervals, not held for them."""
    snap = Snapshot(workers=(W("c1", processing=2), gpu_worker("g1")),
                    demand=(D(50),), requested=2)
    p = pools(1, 1)
    counts: dict = {}
    first = recommend_pools(snap, p, {"c1": "default", "g1": "gpu"}, counts)
    assert first["gpu"].kind == "idle-wait"
    counts = {n: r.close_counts for n, r in first.items()}
    second = recommend_pools(snap, p, {"c1": "default", "g1": "gpu"}, counts)
    assert (second["gpu"].action, second["gpu"].retire) == ("down", ("g1",))
    assert second["default"].action == "up"


def test_gpu_tasks_waiting_for_their_inputs_keep_the_gpu_worker():
    """GPU tasks not ready yet (their CPU inputs run) keep an idle GPU worker, as
    restricted demand keeps the workers holding what it needs."""
    snap = Snapshot(workers=(W("c1", processing=2), gpu_worker("g1")),
                    demand=(D(10), D(4, group="train", ready=False, resources=GPU)),
                    requested=2)
    recs = recommend_pools(snap, pools(1, 1, wait_count=1), {"c1": "default", "g1": "gpu"})
    assert recs["gpu"].action == "none" and recs["gpu"].kind == "steady"


def test_a_pool_at_its_maximum_does_not_grow_and_tasks_go_to_the_next_pool_that_fits():
    """GPU tasks and a GPU pool allowed no jobs: no pool can run them, none grows for them.
    CPU tasks with a CPU pool allowed none go to the GPU pool, whose workers can run them."""
    snap = Snapshot(demand=(D(3, resources=GPU),), requested=0)
    no_gpu = pools(0, 0, gpu_max=0)
    assert split(snap, no_gpu, {})["gpu"].demand == ()
    assert recommend_pools(snap, no_gpu, {})["default"].action == "none"
    only_gpu = [Pool("default", Policy(maximum=0)), pools(0, 0)[1]]
    recs = recommend_pools(Snapshot(demand=(D(5),), requested=0), only_gpu, {})
    assert (recs["gpu"].action, recs["gpu"].target) == ("up", 1)


def test_tasks_restricted_to_a_worker_are_that_workers_pools():
    snap = Snapshot(workers=(W("c1"), gpu_worker("g1")),
                    demand=(D(2, workers=frozenset({"g1"})),), requested=2)
    parts = split(snap, pools(1, 1), {"c1": "default", "g1": "gpu"})
    assert [d.count for d in parts["gpu"].demand] == [2] and parts["default"].demand == ()
    assert [w.address for w in parts["gpu"].workers] == ["g1"]


class View:
    """What a cluster's templates tell adaptive: two pools, GPU jobs of 4 workers."""

    def names(self):
        return ["default", "gpu"]

    def resources(self, pool):
        return {"gpu": {"GPU": 1.0}}.get(pool, {})

    def workers_per_unit(self, pool):
        return {"default": 2, "gpu": 4}[pool]

    def pool_of(self, worker):
        return "default"

    def requested(self, pool):
        return 0


def test_each_pool_takes_its_own_bounds_or_as_many_jobs_as_the_default_pool():
    default = Policy(minimum=2, maximum=8, workers_per_unit=2)
    out = pool_policies(default, View(), None)
    assert out["default"] == default
    assert (out["gpu"].minimum, out["gpu"].maximum, out["gpu"].workers_per_unit) == (0, 16, 4)
    out = pool_policies(default, View(), {"gpu": {"maximum_jobs": 1, "minimum": 4}})
    assert (out["gpu"].min_workers, out["gpu"].max_workers) == (4, 4)
    unbounded = pool_policies(Policy(workers_per_unit=2), View(), None)
    assert math.isinf(unbounded["gpu"].maximum)


@pytest.mark.parametrize("bounds,error", [
    ({"tpu": {"maximum": 1}}, "no template 'tpu'"),
    ({"gpu": {"max": 1}}, "give a dict of minimum, maximum"),
    ({"gpu": {"maximum": 2}}, "template 'gpu': adaptive maximum=2 workers is less than one job"),
])
def test_bad_pool_bounds_are_named(bounds, error):
    with pytest.raises(ValueError, match=error):
        pool_policies(Policy(workers_per_unit=2), View(), bounds)


def test_an_idle_gpu_worker_holding_results_retires_onto_the_cpu_workers():
    """The GPU stage's results are on the GPU worker; a CPU worker survives to take them,
    so the GPU job is retired. Alone, it would be kept (its results have nowhere to go),
    and so it is when the CPU pool retires its idle worker in the same step."""
    g1 = gpu_worker("g1", nbytes=10 * 2**20, n_keys=40)
    p = pools(1, 1, wait_count=1)
    keep_cpu = [Pool("default", Policy(minimum=1, maximum=8, wait_count=1), {}, 1), p[1]]
    with_cpu = Snapshot(workers=(W("c1", memory_limit=2**30), g1), requested=2)
    recs = recommend_pools(with_cpu, keep_cpu, {"c1": "default", "g1": "gpu"})
    assert (recs["gpu"].action, recs["gpu"].retire) == ("down", ("g1",))
    assert recs["default"].action == "none"
    recs = recommend_pools(with_cpu, p, {"c1": "default", "g1": "gpu"})
    assert recs["default"].retire == ("c1",) and recs["gpu"].action == "none"
    alone = Snapshot(workers=(g1,), requested=1)
    assert recommend_pools(alone, p, {"g1": "gpu"})["gpu"].action == "none"


# ---------------------------------------------------------------- PooledAdaptive acting
class PoolCluster:
    """Records what adaptive asks of each pool; its workers never connect."""

    def __init__(self):
        self.calls: list = []
        self.requested = {"default": 0, "gpu": 0}

    def scale_up(self, n, pool=None):
        self.calls.append(("up", pool, n))
        self.requested[pool] = max(self.requested[pool], n)

    def scale_down(self, workers):
        self.calls.append(("down", list(workers)))

    def scale(self, n, pool=None):
        self.calls.append(("scale", pool, n))
        self.requested[pool] = n


class PoolClusterView(View):
    def __init__(self, cluster):
        self.cluster = cluster

    def workers_per_unit(self, pool):
        return 1

    def requested(self, pool):
        return self.cluster.requested[pool]


class StateScheduler:
    """``scheduler.call(fn)`` over a SchedulerState driven by the test."""

    def __init__(self, state):
        self.state = state

    def call(self, fn, timeout=None):
        return fn(self)


def test_gpu_tasks_ask_the_gpu_pool_for_a_job_and_its_pending_job_goes_when_they_do():
    from hpcsched.core.state import events as ev
    from hpcsched.core.state.scheduler_state import SchedulerState
    from hpcsched.launchers.adaptive_pools import PooledAdaptive

    state = SchedulerState()
    state.handle(ev.AddClient("c"))
    tasks = {f"train-{i}": {"run_spec": "s", "deps": []} for i in range(3)}
    state.handle(ev.UpdateGraph("c", tasks, list(tasks), resources={"GPU": 1}))
    cluster = PoolCluster()
    a = PooledAdaptive(StateScheduler(state), cluster, PoolClusterView(cluster), maximum=4,
                       wait_count=2, pool_keyword="pool", start=False)
    a.adapt()
    assert cluster.calls == [("up", "gpu", 1)]  # nothing for the CPU pool
    assert any(str(d).count("gpu: no workers and 3 tasks waiting") for d in a.log)
    state.handle(ev.ClientReleasesKeys("c", list(tasks)))  # the GPU tasks were cancelled
    a.adapt()
    assert len(cluster.calls) == 1  # one interval of hysteresis: nothing yet
    a.adapt()
    assert cluster.calls[1:] == [("scale", "gpu", 0)]  # the pending GPU job is not held
    assert cluster.requested == {"default": 0, "gpu": 0}
