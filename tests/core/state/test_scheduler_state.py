"""SchedulerState driven by events alone: no processes, no threads, no clock.

Each test is a story: events go in, the ``Send`` commands that come out are
checked, and :meth:`SchedulerState.validate` runs after every step (``step``).
Workers are ``tcp://a``, ``tcp://b``...; the client is ``c``; run specs are
opaque strings (the state machine never looks inside them).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from hpcsched.core.state import events as ev
from hpcsched.core.state.events import Send
from hpcsched.core.state.scheduler_state import KilledWorker, SchedulerState
from tests.core.state.harness import (
    A,
    B,
    C,
    finish,
    graph,
    new_scheduler,
    one,
    sent,
    step,
    submit,
    with_workers,
)


# ---------------------------------------------------------------- helpers
def processing_on(s: SchedulerState, key: Any) -> str:
    ts = s.tasks[key]
    assert ts.state == "processing", ts
    return ts.processing_on.address


# ---------------------------------------------------------------- basic flow
def test_chain_runs_where_its_dependency_is_and_is_forgotten_when_released():
    s = with_workers(A, B)
    out = submit(s, graph(x=[], y=["x"]), keys=["y"])
    cx = one(out, "compute-task", key="x")
    wx = cx.to
    assert not sent(out, "compute-task", key="y")  # y waits for x
    assert s.tasks["y"].state == "waiting"

    out = finish(s, wx, "x")
    cy = one(out, "compute-task", key="y")
    assert cy.to == wx  # where its dependency already is
    assert cy.msg.who_has == {"x": [wx]}
    assert cy.msg.nbytes == {"x": 8}

    out = finish(s, wx, "y")
    assert one(out, "key-in-memory", key="y").to == "c"
    # x is no longer needed: its data is freed, but its task is kept (released) in
    # case y is lost and must be recomputed
    assert one(out, "free-keys", keys=["x"]).to == wx
    assert s.tasks["x"].state == "released" and not s.tasks["x"].who_has
    assert s.tasks["y"].state == "memory"

    out = step(s, ev.ClientReleasesKeys("c", ["y"]))
    assert one(out, "free-keys", keys=["y"]).to == wx
    assert s.tasks == {}
    assert all(not ws.has_what and ws.nbytes == 0 for ws in s.workers.values())


def test_diamond_dependents_go_to_the_holder_and_join_across_workers():
    """
        d
       / \\
      b   c
       \\ /
        a
    """
    s = with_workers(A, B)
    out = submit(s, graph(a=[], b=["a"], c=["a"], d=["b", "c"]), keys=["d"])
    wa = one(out, "compute-task", key="a").to
    out = finish(s, wa, "a")
    assert {m.msg.key for m in sent(out, "compute-task")} == {"b", "c"}
    assert all(m.to == wa for m in sent(out, "compute-task"))
    out = finish(s, wa, "b")
    assert not sent(out, "compute-task", key="d")  # still waits for c
    assert s.tasks["d"].waiting_on == {s.tasks["c"]}
    out = finish(s, wa, "c")
    cd = one(out, "compute-task", key="d")
    assert cd.msg.who_has == {"b": [wa], "c": [wa]}
    # a's data is dropped once both of its dependents are in memory
    assert s.tasks["a"].state == "released"
    out = finish(s, wa, "d")
    assert one(out, "key-in-memory", key="d")
    assert [k for k, ts in s.tasks.items() if ts.state == "memory"] == ["d"]
    step(s, ev.ClientReleasesKeys("c", ["d"]))
    assert s.tasks == {}


def test_parts_of_a_graph_nobody_asked_for_are_dropped_and_resubmission_works():
    """A dask graph is sent whole: asking for x of {x, y(x), z(x, y)} must not leave y and z
    behind -- and asking for y later must still compute x first."""
    s = with_workers(A)
    tasks = graph(x=[], y=["x"], z=["x", "y"])
    out = submit(s, tasks, keys=["x"])
    assert set(s.tasks) == {"x"}
    finish(s, A, "x")
    step(s, ev.ClientReleasesKeys("c", ["x"]))
    assert s.tasks == {}
    out = submit(s, tasks, keys=["y"])
    assert not sent(out, "compute-task", key="y")
    assert one(out, "compute-task", key="x")
    out = finish(s, A, "x")
    assert one(out, "compute-task", key="y").msg.who_has == {"x": [A]}


def test_a_released_dependent_keeps_its_dependencies():
    """y (released, kept for z) must keep its link to x, else a recomputation of y would
    run without its input."""
    s = with_workers(A)
    submit(s, graph(x=[], y=["x"], z=["y"]), keys=["z", "x"])
    finish(s, A, "x")
    finish(s, A, "y")
    finish(s, A, "z")
    assert s.tasks["y"].state == "released"
    step(s, ev.ClientReleasesKeys("c", ["x"]))  # x: not wanted, but y may need it again
    assert s.tasks["y"].dependencies == {s.tasks["x"]}
    step(s, ev.RemoveWorker(A, "killed"))  # z is lost: y and then x are recomputed
    assert s.tasks["z"].state == "waiting"
    out = step(s, ev.AddWorker(B, 1))
    w = one(out, "compute-task", key="x").to
    out = finish(s, w, "x")
    assert one(out, "compute-task", key="y").msg.who_has == {"x": [w]}


def test_new_client_for_existing_key_in_memory_is_told_at_once():
    s = with_workers(A)
    out = submit(s, graph(x=[]), keys=["x"])
    finish(s, A, "x")
    out = submit(s, graph(x=[]), keys=["x"], client="c2")
    assert one(out, "key-in-memory", key="x").to == "c2"
    assert not sent(out, "compute-task")
    out = step(s, ev.ClientDesiresKeys("c3", ["x", "nope"]))
    assert one(out, "key-in-memory", key="x").to == "c3"
    assert one(out, "cancelled-keys", keys=["nope"]).to == "c3"


def test_tasks_before_any_worker_wait_and_start_when_one_joins():
    s = new_scheduler()
    out = submit(s, graph(x=[]), keys=["x"])
    assert not sent(out, "compute-task")
    assert s.tasks["x"].state == "no-worker"
    out = step(s, ev.AddWorker(A, 1))
    assert one(out, "compute-task", key="x").to == A


def test_a_worker_registering_again_brings_its_results_and_keeps_its_running_tasks():
    """A restarted scheduler (its graph rebuilt from the journal, no worker yet) and a
    worker that outlived the old one: what it holds is in memory, what it runs stays its
    own (no second run elsewhere), the rest is placed as usual.

        x   y   z      (independent; the worker holds x and runs y)
    """
    s = new_scheduler()
    submit(s, graph(x=[], y=[], z=[]), keys=["x", "y", "z"])
    assert {s.tasks[k].state for k in "xyz"} == {"no-worker"}
    out = step(s, ev.AddWorker(A, 2, keys={"x": 80}, running=["y"]))
    assert s.tasks["x"].state == "memory" and s.tasks["x"].nbytes == 80
    assert one(out, "key-in-memory", key="x").to == "c"
    assert processing_on(s, "y") == A
    assert processing_on(s, "z") == A
    assert not sent(out, "compute-task", key="x")
    # y's result arrives as any task's does
    finish(s, A, "y")
    assert s.tasks["y"].state == "memory"


def test_workers_held_after_a_restart_get_work_only_once_released():
    """A restarted scheduler registers the workers coming back paused until all are back:
    the first one back must not recompute what the second holds.

        x   y      (independent; A holds x, B holds y)
    """
    s = new_scheduler()
    submit(s, graph(x=[], y=[]), keys=["x", "y"])
    out = step(s, ev.AddWorker(A, 1, keys={"x": 8}, paused=True))
    assert not sent(out, "compute-task")
    assert s.tasks["y"].state == "no-worker"
    out = step(s, ev.AddWorker(B, 1, keys={"y": 8}, paused=True))
    assert s.tasks["y"].state == "memory" and not sent(out, "compute-task")
    z = submit(s, graph(z=[]), keys=["z"])  # submitted meanwhile: it waits too
    assert not sent(z, "compute-task")
    out = step(s, ev.WorkerStatusChange(status="running", worker=A))
    assert one(out, "compute-task", key="z").to == A


def test_a_worker_registering_again_runs_nothing_twice_that_another_runs():
    s = with_workers(B)
    submit(s, graph(y=[]), keys=["y"])
    assert processing_on(s, "y") == B
    out = step(s, ev.AddWorker(A, 1, running=["y"]))  # it ran y for the old scheduler
    assert processing_on(s, "y") == B  # placed already: whoever finishes first wins
    assert not sent(out, "compute-task", key="y")


# ---------------------------------------------------------------- errors
def test_task_erred_errs_dependents_and_tells_the_client():
    s = with_workers(A, B)
    out = submit(s, graph(x=[], y=["x"], z=["y"], other=[]), keys=["z", "other"])
    wx = one(out, "compute-task", key="x").to
    step(s, ev.TaskStarted(wx, "x"))
    out = step(s, ev.TaskErred(wx, "x", exception="EXC", traceback="TB",
                               exception_text="ZeroDivisionError: boom"))
    e = one(out, "task-erred", key="z")
    assert e.to == "c"
    assert e.msg.exception == "EXC" and e.msg.traceback == "TB"
    assert e.msg.origin == "x"
    assert s.tasks["y"].state == "erred" and s.tasks["z"].state == "erred"
    assert s.tasks["z"].exception_blame is s.tasks["x"]
    # unrelated work goes on
    assert s.tasks["other"].state in ("processing", "memory")
    # a late result of the erred task is dropped on its worker
    out = step(s, ev.TaskFinished(wx, "x", nbytes=1))
    assert s.tasks["x"].state == "erred"
    # releasing the failed key forgets the whole failed chain
    step(s, ev.ClientReleasesKeys("c", ["z"]))
    assert set(s.tasks) == {"other"}


def test_an_erred_task_reports_its_failure_after_the_failed_dependency_runs_again():
    """y failed through x; x is retried (by another client) and succeeds: a client asking
    for y later still hears x's failure, not an empty one."""
    s = with_workers(A)
    submit(s, graph(x=[], y=["x"]), keys=["y"], client="c1")
    submit(s, graph(x=[]), keys=["x"], client="c2")
    step(s, ev.TaskStarted(A, "x"))
    out = step(s, ev.TaskErred(A, "x", exception="EXC", traceback="TB", exception_text="boom"))
    assert one(out, "task-erred", key="y").msg.exception == "EXC"
    out = step(s, ev.RetryKeys("c2", ["x"]))
    finish(s, A, "x")
    assert s.tasks["x"].state == "memory" and s.tasks["y"].state == "erred"
    out = step(s, ev.ClientDesiresKeys("c1", ["y"]))
    report = one(out, "task-erred", key="y").msg
    assert (report.exception, report.traceback, report.exception_text, report.origin) == (
        "EXC", "TB", "boom", "x")


