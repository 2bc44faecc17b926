"""WorkerState driven by events alone: no processes, no threads, no clock.

Events in (compute-task, transfers finishing, executions finishing), commands
out (``Send`` to the scheduler, ``Execute``, ``GatherDep``), and
:meth:`WorkerState.validate` after every step. The worker is ``tcp://me``;
peers are ``tcp://p1``, ``tcp://p2``.
"""

from __future__ import annotations

import pytest

from hpcsched.core.state import events as ev
from hpcsched.core.state.events import GatherDep, InvalidTransition
from hpcsched.core.state.worker_state import LEGAL_TRANSITIONS
from tests.core.state.harness import (
    ME,
    P1,
    P2,
    compute,
    executes,
    new_worker,
    step,
    success,
    to_scheduler,
)


def gathers(out: list) -> dict[str, list]:
    return {c.worker: sorted(c.keys) for c in out if type(c) is GatherDep}


# ---------------------------------------------------------------- compute
def test_task_without_dependencies_executes_and_reports():
    s = new_worker()
    out = step(s, compute("x"))
    assert executes(out) == ["x"]
    assert to_scheduler(out, "task-started", key="x")
    out = step(s, success("x", 42))
    (fin,) = to_scheduler(out, "task-finished", key="x")
    assert fin.msg.nbytes == 8 and fin.msg.typename == "int"
    assert fin.msg.start == 1.0 and fin.msg.stop == 2.0
    assert s.data == {"x": 42}
    out = step(s, ev.FreeKeys(["x"]))
    assert s.data == {} and s.tasks == {}


def test_dependencies_on_peers_are_fetched_in_one_message_per_peer():
    s = new_worker()
    out = step(s, compute("y", {"a": [P1], "b": [P1], "c": [P2]}))
    assert gathers(out) == {P1: ["a", "b"], P2: ["c"]}
    assert executes(out) == []
    assert s.tasks["y"].state == "waiting"
    assert {s.tasks[k].state for k in "abc"} == {"flight"}
    out = step(s, ev.GatherDepSuccess(P1, {"a": 1, "b": 2}))
    assert executes(out) == []  # c still missing
    out = step(s, ev.GatherDepSuccess(P2, {"c": 3}))
    assert executes(out) == ["y"]
    out = step(s, success("y", 6))
    assert to_scheduler(out, "task-finished", key="y")
    # fetched only for y: dropped once y is done; y's own result is kept
    assert s.data == {"y": 6}


def test_dependency_already_here_is_not_fetched():
    s = new_worker()
    step(s, compute("x"))
    step(s, success("x", 1))
    out = step(s, compute("y", {"x": [ME]}))
    assert gathers(out) == {}
    assert executes(out) == ["y"]


def test_transfers_limited_by_the_incoming_count_limit():
    s = new_worker(transfer_incoming_count_limit=1)
    out = step(s, compute("y", {"a": [P1], "b": [P2]}))
    assert len(gathers(out)) == 1  # one peer at a time
    first = next(iter(gathers(out)))
    key = gathers(out)[first][0]
    out = step(s, ev.GatherDepSuccess(first, {key: 1}))
    assert len(gathers(out)) == 1 and first not in gathers(out)
    second = next(iter(gathers(out)))
    out = step(s, ev.GatherDepSuccess(second, {gathers(out)[second][0]: 2}))
    assert executes(out) == ["y"]


def test_large_batches_are_split_by_message_bytes():
    s = new_worker(transfer_message_bytes=15)
    out = step(s, compute("y", {"a": [P1], "b": [P1], "c": [P1]}))
    (batch,) = gathers(out).values()
    assert 1 <= len(batch) < 3  # 10 bytes each, 15 bytes per message


def test_execute_failure_reports_task_erred():
    s = new_worker()
    step(s, compute("x"))
    out = step(s, ev.ExecuteFailure("x", "EXC", "TB", "ValueError: no", 1.0, 2.0))
    (err,) = to_scheduler(out, "task-erred", key="x")
    assert err.msg.exception == "EXC" and err.msg.traceback == "TB"
    assert err.msg.exception_text == "ValueError: no"
    assert "x" not in s.data and "x" not in s.tasks


