"""Secede and rejoin in both state machines, driven by events alone (no process, no thread).

A task that waits on tasks it submitted (``worker_client()``, ``secede()``)
must give its thread slot back, on the worker (which starts the next ready
task) and on the scheduler (which counts it out of the worker's slots, so that
queued work reaches the worker); ``rejoin()`` waits for a slot again. Without
this, a one-thread worker running a task that waits on its own subtasks is
deadlocked. ``validate()`` runs after every step.
"""

from __future__ import annotations

from hpcsched.core.state import events as ev
from hpcsched.core.state.events import Resume
from tests.core.state.harness import (
    A,
    compute,
    executes,
    finish,
    graph,
    new_worker,
    sent,
    step,
    submit,
    success,
    to_scheduler,
    with_workers,
)


def resumes(out: list) -> list:
    return [c.key for c in out if type(c) is Resume]


# ---------------------------------------------------------------- worker state
def test_seceded_task_frees_its_slot_for_the_next_ready_task():
    s = new_worker(nthreads=1)
    assert executes(step(s, compute("parent", priority=(0,)))) == ["parent"]
    assert executes(step(s, compute("child", priority=(1,)))) == []  # the one slot is taken
    out = step(s, ev.Secede("parent", compute_duration=0.25))
    # the scheduler hears of it, and the child runs beside the (still running) parent
    (msg,) = to_scheduler(out, "long-running", key="parent")
    assert msg.msg.compute_duration == 0.25
    assert executes(out) == ["child"]
    assert s.tasks["parent"].state == "long-running"
    # the parent's result is accepted as any other
    out = step(s, success("parent", 5))
    assert to_scheduler(out, "task-finished", key="parent")
    assert s.data["parent"] == 5 and not s.long_running


def test_rejoin_waits_for_a_free_slot_and_goes_before_ready_tasks():
    s = new_worker(nthreads=1)
    step(s, compute("parent", priority=(0,)))
    step(s, compute("child", priority=(1,)))
    step(s, compute("other", priority=(2,)))
    assert executes(step(s, ev.Secede("parent"))) == ["child"]
    out = step(s, ev.Rejoin("parent"))
    assert resumes(out) == [] and s.tasks["parent"].state == "rejoining"  # child holds the slot
    out = step(s, success("child"))
    # the slot goes to the task that rejoins, not to the ready "other"
    assert resumes(out) == ["parent"] and executes(out) == []
    assert s.tasks["parent"].state == "executing"
    out = step(s, success("parent"))
    assert executes(out) == ["other"]


def test_rejoin_without_secede_resumes_at_once():
    s = new_worker(nthreads=1)
    step(s, compute("x"))
    assert resumes(step(s, ev.Rejoin("x"))) == ["x"]
    assert s.tasks["x"].state == "executing"


def test_seceded_task_released_by_the_scheduler_still_finishes_quietly():
    s = new_worker(nthreads=1)
    step(s, compute("x"))
    step(s, ev.Secede("x"))
    step(s, ev.FreeKeys(["x"]))  # cancelled while it waits on its subtasks
    assert s.tasks["x"].state == "long-running"
    out = step(s, success("x"))
    assert not to_scheduler(out, "task-finished") and "x" not in s.data


# ---------------------------------------------------------------- scheduler state
def test_long_running_task_opens_a_slot_for_queued_tasks():
    """One worker, one thread, queuing at saturation 1.0: one task at a time. The parent
    secedes; the queued child goes to the worker although the parent still runs there."""
    s = with_workers(A, worker_saturation=1.0)
    keys = [f"fib-{i}" for i in range(4)]  # root-ish: more tasks than 2 x threads
    out = submit(s, graph(**{k: [] for k in keys}), keys=keys,
                 static_priorities={k: i for i, k in enumerate(keys)})
    assert [m.wire()["key"] for m in sent(out, "compute-task")] == ["fib-0"]
    ws = s.workers[A]
    out = step(s, ev.LongRunning(A, "fib-0", compute_duration=0.1))
    assert [m.wire()["key"] for m in sent(out, "compute-task")] == ["fib-1"]
    assert s.tasks["fib-0"].state == "processing" and s.tasks["fib-0"] in ws.long_running
    assert ws.processing[s.tasks["fib-0"]] == 0.0  # weighs nothing in the worker's occupancy
    # a repeated report changes nothing
    assert not sent(step(s, ev.LongRunning(A, "fib-0")), "compute-task")
    # the seceded task finishing does not open a second slot: fib-1 still holds the one
    assert not sent(finish(s, A, "fib-0"), "compute-task")
    assert not ws.long_running
    assert [m.wire()["key"] for m in sent(finish(s, A, "fib-1"), "compute-task")] == ["fib-2"]


def test_long_running_task_is_never_stolen_and_is_blamed_if_its_worker_dies():
    s = with_workers(A, "tcp://b", worker_saturation=float("inf"), work_stealing=True)
    submit(s, graph(x=[]), keys=["x"], workers=[A])
    step(s, ev.LongRunning(A, "x"))
    assert s.tasks["x"] in s.workers[A].executing  # started: not stealable
    step(s, ev.RemoveWorker(A, "killed"))
    assert s.tasks["x"].suspicious == 1