def test_a_task_with_two_failed_dependencies_blames_the_same_one_every_time():
    """Which failed dependency a new dependent blames does not follow set order."""
    blamed = set()
    for n in range(20):
        s = with_workers(A)
        deps = [f"d{i}" for i in range(n % 5 + 2)]
        submit(s, graph(**{d: [] for d in deps}), keys=deps,
               static_priorities={d: i for i, d in enumerate(deps)})
        for d in reversed(deps):
            step(s, ev.TaskErred(A, d, exception=f"E-{d}", exception_text=d))
        out = submit(s, graph(top=deps), keys=["top"])  # on the failed keys themselves
        blamed.add(one(out, "task-erred", key="top").msg.origin)
    assert blamed == {"d0"}


def test_every_dependent_of_a_failed_task_errs_whatever_the_walk_order():
    """a fails; b and c depend on it and top on both: b and c err too, never released
    half way because the walk reached top through the other one first."""
    states = set()
    for n in range(30):
        s = with_workers(A)
        junk = [object() for _ in range(n)]  # moves the tasks' hashes, hence set order
        submit(s, graph(a=[], b=["a"], c=["a"], top=["b", "c"]), keys=["top"])
        step(s, ev.TaskErred(A, "a", exception="E", exception_text="E"))
        states.add((s.tasks["b"].state, s.tasks["c"].state, s.tasks["top"].state))
        del junk
    assert states == {("erred", "erred", "erred")}


