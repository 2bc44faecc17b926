"""The coordination primitives' state as a journal keeps it, and a restarted scheduler
takes it up; a request resent after a reconnect (its answer lost with the connection)
does not harm. (With real processes: tests/launchers/test_restart.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hpcsched.core.protocol import primitives as pp
from hpcsched.core.scheduler.primitives import Primitives
from hpcsched.core.state import events as ev


class Scheduler:
    """What the primitives use of a scheduler: the tasks it knows, sends, events."""

    def __init__(self, tasks: Any = ()):
        known = dict.fromkeys(tasks)
        self.state = SimpleNamespace(tasks=known, knows=known.__contains__)
        self.sent: list = []
        self.events: list = []

    def send(self, to: str, msg: Any) -> None:
        self.sent.append((to, msg))

    def handle_event(self, event: Any, op: str) -> None:
        self.events.append(event)

    def answer(self) -> Any:
        return self.sent.pop()[1]


@pytest.mark.timeout(10)
def test_what_outlives_a_client_is_taken_up_by_a_restarted_scheduler():
    before = Primitives(Scheduler(tasks=["inc-1"]))
    before.handle("c1", pp.VariableSet("r1", "v", b"value", ["inc-1"]))
    before.handle("c1", pp.QueuePut("r2", "q", 0, b"item-1"))
    before.handle("c1", pp.QueuePut("r3", "q", 0, b"item-2"))
    before.handle("c1", pp.EventSet("r4", "e"))
    before.handle("c1", pp.LockAcquire("r5", "l", "lease-1"))
    before.handle("c2", pp.SemaphoreAcquire("r6", "s", "lease-2", 3))
    before.handle("c2", pp.LockAcquire("r7", "l", "lease-3", 30))  # waits: not kept
    before.handle("c2", pp.MultiLockAcquire("r8", "m1", ["a", "b"]))
    assert before.changed
    state, keys = before.durable()
    assert keys == ["inc-1"]  # the journal keeps the future in the variable live
    assert state["leases"]["lock"] == {"l": {"max": 1, "leases": {"lease-1": "c1"}}}

    scheduler = Scheduler(tasks=["inc-1"])
    after = Primitives(scheduler)
    assert after.restore(state) == {"c1", "c2"}  # the holders get the grace to come back
    assert not after.changed
    # the future in the variable is held again, under a client of the variable's own
    assert [type(e) for e in scheduler.events] == [ev.ClientDesiresKeys]
    after.handle("c3", pp.VariableGet("g1", "v"))
    assert scheduler.answer().blob == b"value"
    after.handle("c3", pp.QueueGet("g2", "q", 0))
    assert scheduler.answer().blob == b"item-1"
    after.handle("c3", pp.EventIsSet("g3", "e"))
    assert scheduler.answer().result is True
    after.handle("c3", pp.LockAcquire("g4", "l", "lease-4", 0))
    assert scheduler.answer().result is False  # c1 holds it
    after.handle("c3", pp.SemaphoreValue("g5", "s"))
    assert scheduler.answer().result == 1
    after.handle("c3", pp.MultiLockAcquire("g6", "m2", ["b"], timeout=0))
    assert scheduler.answer().result is False  # c2's multi-lock holds b
    after.peer_left("c1")  # did not come back: its lease goes
    after.handle("c3", pp.LockAcquire("g7", "l", "lease-4", 0))
    assert scheduler.answer().result is True


@pytest.mark.timeout(10)
def test_an_acquire_resent_by_the_holder_is_answered_again():
    scheduler = Scheduler()
    prims = Primitives(scheduler)
    prims.handle("c1", pp.LockAcquire("r1", "l", "lease-1"))
    assert scheduler.answer().result is True
    prims.handle("c1", pp.LockAcquire("r1", "l", "lease-1"))  # the answer was lost
    assert scheduler.answer().result is True
    with pytest.raises(ev.MalformedMessage, match="already held"):
        prims.handle("c2", pp.LockAcquire("r2", "l", "lease-1"))  # not its lease
    prims.handle("c1", pp.MultiLockAcquire("r3", "m", ["a"]))
    assert scheduler.answer().result is True
    prims.handle("c1", pp.MultiLockAcquire("r3", "m", ["a"]))
    assert scheduler.answer().result is True
    with pytest.raises(ev.MalformedMessage, match="already in use"):
        prims.handle("c2", pp.MultiLockAcquire("r4", "m", ["a"]))