# ---------------------------------------------------------------- peers failing
def test_peer_without_the_data_is_reported_and_another_holder_tried():
    s = new_worker()
    out = step(s, compute("y", {"a": [P1, P2]}))
    (peer,) = gathers(out)
    other = P2 if peer == P1 else P1
    out = step(s, ev.GatherDepSuccess(peer, {}, missing=["a"]))
    (md,) = to_scheduler(out, "missing-data", key="a")
    assert md.msg.errant_worker == peer
    assert gathers(out) == {other: ["a"]}
    out = step(s, ev.GatherDepSuccess(other, {"a": 1}))
    assert executes(out) == ["y"]


def test_unreachable_peer_is_dropped_and_others_tried():
    s = new_worker()
    out = step(s, compute("y", {"a": [P1, P2], "b": [P1]}))
    assert P1 in gathers(out)
    out = step(s, ev.GatherDepFailure(P1, gathers(out)[P1], "connection refused"))
    # a comes from P2 now; b had no other holder: the scheduler is told
    assert gathers(out).get(P2) == ["a"]
    reported = {m.msg.key for m in to_scheduler(out, "missing-data")}
    assert "b" in reported
    assert s.tasks["b"].state == "missing"
    assert P1 not in s.tasks["a"].who_has
    # the scheduler tells us where b is now
    out = step(s, ev.RefreshWhoHas({"b": [P2]}))
    out += step(s, ev.GatherDepSuccess(P2, {"a": 1}))
    assert gathers(out) == {P2: ["b"]}
    out = step(s, ev.GatherDepSuccess(P2, {"b": 2}))
    assert executes(out) == ["y"]


# ---------------------------------------------------------------- free-keys
def test_free_keys_while_executing_drops_the_result():
    s = new_worker()
    step(s, compute("x"))
    out = step(s, ev.FreeKeys(["x"]))
    assert out == [ev.Interrupt(["x"])]  # a running task that asked (a command) may stop
    out = step(s, success("x", 1))
    assert to_scheduler(out, "task-finished") == []
    assert s.data == {} and "x" not in s.tasks
    # the thread is free for the next task
    assert executes(step(s, compute("z"))) == ["z"]


def test_free_keys_interrupts_only_what_runs_here_or_has_no_task():
    # a freed result held in memory makes no command: no lock, no parse of its key on the
    # server; a running task and a key with no task here (a bulk map's element, whose
    # range may not have reached it) are named
    s = new_worker()
    step(s, compute("held"))
    step(s, success("held", 1))
    step(s, compute("running"))
    assert step(s, ev.FreeKeys(["held"])) == []
    assert s.data == {}
    assert step(s, ev.FreeKeys(["running", "map-7"])) == [ev.Interrupt(["running", "map-7"])]


def test_free_keys_while_in_flight_drops_the_transfer():
    s = new_worker()
    step(s, compute("y", {"a": [P1]}))
    step(s, ev.FreeKeys(["y"]))
    out = step(s, ev.GatherDepSuccess(P1, {"a": 1}))
    assert executes(out) == []
    assert s.data == {}


def test_compute_again_after_free_while_executing_keeps_the_result():
    """free-keys then compute-task again for the same key while it runs (e.g. a cancel
    followed by a resubmit): the running execution's result is what is wanted."""
    s = new_worker()
    step(s, compute("x"))
    step(s, ev.FreeKeys(["x"]))
    out = step(s, compute("x"))
    assert executes(out) == []  # already running
    out = step(s, success("x", 5))
    assert to_scheduler(out, "task-finished", key="x")
    assert s.data == {"x": 5}


# ---------------------------------------------------------------- ordering and limits
def test_ready_tasks_run_highest_priority_first():
    s = new_worker(nthreads=1)
    assert executes(step(s, compute("first", priority=(0, 0, 0)))) == ["first"]
    for key, prio in [("low", (1, 0, 9)), ("high", (1, 0, 1)), ("mid", (1, 0, 5))]:
        assert executes(step(s, compute(key, priority=prio))) == []
    order = []
    running = "first"
    for _ in range(3):
        out = step(s, success(running))
        (running,) = executes(out)
        order.append(running)
    assert order == ["high", "mid", "low"]


def test_nthreads_limit_concurrent_executions():
    s = new_worker(nthreads=2)
    out = []
    for k in "abcd":
        out += step(s, compute(k))
    assert sorted(executes(out)) == ["a", "b"]
    assert len(s.executing) == 2
    out = step(s, success("a"))
    assert executes(out) == ["c"]