def test_graph_resubmitted_after_a_failure_runs_again():
    """x fails, then a new graph with the same keys (dask keys are deterministic): x is
    retried and its dependents run, instead of inheriting the first failure."""
    s = with_workers(A)
    chain = graph(x=[], y=["x"], z=["y"])
    submit(s, chain, keys=["z"])
    step(s, ev.TaskStarted(A, "x"))
    out = step(s, ev.TaskErred(A, "x", exception="E", exception_text="E"))
    assert one(out, "task-erred", key="z")
    step(s, ev.ClientReleasesKeys("c", ["z"]))
    assert s.tasks == {}  # nothing of the failed chain is left behind
    out = submit(s, chain, keys=["z"])
    assert not sent(out, "task-erred")
    assert one(out, "compute-task", key="x")
    out = finish(s, A, "x")
    assert one(out, "compute-task", key="y")
    out = finish(s, A, "y")
    assert one(out, "compute-task", key="z")


def test_retries_recompute_then_err():
    s = with_workers(A)
    out = submit(s, graph(x=[]), keys=["x"], retries={"x": 1})
    one(out, "compute-task", key="x")
    step(s, ev.TaskStarted(A, "x"))
    out = step(s, ev.TaskErred(A, "x", exception="E1", exception_text="E1"))
    assert not sent(out, "task-erred")
    assert one(out, "compute-task", key="x").to == A  # second try
    step(s, ev.TaskStarted(A, "x"))
    out = step(s, ev.TaskErred(A, "x", exception="E2", exception_text="E2"))
    assert one(out, "task-erred", key="x").msg.exception == "E2"
    assert s.tasks["x"].state == "erred"


def test_resubmitting_an_erred_task_runs_it_again():
    s = with_workers(A)
    submit(s, graph(x=[]), keys=["x"])
    out = step(s, ev.TaskErred(A, "x", exception="E", exception_text="E"))
    assert one(out, "task-erred", key="x")
    out = submit(s, graph(x=[]), keys=["x"])
    assert one(out, "compute-task", key="x")


def test_update_graph_with_unknown_dependency_errs_naming_the_key():
    s = with_workers(A)
    out = submit(s, graph(y=["ghost"]), keys=["y"])
    e = one(out, "task-erred", key="y")
    assert "ghost" in e.msg.exception_text and "'y'" in e.msg.exception_text
    assert isinstance(e.msg.exception, KeyError)
    assert not sent(out, "compute-task")


# ---------------------------------------------------------------- lost workers
def test_worker_lost_while_processing_reschedules_elsewhere():
    s = with_workers(A, B)
    out = submit(s, graph(x=[]), keys=["x"])
    w = one(out, "compute-task", key="x").to
    other = B if w == A else A
    step(s, ev.TaskStarted(w, "x"))
    out = step(s, ev.RemoveWorker(w, "connection lost"))
    assert one(out, "compute-task", key="x").to == other
    assert s.tasks["x"].suspicious == 1
    assert not sent(out, "free-keys")  # nothing to tell the dead worker


def test_a_worker_that_left_is_not_kept_as_a_victim_of_stealing():
    # with stealing off (or one worker left) no round of stealing prunes the backlogged:
    # a worker given more tasks than threads must still go with the worker
    s = with_workers(A, B, nthreads=1)
    submit(s, graph(x=[]), keys=["x"])
    holder = next(iter(s.tasks["x"].who_has or [s.tasks["x"].processing_on])).address
    step(s, ev.TaskFinished(holder, "x", nbytes=8))
    out = submit(s, graph(y0=["x"], y1=["x"], y2=["x"]), keys=["y0", "y1", "y2"])
    assert {m.to for m in sent(out, "compute-task")} == {holder}
    assert [ws.address for ws in s.placement.backlogged] == [holder]
    step(s, ev.RemoveWorker(holder, "gone"))
    assert not s.placement.backlogged


def test_only_tasks_reported_started_are_suspicious_when_a_worker_dies():
    """A holds x (started) and y (assigned, not started): only x is blamed."""
    s = with_workers(A, nthreads=1)
    out = submit(s, graph(x=[], y=[]), keys=["x", "y"])
    assert {m.msg.key for m in out if m.to == A and m.msg.op == "compute-task"} == {"x", "y"}
    step(s, ev.TaskStarted(A, "x"))
    step(s, ev.RemoveWorker(A, "gone"))
    assert s.tasks["x"].suspicious == 1
    assert s.tasks["y"].suspicious == 0


def test_worker_lost_before_any_task_started_blames_what_it_held():
    """No "task-started" got out before the worker died (a task may crash it at once):
    everything it held is suspicious, as in dask, so a crashing task is still caught."""
    s = with_workers(A, B)
    out = submit(s, graph(x=[]), keys=["x"])
    w = one(out, "compute-task", key="x").to
    step(s, ev.RemoveWorker(w, "gone"))
    assert s.tasks["x"].suspicious == 1
    assert s.tasks["x"].state == "processing"  # rescheduled on the other worker


def test_task_that_kills_allowed_failures_workers_errs_with_killed_worker():
    workers = [f"tcp://w{i}" for i in range(5)]
    s = with_workers(*workers, allowed_failures=3)
    out = submit(s, graph(bad=[], good=[]), keys=["bad", "good"])
    for i in range(3):
        w = processing_on(s, "bad")
        step(s, ev.TaskStarted(w, "bad"))
        out = step(s, ev.RemoveWorker(w, f"killed {i}"))
        if i < 2:
            assert one(out, "compute-task", key="bad").to != w
    e = one(out, "task-erred", key="bad")
    exc = e.msg.exception
    assert isinstance(exc, KilledWorker)
    assert "'bad'" in str(exc) and "3 workers" in str(exc) and "killed 2" in str(exc)
    assert s.tasks["bad"].state == "erred"
    assert len(s.workers) == 2
    # the cluster keeps working
    w = processing_on(s, "good") if s.tasks["good"].state == "processing" else None
    if w is not None:
        out = finish(s, w, "good")
        assert one(out, "key-in-memory", key="good")
    assert s.tasks["good"].state == "memory"


def test_lost_only_copy_of_wanted_key_is_recomputed_from_its_inputs():
    s = with_workers(A, B)
    out = submit(s, graph(x=[], y=["x"]), keys=["y"])
    wx = one(out, "compute-task", key="x").to
    finish(s, wx, "x")
    finish(s, wx, "y")
    assert s.tasks["x"].state == "released"  # its data dropped after y was computed
    survivor = B if wx == A else A
    out = step(s, ev.RemoveWorker(wx, "killed"))
    assert one(out, "lost-data", key="y").to == "c"
    # y needs x again: x is recomputed first, on the survivor
    assert one(out, "compute-task", key="x").to == survivor
    assert s.tasks["y"].state == "waiting"
    out = finish(s, survivor, "x")
    assert one(out, "compute-task", key="y").to == survivor
    out = finish(s, survivor, "y")
    assert one(out, "key-in-memory", key="y")


