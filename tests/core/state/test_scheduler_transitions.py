"""The transition log: every change of a task's state, with the event that caused it.

Each step gives its event a ``stimulus_id``; after it, every task whose state
changed (or that was forgotten) must have log entries of that step, carrying
that id, that lead from its old state to its new one. The stories cover the
paths a log easily misses: tasks erring (and their dependents with them),
a worker leaving with tasks processing and results in memory, stealing,
retirement and retries.
"""

from __future__ import annotations

from typing import Any

import pytest

from hpcsched.core.protocol import records
from hpcsched.core.protocol.messages import ControlReply
from hpcsched.core.state import events as ev
from hpcsched.core.state.events import InvalidTransition
from hpcsched.core.state.scheduler_state import SchedulerState
from tests.core.state.harness import graph

A, B = "tcp://a", "tcp://b"


class Story:
    def __init__(self, **kw: Any):
        kw.setdefault("work_stealing", False)
        self.s = SchedulerState(**kw)
        self.n = 0

    def states(self) -> dict:
        return {k: ts.state for k, ts in self.s.tasks.items()}

    def step(self, event: Any) -> list:
        self.n += 1
        sid = f"{type(event).__name__}-{self.n}"
        event = records.replace(event, stimulus_id=sid)  # events are frozen
        before = self.states()
        self.s.transition_listener = entries = []
        out = self.s.handle(event)
        self.s.validate()
        after = self.states()
        assert all(e[3] == sid for e in entries), entries
        for key in set(before) | set(after):
            old, new = before.get(key, "released"), after.get(key, "forgotten")
            chain = [(s, f) for k, s, f, _, _ in entries if k == key]
            if old == new and not chain:
                continue
            assert chain, (key, old, new, entries)
            assert chain[0][0] == old and chain[-1][1] == new, (key, old, new, chain)
            assert all(a[1] == b[0] for a, b in zip(chain, chain[1:], strict=False)), (key, chain)
        return out

    def finish(self, worker: str, key: str) -> None:
        self.step(ev.TaskStarted(worker, key))
        self.step(ev.TaskFinished(worker, key, nbytes=8, typename="int"))


def test_erred_tasks_and_their_dependents_are_logged():
    st = Story()
    st.step(ev.AddWorker(A, 1))
    st.step(ev.AddClient("c"))
    st.step(ev.UpdateGraph("c", graph(x=[], y=["x"], z=["y"]), ["z"]))
    st.finish(A, "x")
    st.step(ev.TaskErred(A, "y", exception="boom", exception_text="boom"))
    assert st.s.tasks["y"].state == st.s.tasks["z"].state == "erred"
    st.step(ev.RetryKeys("c", ["z"]))
    st.step(ev.ClientReleasesKeys("c", ["z"]))
    assert not st.s.tasks


def test_a_removed_worker_s_tasks_are_logged():
    st = Story(allowed_failures=1)
    for w in (A, B):
        st.step(ev.AddWorker(w, 1))
    st.step(ev.AddClient("c"))
    st.step(ev.UpdateGraph("c", graph(x=[], y=[], z=["x", "y"]), ["x", "z"]))
    on = {ts.key: ts.processing_on.address for ts in st.s.tasks.values()
          if ts.state == "processing"}
    st.finish(on["x"], "x")
    st.step(ev.TaskStarted(on["y"], "y"))
    # y was running there (erred: allowed_failures=1); x's only copy is lost (recomputed)
    st.step(ev.RemoveWorker(on["y"], "killed"))
    assert st.s.tasks["y"].state == "erred"
    log = list(st.s.transition_log)
    assert ("y", "processing", "released") in [e[:3] for e in log]
    assert ("y", "released", "erred") in [e[:3] for e in log]


def test_retirement_and_stealing_are_logged():
    st = Story()
    for w in (A, B):
        st.step(ev.AddWorker(w, 1))
    st.step(ev.AddClient("c"))
    st.step(ev.UpdateGraph("c", graph(**{f"t{i}": [] for i in range(4)}), [f"t{i}"
                                                                          for i in range(4)]))
    st.step(ev.RetireWorkers("r", "c", [A]))
    for ts in list(st.s.tasks.values()):
        if ts.state == "processing":
            st.finish(ts.processing_on.address, ts.key)


def test_the_table_refuses_a_transition_it_does_not_list():
    s = SchedulerState()
    s.handle(ev.AddClient("c"))
    s.handle(ev.UpdateGraph("c", graph(x=[]), ["x"]))
    with pytest.raises(InvalidTransition, match="no-worker -> forgotten"):
        s.transition(s.tasks["x"], "forgotten")