def runs_ranges(out: list) -> int:
    return sum(1 for c in out if type(c) is ev.RunRanges)


def test_ranges_of_bulk_maps_and_tasks_share_the_thread_slots():
    """One thread: a thread of ranges holds the slot, so a task waits for it to end, and
    ranges wait for a running task; two slots hold one of each."""
    s = new_worker(nthreads=1)
    assert runs_ranges(step(s, ev.RangesWaiting(1))) == 1
    assert executes(step(s, compute("a"))) == []
    out = step(s, ev.RangeThreadDone(1))  # it gave the slot up: a task waited
    assert executes(out) == ["a"] and runs_ranges(out) == 0
    out = step(s, success("a"))
    assert runs_ranges(out) == 1 and s.range_threads == 1
    assert runs_ranges(step(s, ev.RangesWaiting(1))) == 0  # no free slot
    assert runs_ranges(step(s, ev.RangeThreadDone(0))) == 0 and s.range_threads == 0

    s = new_worker(nthreads=2)
    out = step(s, compute("a")) + step(s, compute("b")) + step(s, ev.RangesWaiting(2))
    assert executes(out) == ["a", "b"] and runs_ranges(out) == 0
    out = step(s, success("a"))
    assert runs_ranges(out) == 1 and executes(out) == []


def test_ready_tasks_take_a_free_slot_before_waiting_ranges():
    s = new_worker(nthreads=1)
    step(s, compute("a"))
    step(s, compute("b"))
    step(s, ev.RangesWaiting(1))
    out = step(s, success("a"))
    assert executes(out) == ["b"] and runs_ranges(out) == 0
    assert runs_ranges(step(s, success("b"))) == 1


def test_a_paused_or_closing_worker_starts_no_thread_of_ranges():
    s = new_worker(nthreads=1)
    step(s, ev.PauseWorker(True))
    assert runs_ranges(step(s, ev.RangesWaiting(1))) == 0
    assert runs_ranges(step(s, ev.PauseWorker(False))) == 1


def test_resource_restrictions_limit_concurrency():
    s = new_worker(nthreads=4, resources={"GPU": 1})
    out = step(s, compute("g1", resource_restrictions={"GPU": 1}))
    out += step(s, compute("g2", resource_restrictions={"GPU": 1}))
    out += step(s, compute("cpu"))
    assert sorted(executes(out)) == ["cpu", "g1"]  # g2 waits for the GPU, cpu does not
    out = step(s, success("g1"))
    assert executes(out) == ["g2"]
    assert s.available_resources == {"GPU": 0}
    step(s, success("g2"))
    assert s.available_resources == {"GPU": 1}


def devices_of(out: list) -> dict:
    return {c.key: c.devices for c in out if type(c) is ev.Execute}


def test_a_task_is_given_distinct_devices_and_gives_them_back_however_it_ends():
    """Four GPUs: four one-GPU tasks run at once, each on its own device; a two-GPU task
    waits for two, and gets the two freed first (lowest ids first); a failed task's
    device is free again, as is a cancelled one's once its thread ends."""
    s = new_worker(nthreads=8, resources={"GPU": 4}, devices={"GPU": ["0", "1", "2", "3"]})
    out = []
    for k in ("a", "b", "c", "d"):
        out += step(s, compute(k, resource_restrictions={"GPU": 1}))
    assert devices_of(out) == {"a": {"GPU": ("0",)}, "b": {"GPU": ("1",)},
                               "c": {"GPU": ("2",)}, "d": {"GPU": ("3",)}}
    out = step(s, compute("pair", resource_restrictions={"GPU": 2}))
    out += step(s, compute("cpu"))
    assert devices_of(out) == {"cpu": None}  # the pair waits for two devices
    out = step(s, success("c"))
    assert executes(out) == []
    out = step(s, ev.ExecuteFailure("a", b"", "", "boom", 1.0, 2.0))
    assert devices_of(out) == {"pair": {"GPU": ("0", "2")}}
    assert s.free_devices == {"GPU": []}
    step(s, ev.FreeKeys(["b"]))  # cancelled while it runs: its device is held until it ends
    assert s.free_devices == {"GPU": []}
    step(s, success("b"))
    assert s.free_devices == {"GPU": ["1"]}
    for k in ("d", "pair"):
        step(s, success(k))
    assert s.free_devices == {"GPU": ["0", "1", "2", "3"]}
    assert s.available_resources == {"GPU": 4}