def test_lost_dependency_of_a_processing_task_is_recomputed():
    s = with_workers(A, B)
    submit(s, graph(x=[]), keys=["x"])
    wx = processing_on(s, "x")
    finish(s, wx, "x")
    other = B if wx == A else A
    # y runs on the other worker (restricted there), x stays on wx only
    out = submit(s, graph(y=["x"]), keys=["y"], workers=[other])
    assert one(out, "compute-task", key="y").to == other
    out = step(s, ev.RemoveWorker(wx, "killed"))
    assert one(out, "free-keys", keys=["y"]).to == other  # y cannot run without x
    assert one(out, "compute-task", key="x").to == other
    out = finish(s, other, "x")
    assert one(out, "compute-task", key="y").to == other


def test_scattered_data_lost_with_its_worker_errs_clearly():
    s = with_workers(A)
    step(s, ev.AddClient("c"))
    step(s, ev.ScatterData("c", "s1", {"d": b"x"}, {"d": 1}))
    step(s, ev.AddKeys(A, {"d": 1}, scatter_id="s1"))
    out = step(s, ev.RemoveWorker(A, "killed"))
    e = one(out, "task-erred", key="d")
    assert "scattered" in e.msg.exception_text


def test_worker_ttl_removes_a_silent_worker_on_tick():
    s = new_scheduler(worker_ttl=10.0)
    step(s, ev.AddWorker(A, 1, now=0.0))
    step(s, ev.AddWorker(B, 1, now=0.0))
    submit(s, graph(x=[]), keys=["x"])
    w = processing_on(s, "x")
    live = B if w == A else A
    step(s, ev.Heartbeat(live, now=8.0))
    step(s, ev.Tick(now=9.0))
    assert set(s.workers) == {A, B}
    out = step(s, ev.Tick(now=12.0))
    assert set(s.workers) == {live}
    assert one(out, "compute-task", key="x").to == live


# ---------------------------------------------------------------- missing data
def test_missing_data_with_no_other_holder_recomputes():
    s = with_workers(A, B)
    submit(s, graph(x=[]), keys=["x"])
    wx = processing_on(s, "x")
    finish(s, wx, "x")
    other = B if wx == A else A
    out = submit(s, graph(y=["x"]), keys=["y"], workers=[other])
    assert one(out, "compute-task", key="y").to == other
    # other could not get x from wx: the scheduler's only copy is gone
    out = step(s, ev.MissingData(other, "x", wx))
    assert one(out, "lost-data", key="x")
    assert one(out, "free-keys", keys=["y"]).to == other
    w = one(out, "compute-task", key="x").to
    out = finish(s, w, "x")
    assert one(out, "compute-task", key="y").to == other


def test_missing_data_with_another_holder_refreshes_who_has():
    s = with_workers(A, B, C)
    submit(s, graph(x=[]), keys=["x"])
    wx = processing_on(s, "x")
    finish(s, wx, "x")
    second = next(w for w in (A, B, C) if w != wx)
    step(s, ev.AddKeys(second, {"x": 8}))
    third = next(w for w in (A, B, C) if w not in (wx, second))
    out = step(s, ev.MissingData(third, "x", wx))
    r = one(out, "refresh-who-has")
    assert r.to == third and r.msg.who_has == {"x": [second]}
    assert [ws.address for ws in s.tasks["x"].who_has] == [second]


# ---------------------------------------------------------------- cancel
def test_cancel_frees_the_running_task_and_its_dependents():
    s = with_workers(A)
    out = submit(s, graph(x=[], y=["x"]), keys=["x", "y"])
    one(out, "compute-task", key="x")
    out = step(s, ev.CancelKeys("c", ["x"]))
    assert one(out, "cancelled-keys", keys=["x"]).to == "c"
    assert one(out, "cancelled-keys", keys=["y"]).to == "c"
    assert one(out, "free-keys", keys=["x"]).to == A
    assert s.tasks == {}
    assert not s.workers[A].processing
    # a late result is dropped on the worker
    out = step(s, ev.TaskFinished(A, "x", nbytes=1))
    assert one(out, "free-keys", keys=["x"]).to == A


def test_a_cancelled_result_reported_early_is_freed_and_forgotten():
    """A worker reports a dependent finished before its dependency (a stray reply); the
    dependency is cancelled: the dependent's result is freed, and forgotten when lost."""
    s = with_workers(A)
    submit(s, graph(k=[], x=["k"], y=["k"]), keys=["k", "x", "y"], client="c")
    step(s, ev.TaskFinished(A, "y", nbytes=8))
    out = step(s, ev.CancelKeys("c", ["k"]))
    assert "y" in one(out, "free-keys", keys=["y"]).msg.keys
    step(s, ev.RemoveWorker(A, "gone"))  # validate() finds no task left behind
    assert s.tasks == {}


# ---------------------------------------------------------------- scatter
def test_scatter_then_add_keys_then_a_task_on_the_holder():
    s = with_workers(A, B)
    step(s, ev.AddClient("c"))
    out = step(s, ev.ScatterData("c", "s1", {"d1": "D1", "d2": "D2"}, {"d1": 10, "d2": 20}))
    ups = sent(out, "update-data")
    assert {m.to for m in ups} == {A, B}  # spread over the workers
    assert not sent(out, "scatter-reply")  # not before the workers have it
    holder = {}
    for m in ups:
        for k in m.msg.data:
            holder[k] = m.to
        out = step(s, ev.AddKeys(m.to, {k: 10 for k in m.msg.data}, scatter_id="s1"))
    assert one(out, "scatter-reply", scatter_id="s1", error=None).to == "c"
    assert s.tasks["d1"].state == "memory"
    out = submit(s, graph(y=["d1"]), keys=["y"])
    assert one(out, "compute-task", key="y").to == holder["d1"]


def test_scatter_without_workers_replies_with_an_error():
    s = new_scheduler()
    step(s, ev.AddClient("c"))
    out = step(s, ev.ScatterData("c", "s1", {"d": 1}, {"d": 1}))
    assert "no running worker" in one(out, "scatter-reply").msg.error


