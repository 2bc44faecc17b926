"""The scheduler's primitives check every request before it changes anything: a malformed
one raises MalformedMessage (its peer is dropped), and the others' state is untouched.

Requests reach the primitives as the scheduler hands them over: decoded (every field
checked by its record, :mod:`hpcsched.core.protocol.primitives`), then what depends on
the primitives' state checked here."""

from __future__ import annotations

from typing import Any

import pytest

from hpcsched.core.protocol import primitives as pp
from hpcsched.core.protocol.messages import CLIENT_TO_SCHEDULER, ControlReply, decode
from hpcsched.core.protocol.primitives import MAX_NAME, MAX_VALUE
from hpcsched.core.scheduler.primitives import Primitives
from hpcsched.core.state import events as ev


class FakeScheduler:
    def __init__(self) -> None:
        self.sent: list = []
        self.events: list = []

        class State:
            tasks: dict = {"k": object()}

            def knows(self, key: Any) -> bool:  # a task, or an element of a bulk map
                return key in self.tasks

        self.state = State()

    def send(self, to: str, msg: Any) -> None:
        self.sent.append((to, msg))

    def handle_event(self, event: Any, op: str = "") -> None:
        self.events.append(event)


def handle(p: Primitives, peer: str, request: dict) -> None:
    """What the scheduler does with a peer's request: decode it, hand it over."""
    p.handle(peer, decode(CLIENT_TO_SCHEDULER, request))


def msg(op: str, **fields):
    return {"op": op, "request_id": "r", "name": "n", **fields}


BAD = [
    msg("lock-acquire", lease="l", request_id=5),
    msg("lock-explode"),
    msg("lock-acquire", lease="l", name=7),
    msg("lock-acquire", lease="l", name="x" * (MAX_NAME + 1)),
    msg("lock-acquire", lease=None),
    msg("lock-acquire", lease="held"),  # held already (by the good peer)
    msg("lock-acquire", lease="l", timeout=-1),
    msg("lock-acquire", lease="l", timeout="1s"),
    msg("lock-acquire", lease="l", timeout=float("nan")),
    msg("lock-acquire", lease="l", max_leases=2),  # a semaphore's field
    msg("semaphore-acquire", lease="l", max_leases=0),
    msg("semaphore-acquire", lease="l", max_leases=True),
    msg("variable-set", blob="text"),
    msg("variable-set", blob=b"x", keys="k"),
    msg("variable-set", blob=b"x", keys=[["unhashable"]]),
    msg("queue-put", maxsize=-1, blob=b"x"),
    msg("queue-get", maxsize=0, batch="all"),
    msg("queue-get", maxsize=0, batch=0),
    msg("multilock-acquire", names="ab"),
    msg("multilock-acquire", names=[]),
    msg("multilock-acquire", names=["a"], num_locks=2),
    msg("dataset-publish", blob=None),
    {"op": "dataset-list", "request_id": "r", "name": "n"},
]


@pytest.mark.parametrize("bad", BAD)
def test_malformed_requests_are_refused_before_any_change(bad):
    s = FakeScheduler()
    p = Primitives(s)
    handle(p, "good", msg("lock-acquire", lease="held"))
    handle(p, "good", msg("variable-set", blob=b"v", keys=[]))
    before = repr((p.semaphores, p.variables, p.queues, p.multilocks, p.datasets))
    with pytest.raises(ev.MalformedMessage):
        handle(p, "bad", bad)
    assert repr((p.semaphores, p.variables, p.queues, p.multilocks, p.datasets)) \
        == before
    assert all(to == "good" for to, _ in s.sent)


def test_a_value_too_large_is_refused():
    p = Primitives(FakeScheduler())
    big = msg("queue-put", maxsize=0, blob=b"")
    big["blob"] = bytes(MAX_VALUE + 1)
    with pytest.raises(ev.MalformedMessage):
        handle(p, "bad", big)
    assert not p.queues.get("n", {}).get("items")


def test_leases_and_waits_of_a_peer_that_left_end():
    s = FakeScheduler()
    p = Primitives(s)
    handle(p, "a", msg("lock-acquire", lease="la"))
    handle(p, "b", msg("lock-acquire", lease="lb", request_id="rb"))
    handle(p, "c", msg("event-wait", request_id="rc"))
    p.peer_left("a")  # b gets the lock
    assert ("b", ControlReply("rb", "OK", result=True)) in s.sent
    p.peer_left("c")
    assert p.events["n"]["waiters"] == []


def test_every_primitive_request_has_one_handler():
    requests = {cls for cls in CLIENT_TO_SCHEDULER.values()
                if cls.__module__ == pp.__name__}
    assert len(requests) == 22
    assert set(Primitives.handlers.table) == requests