def test_a_fraction_of_a_device_is_counted_and_names_none():
    s = new_worker(nthreads=4, resources={"GPU": 1}, devices={"GPU": ["7"]})
    out = step(s, compute("h1", resource_restrictions={"GPU": 0.5}))
    out += step(s, compute("h2", resource_restrictions={"GPU": 0.5}))
    assert devices_of(out) == {"h1": None, "h2": None}
    assert s.free_devices == {"GPU": ["7"]}


def test_more_devices_claimed_than_found_is_refused():
    with pytest.raises(ValueError, match="GPU=4 but only 2 devices"):
        new_worker(resources={"GPU": 4}, devices={"GPU": ["0", "1"]})


# ---------------------------------------------------------------- stealing, replicas, scatter
def test_steal_request_for_a_ready_task_gives_it_up():
    s = new_worker(nthreads=1)
    step(s, compute("busy"))
    step(s, compute("queued"))
    out = step(s, ev.StealRequest("queued"))
    (r,) = to_scheduler(out, "steal-response", key="queued")
    assert r.msg.state == "released"
    out = step(s, success("busy"))
    assert executes(out) == []  # it was given away


def test_steal_request_for_an_executing_task_keeps_it():
    s = new_worker(nthreads=1)
    step(s, compute("busy"))
    out = step(s, ev.StealRequest("busy"))
    (r,) = to_scheduler(out, "steal-response", key="busy")
    assert r.msg.state == "executing"
    out = step(s, success("busy"))
    assert to_scheduler(out, "task-finished", key="busy")


def test_acquire_replicas_fetches_and_reports_add_keys():
    s = new_worker()
    out = step(s, ev.AcquireReplicas({"x": [P1]}, {"x": 100}))
    assert gathers(out) == {P1: ["x"]}
    out = step(s, ev.GatherDepSuccess(P1, {"x": "value"}))
    (ak,) = to_scheduler(out, "add-keys")
    assert ak.msg.keys == {"x": 100}
    assert s.data == {"x": "value"}  # kept until the scheduler frees it


def test_update_data_stores_and_reports_with_the_scatter_id():
    s = new_worker()
    out = step(s, ev.UpdateData({"d": b"12345"}, scatter_id="s1"))
    (ak,) = to_scheduler(out, "add-keys", scatter_id="s1")
    assert ak.msg.keys == {"d": 5}
    out = step(s, compute("y", {"d": [ME]}))
    assert executes(out) == ["y"]
    step(s, success("y"))
    assert "d" in s.data  # scattered data stays until freed


def test_compute_task_for_a_key_held_here_reports_finished_at_once():
    s = new_worker()
    step(s, ev.UpdateData({"x": 3}))
    out = step(s, compute("x"))
    assert executes(out) == []
    assert to_scheduler(out, "task-finished", key="x")


def test_compute_task_for_a_key_in_flight_computes_it_and_reports_once():
    """a is being fetched for y when the scheduler asks us to compute a itself (its holder
    was lost, and we were chosen): the late transfer must not leave a un-reported."""
    s = new_worker(nthreads=2)
    out = step(s, compute("y", {"a": [P1]}))
    assert gathers(out) == {P1: ["a"]}
    out = step(s, compute("a"))
    assert executes(out) == ["a"]
    out = step(s, ev.GatherDepSuccess(P1, {"a": "fetched"}))
    out += step(s, success("a", "computed"))
    assert len(to_scheduler(out, "task-finished", key="a")) == 1
    assert executes(out) == ["y"]
    assert s.data["a"] in ("fetched", "computed")


def test_compute_task_for_a_key_in_flight_whose_transfer_fails():
    s = new_worker(nthreads=2)
    step(s, compute("y", {"a": [P1]}))
    out = step(s, compute("a"))
    assert executes(out) == ["a"]
    out = step(s, ev.GatherDepFailure(P1, ["a"], "connection lost"))
    assert to_scheduler(out, "missing-data") == []  # we compute it: nothing is missing
    out = step(s, success("a", 1))
    assert to_scheduler(out, "task-finished", key="a")
    assert executes(out) == ["y"]