def test_scattering_a_held_key_again_with_a_new_size_is_accounted_on_every_holder():
    s = with_workers(A, B)
    step(s, ev.AddClient("c"))
    step(s, ev.ScatterData("c", "s1", {"d": b""}, {"d": 100}, workers=[A]))
    step(s, ev.AddKeys(A, {"d": 100}, scatter_id="s1"))
    step(s, ev.AddKeys(B, {"d": 8}))  # a copy (replicate, rebalance) reports its own size
    assert s.workers[A].nbytes == s.workers[B].nbytes == 8
    step(s, ev.ScatterData("c", "s2", {"d": b""}, {"d": 100}, workers=[A]))
    assert s.workers[A].nbytes == s.workers[B].nbytes == 100  # validate() checks the sums


def test_a_copy_that_arrives_while_its_task_waits_releases_an_input_nobody_wants():
    # k0 is in memory on A only; a rebalance asks B for a copy; A leaves, so k0 waits for
    # x, recomputed on B; the client lets x go; then B's copy of k0 arrives: x, which only
    # k0 waited for, is no longer wanted and must not stay processing
    s = with_workers(A)
    submit(s, graph(x=[]), keys=["x"])
    finish(s, A, "x")
    step(s, ev.AddWorker(B, 1))
    submit(s, graph(k0=["x"]), keys=["k0"])
    finish(s, A, "k0")
    step(s, ev.RebalanceKeys("r1", "c", None))
    step(s, ev.RemoveWorker(A, "gone"))
    assert s.tasks["x"].state == "processing" and s.tasks["k0"].state == "waiting"
    step(s, ev.ClientReleasesKeys("c", ["x"]))
    out = step(s, ev.AddKeys(B, {"k0": 8}))
    assert s.tasks["k0"].state == "memory"
    assert s.tasks["x"].state == "released"  # not left processing on B
    assert one(out, "free-keys", to=B).msg.keys == ["x"]  # B stops computing it


# ---------------------------------------------------------------- retirement
def test_retire_workers_moves_unique_data_then_closes():
    s = with_workers(A, B)
    submit(s, graph(x=[]), keys=["x"], workers=[A])
    finish(s, A, "x")
    out = step(s, ev.RetireWorkers("r1", "c", [A]))
    acq = one(out, "acquire-replicas")
    assert acq.to == B and acq.msg.who_has == {"x": [A]}
    assert not sent(out, "close")
    assert s.workers[A].status == "closing_gracefully"
    out = step(s, ev.AddKeys(B, {"x": 8}))
    assert one(out, "close").to == A
    reply = one(out, "retire-workers-reply", request_id="r1")
    assert reply.to == "c" and reply.msg.retired == [A]
    assert set(s.workers) == {B}
    assert [ws.address for ws in s.tasks["x"].who_has] == [B]


def test_retire_the_only_worker_with_unique_data_keeps_it():
    s = with_workers(A)
    submit(s, graph(x=[]), keys=["x"])
    finish(s, A, "x")
    out = step(s, ev.RetireWorkers("r1", "c", [A]))
    reply = one(out, "retire-workers-reply", request_id="r1")
    assert reply.msg.retired == [] and reply.msg.kept == [A]
    assert s.workers[A].status == "running"


def test_retired_worker_takes_no_new_work():
    s = with_workers(A, B)
    step(s, ev.RetireWorkers("r1", "c", [A]))
    assert set(s.workers) == {B}  # nothing to move: closed at once
    out = submit(s, graph(x=[]), keys=["x"])
    assert one(out, "compute-task", key="x").to == B


# ---------------------------------------------------------------- queuing
def test_rootish_tasks_are_queued_beyond_saturation_and_released_in_priority_order():
    # dask's queuing: blocks of the queue off
    s = with_workers(A, B, worker_saturation=1.1, queue_block_size=1)
    keys = [f"inc-{i}" for i in range(10)]
    out = submit(s, graph(**{k: [] for k in keys}), keys=keys,
                 static_priorities={k: i for i, k in enumerate(keys)})
    slots = math.ceil(1.1 * 1)  # per worker of one thread
    computes = sent(out, "compute-task")
    assert len(computes) == 2 * slots
    for w in (A, B):
        assert len(sent(computes, "compute-task", to=w)) == slots
    # the highest-priority tasks go first, the rest wait on the scheduler
    assert {m.msg.key for m in computes} == set(keys[:4])
    assert s.n_queued == 6
    assert all(s.tasks[k].state == "queued" for k in keys[4:])
    # a slot opens on A: the best queued task goes there
    first_a = sent(computes, "compute-task", to=A)[0].msg.key
    out = finish(s, A, first_a)
    assert [m.msg.key for m in sent(out, "compute-task")] == [keys[4]]
    assert sent(out, "compute-task")[0].to == A
    out = finish(s, B, sent(computes, "compute-task", to=B)[0].msg.key)
    assert [m.msg.key for m in sent(out, "compute-task")] == [keys[5]]
    assert s.n_queued == 4


def tree(leaves: int) -> dict:
    """A binary tree reduction: leaf-i, then add<level>-<i> combining two below."""
    deps: dict = {f"leaf-{i}": [] for i in range(leaves)}
    level = [f"leaf-{i}" for i in range(leaves)]
    depth = 0
    while len(level) > 1:
        level_up = [f"add{depth}-{i // 2}" for i in range(0, len(level), 2)]
        deps.update({k: level[2 * i:2 * i + 2] for i, k in enumerate(level_up)})
        level, depth = level_up, depth + 1
    return graph(**deps)


def run_in_turn(s: SchedulerState, out: list[Send], workers: list[str]) -> list[Send]:
    """Finish what the workers were given, one task of each worker in turn (a finished
    task's result stays on its worker), until nothing is processing; every compute-task
    sent on the way."""
    computes = sent(out, "compute-task")
    while any(s.workers[w].processing for w in workers):
        for w in workers:
            todo = sorted(s.workers[w].processing, key=lambda ts: ts.priority)
            if todo:
                computes += sent(finish(s, w, todo[0].key), "compute-task")
    return computes


def transfers(computes: list[Send]) -> int:
    """How many compute-tasks need a dependency from another worker."""
    return sum(1 for m in computes for holders in m.msg.who_has.values() if m.to not in holders)


