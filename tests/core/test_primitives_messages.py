"""The scheduler's primitives check every request before it changes anything: a malformed
one raises MalformedMessage (its peer is dropped), and the others' state is untouched.

Requests reach the primitives as the scheduler hands them over: decoded (``primitive``'s
common fields checked by the protocol), then the kind's own fields checked here."""

from __future__ import annotations

from typing import Any

import pytest

from hpcsched.core.protocol.messages import CLIENT_TO_SCHEDULER, ControlReply, decode
from hpcsched.core.scheduler.primitives import MAX_NAME, MAX_VALUE, Primitives
from hpcsched.core.state import events as ev


class FakeScheduler:
    def __init__(self) -> None:
        self.sent: list = []
        self.events: list = []

        class State:
            tasks: dict = {"k": object()}

        self.state = State()

    def send(self, to: str, msg: Any) -> None:
        self.sent.append((to, msg))

    def handle_event(self, event: Any, op: str = "") -> None:
        self.events.append(event)


def handle(p: Primitives, peer: str, request: dict) -> None:
    """What the scheduler does with a peer's request: decode it, hand it over."""
    p.handle(peer, decode(CLIENT_TO_SCHEDULER, request))


def msg(**fields):
    return {"op": "primitive", "request_id": "r", "name": "n", **fields}


BAD = [
    msg(kind="lock", action="acquire", lease="l", request_id=5),
    msg(kind="nope", action="acquire"),
    msg(kind="lock", action="explode"),
    msg(kind="lock", action="acquire", lease="l", name=7),
    msg(kind="lock", action="acquire", lease="l", name="x" * (MAX_NAME + 1)),
    msg(kind="lock", action="acquire", lease=None),
    msg(kind="lock", action="acquire", lease="l", timeout=-1),
    msg(kind="lock", action="acquire", lease="l", timeout="1s"),
    msg(kind="lock", action="acquire", lease="l", timeout=float("nan")),
    msg(kind="semaphore", action="acquire", lease="l", max_leases=0),
    msg(kind="semaphore", action="acquire", lease="l", max_leases=True),
    msg(kind="variable", action="set", blob="text"),
    msg(kind="variable", action="set", blob=b"x", keys="k"),
    msg(kind="variable", action="set", blob=b"x", keys=[["unhashable"]]),
    msg(kind="queue", action="put", maxsize=-1, blob=b"x"),
    msg(kind="queue", action="get", maxsize=0, batch="all"),
    msg(kind="multilock", action="acquire", names="ab"),
    msg(kind="multilock", action="acquire", names=[]),
    msg(kind="multilock", action="acquire", names=["a"], num_locks=2),
    msg(kind="dataset", action="publish", blob=None),
]


@pytest.mark.parametrize("bad", BAD)
def test_malformed_requests_are_refused_before_any_change(bad):
    s = FakeScheduler()
    p = Primitives(s)
    handle(p, "good", msg(kind="lock", action="acquire", lease="held"))
    handle(p, "good", msg(kind="variable", action="set", blob=b"v", keys=[]))
    before = repr((p.semaphores, p.variables, p.queues, p.multilocks, p.datasets))
    with pytest.raises(ev.MalformedMessage):
        handle(p, "bad", bad)
    assert repr((p.semaphores, p.variables, p.queues, p.multilocks, p.datasets)) \
        == before
    assert all(to == "good" for to, _ in s.sent)


def test_a_value_too_large_is_refused():
    p = Primitives(FakeScheduler())
    big = msg(kind="queue", action="put", maxsize=0, blob=b"")
    big["blob"] = bytes(MAX_VALUE + 1)
    with pytest.raises(ev.MalformedMessage):
        handle(p, "bad", big)
    assert not p.queues.get("n", {}).get("items")


def test_leases_and_waits_of_a_peer_that_left_end():
    s = FakeScheduler()
    p = Primitives(s)
    handle(p, "a", msg(kind="lock", action="acquire", lease="la"))
    handle(p, "b", msg(kind="lock", action="acquire", lease="lb", request_id="rb"))
    handle(p, "c", msg(kind="event", action="wait", request_id="rc"))
    p.peer_left("a")  # b gets the lock
    assert ("b", ControlReply("rb", "OK", result=True)) in s.sent
    p.peer_left("c")
    assert p.events["n"]["waiters"] == []