def test_steal_of_a_task_whose_dependency_is_in_flight_drops_the_transfer():
    s = new_worker()
    step(s, compute("y", {"a": [P1]}))
    out = step(s, ev.StealRequest("y"))
    (r,) = to_scheduler(out, "steal-response", key="y")
    assert r.msg.state == "released"
    out = step(s, ev.GatherDepSuccess(P1, {"a": 1}))
    assert executes(out) == [] and s.data == {} and s.tasks == {}


def test_a_dependency_needed_by_two_tasks_is_fetched_once_and_kept_until_both_ran():
    s = new_worker(nthreads=1)
    out = step(s, compute("y1", {"a": [P1]}))
    out += step(s, compute("y2", {"a": [P1]}))
    assert [c for c in out if type(c) is GatherDep] == [GatherDep(P1, ["a"])]
    out = step(s, ev.GatherDepSuccess(P1, {"a": 1}))
    (first,) = executes(out)
    out = step(s, success(first))
    (second,) = executes(out)
    assert "a" in s.data  # the second still needs it
    step(s, success(second))
    assert "a" not in s.data


# ---------------------------------------------------------------- watching transitions
def test_watched_transitions_come_after_each_event_in_order_and_stop_when_unwatched():
    """y needs a from P1: a is fetched, y runs, both are freed. Each event's changes
    arrive in one call, after the event (the state is consistent then)."""
    s = new_worker()
    calls: list = []
    stimuli: list = []

    def seen(changes: list, stimulus_id: str) -> None:
        s.validate()  # called after the event: the state machine is consistent
        calls.append(changes)
        stimuli.append(stimulus_id)

    s.watch_transitions(seen)
    step(s, compute("y", {"a": [P1]}, stimulus_id="compute-task-7"))
    assert calls.pop() == [("a", "released", "fetch"), ("y", "released", "waiting"),
                           ("a", "fetch", "flight")]
    step(s, ev.GatherDepSuccess(P1, {"a": 1}))
    assert calls.pop() == [("a", "flight", "memory"), ("y", "waiting", "ready"),
                           ("y", "ready", "executing")]
    step(s, success("y", 2))
    assert calls.pop() == [("y", "executing", "memory"), ("a", "memory", "released"),
                           ("a", "released", "forgotten")]
    step(s, ev.FreeKeys(["y"]))
    assert calls.pop() == [("y", "memory", "released"), ("y", "released", "forgotten")]
    # each change names the event that caused it: the one the message carried, or one
    # the state machine gives an event that came without (a result, a transfer)
    assert stimuli[0] == "compute-task-7"
    assert [x.rsplit("-", 1)[0] for x in stimuli[1:]] == [
        "gather-dep-success", "execute-success", "free-keys"]
    assert len(set(stimuli)) == 4
    s.watch_transitions(None)
    step(s, compute("z"))
    step(s, success("z"))
    assert calls == [] and s.transitions is None


# ---------------------------------------------------------------- legality
def test_an_illegal_transition_names_the_key_and_both_states():
    """A running task cannot be fetched: the state machine refuses the move (a bug in it,
    never the peer's fault) rather than corrupt its bookkeeping."""
    s = new_worker()
    step(s, compute("x"))
    with pytest.raises(InvalidTransition, match=r"tcp://me: 'x': executing -> flight"):
        s._set_state(s.tasks["x"], "flight")
    assert s.tasks["x"].state == "executing"


def test_every_state_a_story_reaches_is_in_the_table():
    """The transitions a worker makes in a story (dependency fetched, task run, seceded,
    rejoined, result released) are all in ``LEGAL_TRANSITIONS``."""
    seen: list = []
    s = new_worker()
    s.watch_transitions(lambda changes, stimulus: seen.extend(changes))
    step(s, compute("y", {"x": [P1]}))
    step(s, ev.GatherDepSuccess(P1, {"x": 1}))
    step(s, ev.Secede("y", compute_duration=0.1))
    step(s, ev.Rejoin("y"))
    step(s, success("y"))
    step(s, ev.FreeKeys(["y"]))
    assert {(a, b) for _, a, b in seen if b != "forgotten"} <= {
        (a, b) for b, starts in LEGAL_TRANSITIONS.items() for a in starts}
    assert [(a, b) for k, a, b in seen if k == "y"] == [
        ("released", "waiting"), ("waiting", "ready"), ("ready", "executing"),
        ("executing", "long-running"), ("long-running", "rejoining"),
        ("rejoining", "executing"), ("executing", "memory"), ("memory", "released"),
        ("released", "forgotten")]