def known_small(s: SchedulerState, prefix: str) -> None:
    """A task of group ``prefix`` finished with a small result, which stays wanted: blocks
    are used for the group from its first task on (they wait for such a result)."""
    key = f"{prefix}-999"  # of group ``prefix`` (key_split)
    submit(s, graph(**{key: []}), keys=[key])
    finish(s, processing_on(s, key), key)


def test_queued_blocks_keep_consecutive_root_tasks_on_one_worker():
    s = with_workers(A, B, worker_saturation=1.1, queue_block_size=32)
    known_small(s, "inc")
    keys = [f"inc-{i}" for i in range(10)]
    out = submit(s, graph(**{k: [] for k in keys}), keys=keys,
                 static_priorities={k: i for i, k in enumerate(keys)})
    # 10 tasks / 2 threads: blocks of 5; each worker fills its slots from its own block
    by_worker = {w: [m.msg.key for m in sent(out, "compute-task", to=w)] for w in (A, B)}
    assert sorted(by_worker.values()) == [["inc-0", "inc-1"], ["inc-5", "inc-6"]]
    a_first = by_worker[A][0]
    n = int(a_first.split("-")[1])
    out = finish(s, A, a_first)
    # A's freed slot takes the next task of its block, not the best queued one
    assert [(m.to, m.msg.key) for m in sent(out, "compute-task")] == [(A, f"inc-{n + 2}")]
    assert s.n_queued == 5
    run_in_turn(s, [], [A, B])
    assert all(s.tasks[k].state == "memory" for k in keys)
    assert not s.blocks.owned and not s.blocks.free  # nothing queued: no block is kept


@pytest.mark.parametrize("leaves", [64, 256])
def test_queued_blocks_cut_transfers_of_a_tree_reduction(leaves):
    """Without blocks, consecutive leaves alternate between the two workers, and most
    nodes above them wait for a transfer; with them, siblings share a worker (blocks of
    4 keep two levels together; larger ones more)."""
    counts = {}
    for size in (1, 4, 32):
        s = with_workers(A, B, worker_saturation=1.1, queue_block_size=size)
        g = tree(leaves)
        out = submit(s, g, keys=[list(g)[-1]])
        computes = run_in_turn(s, out, [A, B])
        assert len(computes) == len(g)
        assert s.tasks[list(g)[-1]].state == "memory"
        counts[size] = transfers(computes)
        assert max(len(s.workers[w].has_what) for w in (A, B)) >= 1
    assert counts[4] * 2 <= counts[1], counts  # the default
    assert counts[32] * 4 <= counts[1] and counts[32] <= leaves // 8, counts


def held_at_peak_and_transfers(s: SchedulerState, out: list[Send], nbytes: int) -> tuple:
    """run_in_turn, with results of ``nbytes``: the most results held at once, and transfers."""
    computes, peak = sent(out, "compute-task"), 0
    while any(ws.processing for ws in s.workers.values()):
        for w in list(s.workers):
            todo = sorted(s.workers[w].processing, key=lambda ts: ts.priority)
            if todo:
                computes += sent(finish(s, w, todo[0].key, nbytes=nbytes), "compute-task")
                peak = max(peak, sum(len(ws.has_what) for ws in s.workers.values()))
    return peak, transfers(computes)


def test_queued_blocks_are_for_small_results_only():
    """Blocks hold more results at once; they wait for the first result of a group, and
    with results of 1 MB and more, the queue stays dask's (scheduler.queue-block-bytes)."""
    got = {}
    for size, nbytes in [(1, 8), (1, 2_000_000), (4, 8), (4, 2_000_000)]:
        s = with_workers(A, B, worker_saturation=1.1, queue_block_size=size)
        g = tree(128)
        out = submit(s, g, keys=[list(g)[-1]])
        got[size, nbytes] = held_at_peak_and_transfers(s, out, nbytes)
        assert s.tasks[list(g)[-1]].state == "memory"
    (peak1, moved1), (peak_small, moved_small) = got[1, 8], got[4, 8]
    assert moved_small * 2 <= moved1 and peak_small > peak1  # the trade
    peak_big, moved_big = got[4, 2_000_000]
    assert peak_big == got[1, 2_000_000][0] == peak1  # dask's peak
    assert moved_big > 0.9 * moved1  # no block was claimed
    s = with_workers(A, B, worker_saturation=1.1, queue_block_size=4, queue_block_bytes=8_000_000)
    g = tree(128)
    peak, moved = held_at_peak_and_transfers(s, submit(s, g, keys=[list(g)[-1]]), 2_000_000)
    assert peak == peak_small and moved * 2 <= moved1  # a larger bound: blocks again


def test_queued_blocks_keep_first_come_first_served_between_submissions():
    s = with_workers(A, B, worker_saturation=1.0, queue_block_size=32)
    first = [f"first-{i}" for i in range(20)]
    submit(s, graph(**{k: [] for k in first}), keys=first)
    later = [f"later-{i}" for i in range(20)]
    submit(s, graph(**{k: [] for k in later}), keys=later, priority=10)
    computes = run_in_turn(s, [], [A, B])
    names = [m.msg.key.split("-")[0] for m in computes]
    # the two running "first" tasks were sent before; the other 18 all go before "later"
    assert names == ["first"] * 18 + ["later"] * 20
    assert all(s.tasks[k].state == "memory" for k in first + later)


def test_a_removed_workers_block_is_taken_over():
    s = with_workers(A, B, worker_saturation=1.0, queue_block_size=32)
    keys = [f"inc-{i}" for i in range(40)]
    submit(s, graph(**{k: [] for k in keys}), keys=keys,
           static_priorities={k: i for i, k in enumerate(keys)})
    (on_b,) = s.workers[B].processing
    step(s, ev.RemoveWorker(B))
    # B's task runs again on A; all of B's block goes there too, in order
    run_in_turn(s, [], [A])
    assert all(s.tasks[k].state == "memory" for k in keys)
    assert s.tasks[on_b.key].who_has == {s.workers[A]}


def test_blocks_follow_the_cluster_size():
    # tasks / threads caps a block: here 18 tasks over 6 threads make blocks of 3
    s = with_workers(A, B, C, nthreads=2, worker_saturation=1.0, queue_block_size=32)
    known_small(s, "inc")  # 19 tasks of the group over 6 threads: blocks of 3 too
    keys = [f"inc-{i}" for i in range(18)]
    out = submit(s, graph(**{k: [] for k in keys}), keys=keys,
                 static_priorities={k: i for i, k in enumerate(keys)})
    got = sorted(sorted(int(m.msg.key.split("-")[1]) for m in sent(out, "compute-task", to=w))
                 for w in (A, B, C))
    assert got == [[0, 1], [3, 4], [6, 7]]