# ---------------------------------------------------------------- rebalance
def _held(st: Story, worker: str, keys: dict[str, int]) -> None:
    """``keys`` computed on ``worker`` (key -> nbytes)."""
    st.step(ev.UpdateGraph("c", graph(**{k: [] for k in keys}), list(keys), workers=[worker]))
    for k, nbytes in keys.items():
        st.step(ev.TaskStarted(worker, k))
        st.step(ev.TaskFinished(worker, k, nbytes=nbytes))


def test_rebalance_moves_keys_to_the_emptier_worker_and_drops_the_old_copy_last():
    st = Story()
    for w in (A, B):
        st.step(ev.AddWorker(w, 1))
    st.step(ev.AddClient("c"))
    _held(st, A, {"x": 100, "y": 100, "z": 100, "w": 100})
    out = st.step(ev.RebalanceKeys("r1", "c"))
    [order] = [m for m in out if m.match(op="acquire-replicas")]
    assert order.to == B and all(v == [A] for v in order.msg.who_has.values())
    moved = sorted(order.msg.who_has)
    assert len(moved) == 2  # 400 bytes on A, none on B: two keys even them out
    assert not [m for m in out if m.match(op="control-reply")], "not done before the copies"
    # the first copy arrives: A drops that key only
    out = st.step(ev.AddKeys(B, {moved[0]: 100}))
    assert [m.msg.keys for m in out if m.match(op="free-keys", to=A)] == [[moved[0]]]
    assert st.s.who_has([moved[0]]) == {moved[0]: [B]}
    assert not [m for m in out if m.match(op="control-reply")]
    out = st.step(ev.AddKeys(B, {moved[1]: 100}))
    assert [m.msg for m in out if m.match(op="control-reply")] == [
        ControlReply("r1", "OK", result=None)]
    assert st.s.workers[A].nbytes == st.s.workers[B].nbytes == 200


def test_rebalance_never_loses_a_key_whose_recipient_leaves():
    st = Story()
    for w in (A, B):
        st.step(ev.AddWorker(w, 1))
    st.step(ev.AddClient("c"))
    _held(st, A, {"x": 100, "y": 100})
    out = st.step(ev.RebalanceKeys("r1", "c", keys=["x", "y"]))
    assert [m.to for m in out if m.match(op="acquire-replicas")] == [B]
    out = st.step(ev.RemoveWorker(B, "gone"))
    assert [m.msg.request_id for m in out if m.match(op="control-reply")] == ["r1"]
    assert not [m for m in out if m.match(op="free-keys")]
    assert st.s.who_has(["x", "y"]) == {"x": [A], "y": [A]}


def test_rebalance_with_balanced_workers_or_one_worker_answers_at_once():
    st = Story()
    st.step(ev.AddWorker(A, 1))
    st.step(ev.AddClient("c"))
    _held(st, A, {"x": 100})
    out = st.step(ev.RebalanceKeys("r1", "c"))
    assert [m.to for m in out] == ["c"] and out[0].match(op="control-reply", request_id="r1")
    st.step(ev.AddWorker(B, 1))
    _held(st, B, {"y": 100})
    out = st.step(ev.RebalanceKeys("r2", "c"))
    assert [m.to for m in out] == ["c"]


def test_rebalance_keeps_a_copy_a_task_on_the_sender_still_needs():
    st = Story()
    for w in (A, B):
        st.step(ev.AddWorker(w, 1))
    st.step(ev.AddClient("c"))
    _held(st, A, {"x": 100, "y": 100})
    # t (on A) needs x: x stays on A; y may move
    st.step(ev.UpdateGraph("c", graph(t=["x"]), ["t"], workers=[A]))
    assert st.s.tasks["t"].processing_on.address == A
    out = st.step(ev.RebalanceKeys("r1", "c"))
    [order] = [m for m in out if m.match(op="acquire-replicas")]
    assert list(order.msg.who_has) == ["y"]


def test_a_rebalance_whose_copy_never_arrives_answers_after_the_timeout_keeping_the_data():
    st = Story(retire_timeout=10.0)
    for w in (A, B):
        st.step(ev.AddWorker(w, 1))
    st.step(ev.AddClient("c"))
    _held(st, A, {"x": 100, "y": 100})
    st.step(ev.RebalanceKeys("r1", "c", now=1.0))
    assert not [m for m in st.step(ev.Tick(now=5.0)) if m.match(op="control-reply")]
    out = st.step(ev.Tick(now=12.0))
    assert [m.to for m in out if m.match(op="control-reply", request_id="r1")] == ["c"]
    assert st.s.who_has(["x", "y"]) == {"x": [A], "y": [A]}
