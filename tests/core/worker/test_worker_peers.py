"""A worker's peer transfers (:mod:`hpcsched.core.worker.peers`) over inproc comms, with a
stand-in for the worker: requests go out, replies and closed comms come back through the
inbox as the loop would see them, and become the state machine's events."""

from __future__ import annotations

import queue
import time
from types import SimpleNamespace
from typing import Any

import pytest

from hpcsched.core import config
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import CommClosedError, Inbox
from hpcsched.core.comm.loop import CLOSED
from hpcsched.core.state import events as ev
from hpcsched.core.worker.peers import PEER, PeerTransfers
from tests.conftest import wait_until


class FakeLoop(Inbox):
    """The worker's loop: what a peer's comm delivers is queued in ``items``; what the
    transfers put themselves (``(None, event)``) is recorded in ``events``."""

    def __init__(self, events: list) -> None:
        self.items: queue.Queue = queue.Queue()
        self.events = events

    def put(self, item: Any) -> None:
        if item[0] is None:
            self.events.append(item[1])
        else:
            self.items.put(item)


@pytest.fixture
def peers():
    events: list = []
    inbox = FakeLoop(events)
    worker = SimpleNamespace(
        address="inproc://me", security=None, spill_buffer=None, loop=inbox,
        telemetry=SimpleNamespace(transfer=lambda *a: None),
        state=SimpleNamespace(data={"mine": 7}), send_to_scheduler=events.append)
    accepted: queue.Queue = queue.Queue()
    listener = registry.listen("inproc://", accepted.put)
    p = PeerTransfers(worker)
    p.inbox, p.events, p.accepted, p.holder = inbox, events, accepted, listener.address
    yield p
    p.close()
    listener.stop()


def requested(p: PeerTransfers) -> tuple[Any, dict]:
    """The holder's end of the comm, and the get-data request that came over it."""
    comm = p.accepted.get(timeout=10)
    (msg,) = comm.recv(timeout=10)
    assert msg["op"] == "get-data"
    return comm, msg


def from_inbox(p: PeerTransfers) -> list:
    """What the loop would do with the next inbox item: the events it yields."""
    source, payload = p.inbox.items.get(timeout=10)
    assert source[0] == PEER
    return p.handle(source[1], payload)


def test_a_fetch_is_answered_through_the_inbox_and_reuses_the_comm(peers):
    peers.gather(peers.holder, ["x", "y"])  # not connected yet: a fetch thread connects
    comm, msg = requested(peers)
    assert msg["keys"] == ["x", "y"]
    comm.send([{"op": "data-reply", "request_id": msg["request_id"], "data": {"x": 1},
                "missing": ["y"]}])
    (done,) = from_inbox(peers)
    assert type(done) is ev.GatherDepSuccess
    assert (done.worker, done.data, done.missing) == (peers.holder, {"x": 1}, ["y"])
    assert peers.take_bandwidth() is None  # a few bytes measure latency, not bandwidth
    peers.gather(peers.holder, ["z"])  # connected: sent at once, on the same comm
    (msg2,) = comm.recv(timeout=10)
    assert msg2["keys"] == ["z"] and peers.accepted.empty()


def test_a_reply_nobody_waits_for_is_ignored(peers):
    peers.gather(peers.holder, ["x"])
    comm, msg = requested(peers)
    comm.send([{"op": "data-reply", "request_id": "someone-else", "data": {"x": 1}}])
    assert from_inbox(peers) == []


def test_the_holder_going_away_fails_its_fetches(peers):
    peers.gather(peers.holder, ["x"])
    comm, _ = requested(peers)
    comm.close()
    source, payload = peers.inbox.items.get(timeout=10)
    assert payload is CLOSED
    (failed,) = peers.handle(source[1], payload)
    assert type(failed) is ev.GatherDepFailure and failed.keys == ["x"]
    peers.gather(peers.holder, ["x"])  # the closed comm is forgotten: a new one is opened
    requested(peers)


def test_a_fetch_without_an_answer_expires(peers):
    peers.gather(peers.holder, ["x"])
    requested(peers)
    limit = config.get("comm.timeouts.connect") * 4
    now = time.monotonic()
    assert peers.expire(now, 0.0) == []
    (failed,) = peers.expire(now + limit + 1, 0.0)
    assert type(failed) is ev.GatherDepFailure and "no answer" in failed.error


def test_get_data_is_served_and_an_unexpected_op_drops_the_peer(peers):
    peers.gather(peers.holder, ["x"])
    comm, _ = requested(peers)
    comm.send([{"op": "get-data", "keys": ["mine", "gone"], "request_id": "r1"}])
    assert from_inbox(peers) == []
    (reply,) = comm.recv(timeout=10)
    assert reply == {"op": "data-reply", "request_id": "r1", "missing": ["gone"],
                     "data": {"mine": 7}}
    comm.send([{"op": "compute-task"}])
    from_inbox(peers)
    with pytest.raises(CommClosedError):
        comm.recv(timeout=10)


def test_a_cannot_connect_fails_the_fetch(peers):
    with config.set({"comm.timeouts.connect": 0.2}):
        peers.gather("inproc://nobody-listens", ["x"])
        wait_until(lambda: peers.events, what="the fetch to fail")
    (failed,) = peers.events
    assert type(failed) is ev.GatherDepFailure and failed.worker == "inproc://nobody-listens"