def test_queued_tasks_whose_dependency_is_lost_wait_for_it_again():
    """Root-ish tasks with one shared dependency queue; when the only copy of that
    dependency is lost, they go back to waiting and run after it is recomputed."""
    s = with_workers(A, B, worker_saturation=1.0)
    submit(s, graph(k=[]), keys=["k"])
    holder = processing_on(s, "k")
    finish(s, holder, "k")
    keys = [f"x-{i}" for i in range(12)]
    submit(s, graph(**{k: ["k"] for k in keys}), keys=keys)
    assert s.n_queued == 10 and s.tasks["x-0"].dependencies == {s.tasks["k"]}
    out = step(s, ev.RemoveWorker(holder))  # validate() runs after every step
    assert all(s.tasks[k].state == "waiting" for k in keys) and not s.n_queued
    assert one(out, "compute-task", key="k")
    other = B if holder == A else A
    finish(s, other, "k")
    assert s.n_queued == 11 and s.tasks["k"].state == "memory"


def test_queued_tasks_drain_completely():
    s = with_workers(A, worker_saturation=1.0)
    keys = [f"inc-{i}" for i in range(6)]
    submit(s, graph(**{k: [] for k in keys}), keys=keys)
    done = 0
    while done < 6:
        ws = s.workers[A]
        assert len(ws.processing) == 1
        (ts,) = ws.processing
        finish(s, A, ts.key)
        done += 1
    assert all(s.tasks[k].state == "memory" for k in keys)
    assert s.n_queued == 0


def test_no_queuing_with_infinite_saturation():
    s = with_workers(A, B, worker_saturation=float("inf"))
    keys = [f"inc-{i}" for i in range(10)]
    out = submit(s, graph(**{k: [] for k in keys}), keys=keys)
    assert len(sent(out, "compute-task")) == 10
    assert s.n_queued == 0


# ---------------------------------------------------------------- stealing
def test_idle_worker_steals_not_started_work():
    s = with_workers(A, worker_saturation=float("inf"), work_stealing=True)
    keys = [f"slow-{i}" for i in range(4)]
    submit(s, graph(**{k: [] for k in keys}), keys=keys)
    assert len(s.workers[A].processing) == 4
    step(s, ev.TaskStarted(A, keys[0]))
    step(s, ev.AddWorker(B, 1))
    out = step(s, ev.Tick(now=1.0))
    reqs = sent(out, "steal-request", to=A)
    assert reqs and keys[0] not in {m.msg.key for m in reqs}  # never the running one
    key = reqs[0].msg.key
    out = step(s, ev.StealResponse(A, key, "released"))
    assert one(out, "compute-task", key=key).to == B
    # a victim that already runs it keeps it
    if len(reqs) > 1:
        k2 = reqs[1].msg.key
        step(s, ev.StealResponse(A, k2, "executing"))
        assert processing_on(s, k2) == A


def test_a_steal_overtaken_by_the_task_leaves_no_target_behind():
    """The victim finishes the task before the steal request reaches it (the usual case
    for short tasks): its steal-response then finds the task done, or forgotten. The thief
    planned for it must not be kept, or ``steal_targets`` grows by one key per such
    steal for as long as the scheduler runs."""
    s = with_workers(A, worker_saturation=float("inf"), work_stealing=True)
    keys = [f"slow-{i}" for i in range(4)]
    submit(s, graph(**{k: [] for k in keys}), keys=keys)
    step(s, ev.TaskStarted(A, keys[0]))
    step(s, ev.AddWorker(B, 1))
    reqs = sent(step(s, ev.Tick(now=1.0)), "steal-request", to=A)
    assert reqs and s.maintenance.steal_targets
    for m in reqs:  # A runs them all before it reads the requests
        finish(s, A, m.msg.key)
    # out of processing: no steal of them is pending any more
    assert not s.maintenance.steal_targets
    step(s, ev.ClientReleasesKeys("c", [m.msg.key for m in reqs]))
    for m in reqs:  # the responses of a victim that had run (and dropped) them
        step(s, ev.StealResponse(A, m.msg.key, "released"))
    assert not s.maintenance.steal_targets


def test_a_steal_from_a_worker_that_leaves_leaves_no_target_behind():
    s = with_workers(A, worker_saturation=float("inf"), work_stealing=True)
    keys = [f"slow-{i}" for i in range(4)]
    submit(s, graph(**{k: [] for k in keys}), keys=keys)
    step(s, ev.TaskStarted(A, keys[0]))
    step(s, ev.AddWorker(B, 1))
    assert sent(step(s, ev.Tick(now=1.0)), "steal-request", to=A)
    step(s, ev.RemoveWorker(A))  # no steal-response will come
    assert not s.maintenance.steal_targets


@pytest.mark.parametrize("policy", ["co-assign", "mars"])
def test_other_rootish_policies_run_everything(policy: str):
    s = with_workers(A, B, worker_saturation=float("inf"), rootish_policy=policy)
    keys = [f"inc-{i}" for i in range(8)]
    tasks = graph(**{k: [] for k in keys})
    tasks["total"] = {"run_spec": "sum", "deps": keys}
    submit(s, tasks, keys=["total"])
    for _ in range(20):
        todo = [(ts.processing_on.address, ts.key) for ts in s.tasks.values()
                if ts.state == "processing"]
        if not todo:
            break
        for w, k in todo:
            finish(s, w, k)
    assert [k for k, ts in s.tasks.items() if ts.state == "memory"] == ["total"]


def test_unknown_rootish_policy_is_refused():
    with pytest.raises(ValueError, match="rootish-policy"):
        SchedulerState(rootish_policy="random")


def test_client_disconnect_releases_its_keys():
    s = with_workers(A)
    submit(s, graph(x=[], y=["x"]), keys=["y"])
    out = step(s, ev.RemoveClient("c"))
    assert one(out, "free-keys", keys=["x"]).to == A
    assert s.tasks == {}


