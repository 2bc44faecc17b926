"""Workers kept for the tasks that ask for their resources (``resources_only``: a GPU
job's workers), told as stories of events with ``validate()`` after every step.

Worker ``A`` is a CPU worker; ``G`` has a GPU and registers ``resources_only``. Tasks
that ask for no resource never go to ``G`` -- not as root tasks, not beside their
inputs, not as elements of a bulk map, not stolen -- and tasks asking for a GPU do.
"""

from __future__ import annotations

from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState
from tests.core.state.harness import A, finish, graph, new_scheduler, sent, step, submit

G = "tcp://g"


def cpu_and_gpu(nthreads: int = 2) -> SchedulerState:
    s = new_scheduler()
    step(s, ev.AddWorker(A, nthreads))
    step(s, ev.AddWorker(G, nthreads, resources={"GPU": 1}, resources_only=True))
    return s


def test_cpu_tasks_never_go_to_the_gpu_worker_and_gpu_tasks_do():
    """::

        x0 .. x9      (CPU, root tasks)
          |
          y0          (resources={"GPU": 1})
          |
          z0          (CPU, its input on G)

    The x's all go to A although G has free threads; y0 goes to G, the one worker with a
    GPU; z0 goes to A, not to G, where its input is.
    """
    s = cpu_and_gpu()
    out = submit(s, graph(**{f"x{i}": [] for i in range(10)}),
                 keys=[f"x{i}" for i in range(10)])
    assert {m.to for m in sent(out, "compute-task")} == {A}
    assert s.workers[G].processing == {}
    while any(s.tasks[f"x{i}"].state != "memory" for i in range(10)):
        for ts in list(s.workers[A].processing):
            finish(s, A, ts.key)
            assert s.workers[G].processing == {}
        s.validate()
    out = submit(s, graph(y0=["x0"]), keys=["y0"], resources={"GPU": 1})
    assert [m.to for m in sent(out, "compute-task", key="y0")] == [G]
    finish(s, G, "y0")
    out = submit(s, graph(z0=["y0"]), keys=["z0"])
    assert [m.to for m in sent(out, "compute-task", key="z0")] == [A]
    s.validate()


def test_a_cpu_task_waits_for_a_cpu_worker_rather_than_take_the_idle_gpu_worker():
    s = new_scheduler()
    step(s, ev.AddWorker(G, 2, resources={"GPU": 1}, resources_only=True))
    out = submit(s, graph(x=[]), keys=["x"])
    assert not sent(out, "compute-task") and s.tasks["x"].state in ("no-worker", "queued")
    out = step(s, ev.AddWorker(A, 1))
    assert [m.to for m in sent(out, "compute-task", key="x")] == [A]
    s.validate()


def test_the_elements_of_a_bulk_map_go_to_the_cpu_worker_only():
    s = cpu_and_gpu()
    step(s, ev.AddClient("c"))
    out = step(s, ev.UpdateMap("c", prefix="m-a-", function=b"f",
                               args=[b"a%d" % i for i in range(40)]))
    given = {m.to for m in out if m.msg.op == "compute-range"}
    assert given == {A}
    assert G not in s.bulk.hungry  # not a thief for the ranges either
    s.validate()


def test_the_worker_says_so_in_its_info():
    s = cpu_and_gpu()
    assert s.workers[G].info()["resources_only"] is True
    assert s.workers[A].info()["resources_only"] is False
    assert [ws.address for ws in s.registry.running()] == [A]


def test_a_long_gpu_task_goes_to_the_gpu_worker_that_stays():
    """Two GPU workers kept for GPU tasks: g1 leaves in 2 minutes, g2 in an hour; a CPU
    worker stays two hours. A GPU task expected to run 10 minutes goes to g2 (the CPU
    worker staying longest of all is no place for it), and a CPU task of 10 minutes to
    the CPU worker."""
    s = new_scheduler()
    gpu = {"resources": {"GPU": 1}, "resources_only": True}
    step(s, ev.AddWorker("tcp://g1", 1, lifetime_end=120, **gpu))
    step(s, ev.AddWorker("tcp://g2", 1, lifetime_end=3600, **gpu))
    step(s, ev.AddWorker(A, 4, lifetime_end=7200))
    out = submit(s, graph(x=[]), keys=["x"], resources={"GPU": 1},
                 annotations={"duration": {"x": 600}})
    assert [m.to for m in sent(out, "compute-task", key="x")] == ["tcp://g2"]
    out = submit(s, graph(y=[]), keys=["y"], annotations={"duration": {"y": 600}})
    assert [m.to for m in sent(out, "compute-task", key="y")] == [A]
    s.validate()


def test_a_gang_asking_for_no_resource_gathers_cpu_workers_only():
    """A gang of two (``ranks=2``) with one CPU worker and the GPU worker idle: it does
    not keep ``G`` for itself; it waits, holding ``A`` alone, and starts once a second
    CPU worker ``B`` joins."""
    s = cpu_and_gpu(nthreads=1)
    out = submit(s, graph(g=[]), keys=["g"], annotations={"ranks": {"g": 2}})
    assert not sent(out, "compute-task")
    assert s.workers[G].reserved is None
    s.validate()
    out = step(s, ev.AddWorker("tcp://b", 1))
    assert {m.to for m in sent(out, "compute-task", key="g")} <= {A, "tcp://b"}
    assert sent(out, "compute-task", key="g")
    assert s.workers[G].reserved is None and s.workers[G].processing == {}
    s.validate()