def test_queued_tasks_wait_out_a_cluster_without_workers():
    s = with_workers(A, worker_saturation=1.0)
    keys = [f"inc-{i}" for i in range(5)]
    submit(s, graph(**{k: [] for k in keys}), keys=keys)
    assert s.n_queued == 4
    assert processing_on(s, keys[0]) == A
    step(s, ev.TaskStarted(A, keys[0]))
    step(s, ev.RemoveWorker(A, "killed"))
    assert not s.workers
    assert all(s.tasks[k].state in ("queued", "no-worker") for k in keys)
    out = step(s, ev.AddWorker(B, 1))
    assert one(out, "compute-task", key=keys[0]).to == B  # best priority first
    done = 0
    while done < 5:
        (ts,) = s.workers[B].processing
        finish(s, B, ts.key)
        done += 1
    assert all(s.tasks[k].state == "memory" for k in keys)


def test_worker_joining_with_data_registers_replicas_and_frees_unknown_keys():
    s = with_workers(A)
    submit(s, graph(x=[]), keys=["x"])
    finish(s, A, "x")
    out = step(s, ev.AddWorker(B, 1, keys={"x": 8, "stale": 3}))
    assert one(out, "free-keys", keys=["stale"]).to == B
    assert {ws.address for ws in s.tasks["x"].who_has} == {A, B}


def test_worker_dropping_the_last_copy_recomputes():
    s = with_workers(A)
    submit(s, graph(x=[]), keys=["x"])
    finish(s, A, "x")
    out = step(s, ev.ReleaseWorkerData(A, ["x"]))
    assert one(out, "lost-data", key="x")
    assert one(out, "compute-task", key="x").to == A


def test_retiring_several_workers_replies_with_all_of_them():
    s = with_workers(A, B, C)
    submit(s, graph(x=[]), keys=["x"], workers=[A])
    submit(s, graph(y=[]), keys=["y"], workers=[B])
    finish(s, A, "x")
    finish(s, B, "y")
    out = step(s, ev.RetireWorkers("r1", "c", [A, B]))
    assert {m.msg.who_has.popitem()[0] for m in sent(out, "acquire-replicas", to=C)} == \
        {"x", "y"}
    out = step(s, ev.AddKeys(C, {"x": 8}))
    assert one(out, "close").to == A
    assert not sent(out, "retire-workers-reply")  # B is not done yet
    out = step(s, ev.AddKeys(C, {"y": 8}))
    assert one(out, "close").to == B
    reply = one(out, "retire-workers-reply", request_id="r1")
    assert sorted(reply.msg.retired) == [A, B] and reply.msg.kept == []
    assert set(s.workers) == {C}


# ---------------------------------------------------------------- rejected input
def _snapshot(s: SchedulerState) -> tuple:
    return (sorted(map(repr, s.tasks)), {k: ts.state for k, ts in s.tasks.items()},
            s.generation, sorted(s.groups), s.n_queued)


@pytest.mark.parametrize("bad", [
    dict(tasks=graph(x=[], y=["x", "y"])),  # depends on itself
    dict(tasks=graph(a=["c"], b=["a"], c=["b"])),  # a cycle
    dict(tasks=graph(x=[]), keys=5),  # keys not a list
    dict(tasks=graph(x=[]), keys=[[1]]),  # an unhashable key
    dict(tasks={"x": {"deps": []}}),  # no run_spec
    dict(tasks={"x": {"run_spec": "s", "deps": [["unhashable"]]}}),
    dict(tasks={"x": {"run_spec": "s", "deps": 7}}),
    dict(tasks=["not", "a", "dict"]),
    dict(tasks=graph(x=[]), priority="high"),
    dict(tasks=graph(x=[]), retries={"x": -1}),
    dict(tasks=graph(x=[]), retries={"x": "3"}),
    dict(tasks=graph(x=[]), resources={"GPU": "one"}),
    dict(tasks=graph(x=[]), workers=[["tcp://a"]]),  # a list where an address goes
    dict(tasks=graph(x=[]), static_priorities={"x": "first"}),
    dict(tasks=graph(x=[]), annotations={"retries": {"x": -2}}),
    dict(tasks=graph(x=[]), annotations={"workers": "not-a-mapping"}),
])
def test_a_rejected_update_graph_changes_nothing(bad):
    s = with_workers(A)
    submit(s, graph(held=[]), ["held"])
    finish(s, A, "held")
    before = _snapshot(s)
    event = ev.UpdateGraph("c", bad.pop("tasks"), bad.pop("keys", ["x"]), **bad)
    with pytest.raises(ev.MalformedMessage, match="update-graph"):
        s.handle(event)
    s.validate()
    assert _snapshot(s) == before
    # and the state still works
    submit(s, graph(z=["held"]), ["z"])
    assert s.tasks["z"].state == "processing"


# ---------------------------------------------------------------- no-workers-timeout
def test_a_task_no_worker_can_run_fails_after_the_no_workers_timeout():
    """``workers=`` naming a worker the cluster does not have: with
    ``no_workers_timeout`` (dask's ``no-workers-timeout``) the task waits that long, then
    fails naming what it asked for; a task that can run is not touched, and without the
    setting the task waits for a worker that can run it."""
    s = with_workers(A, no_workers_timeout=30.0)
    out = submit(s, graph(x=[], y=[]), keys=["x", "y"],
                 annotations={"workers": {"x": ["tcp://nowhere"]}})
    assert s.tasks["x"].state == "no-worker"
    one(out, "compute-task", key="y")
    assert not sent(step(s, ev.Tick(now=100.0)), "task-erred")  # seen no-worker from now
    assert not sent(step(s, ev.Tick(now=129.0)), "task-erred")
    out = step(s, ev.Tick(now=131.0))
    erred = one(out, "task-erred", key="x")
    assert erred.to == "c"
    assert "workers=['tcp://nowhere']" in s.tasks["x"].exception_text
    assert "scheduler.no-workers-timeout" in s.tasks["x"].exception_text
    assert s.tasks["y"].state == "processing"

    waits = with_workers(A)
    submit(waits, graph(x=[]), keys=["x"], annotations={"workers": {"x": ["tcp://nowhere"]}})
    step(waits, ev.Tick(now=0.0))
    step(waits, ev.Tick(now=10_000.0))
    assert waits.tasks["x"].state == "no-worker"


def test_a_workers_description_names_it_as_dask_does():
    """``scheduler_info()['workers'][address]``: its ``name``, and dask's ``id`` (the same)."""
    s = with_workers(A)
    info = s.workers[A].info()
    assert info["name"] == info["id"] == "a"
    assert info["address"] == A and info["nthreads"] == 1
