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
from hpcsched.core.state import events as ev
from hpcsched.core.worker.parts.inbox import CommInbox, FromPeer, PeerGone
from hpcsched.core.worker.peers import FetchThreads, PeerTransfers
from tests.conftest import wait_until


class FakeLoop(Inbox):
    """The worker's loop: what a peer's comm delivers (``FromPeer``, ``PeerGone``) is queued
    in ``items``; the events the transfers put themselves are recorded in ``events``."""

    def __init__(self, events: list) -> None:
        self.items: queue.Queue = queue.Queue()
        self.events = events

    def put(self, item: Any) -> None:
        if type(item) in (FromPeer, PeerGone):
            self.items.put(item)
        else:
            self.events.append(item)


@pytest.fixture
def peers():
    events: list = []
    inbox = FakeLoop(events)
    worker = SimpleNamespace(
        address="inproc://me", security=None, loop=inbox, comms=CommInbox(inbox),
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
    item = p.inbox.items.get(timeout=10)
    assert type(item) is FromPeer
    return p.handle(item)


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
    gone = peers.inbox.items.get(timeout=10)
    assert type(gone) is PeerGone
    (failed,) = peers.handle(gone)
    assert type(failed) is ev.GatherDepFailure and failed.keys == ["x"]
    assert failed.stimulus_id.startswith("gather-dep-failure-")  # the worker's own event
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


def test_a_cannot_connect_fails_the_fetch():
    with config.set({"comm.timeouts.connect": 0.2}):
        events: list = []
        p = PeerTransfers(stand_in(events))
    try:
        p.gather("inproc://nobody-listens", ["x"])
        wait_until(lambda: events, what="the fetch to fail")
        (failed,) = events
        assert type(failed) is ev.GatherDepFailure and failed.worker == "inproc://nobody-listens"
    finally:
        p.close()


def stand_in(events: list) -> SimpleNamespace:
    """What PeerTransfers reads of its worker."""
    return SimpleNamespace(
        address="inproc://me", security=None, loop=(loop := FakeLoop(events)),
        comms=CommInbox(loop),
        telemetry=SimpleNamespace(transfer=lambda *a: None),
        state=SimpleNamespace(data={"mine": 7}), send_to_scheduler=events.append)


def answer(p: PeerTransfers, holder_end: Any) -> None:
    """The holder answers the get-data waiting on ``holder_end``; the loop handles it."""
    (req,) = holder_end.recv(timeout=10)
    holder_end.send([{"op": "data-reply", "request_id": req["request_id"], "data": {}}])
    events: list = []
    while not events:  # a comm closed meanwhile delivers its marker first: no event
        events = p.handle(p.worker.loop.items.get(timeout=10))
    assert [type(e) for e in events] == [ev.GatherDepSuccess]


@pytest.mark.timeout(60)
def test_comms_to_peers_are_kept_up_to_the_limit_least_recently_used_closed_first():
    """With ``worker.peer-connections=2``: a third holder's comm closes the one used least
    recently among those no fetch waits on; the kept ones are reused, not reopened."""
    accepted: queue.Queue = queue.Queue()
    holders = [registry.listen("inproc://", accepted.put) for _ in range(3)]
    a, b, c = (h.address for h in holders)
    events: list = []
    with config.set({"worker.peer-connections": 2}):
        p = PeerTransfers(stand_in(events))
    try:
        p.gather(a, ["k"])
        end_a = accepted.get(timeout=10)
        answer(p, end_a)  # nothing waits on a's comm any more
        p.gather(b, ["k"])
        end_b = accepted.get(timeout=10)  # b's fetch stays unanswered
        # accepted is not kept yet: the comm joins the kept ones once its connect returns
        wait_until(lambda: b in p._peers, what="b's comm kept")  # noqa: SLF001
        p.gather(c, ["k"])
        end_c = accepted.get(timeout=10)
        answer(p, end_c)
        assert list(p._peers) == [b, c]  # noqa: SLF001 - the kept comms, oldest first
        with pytest.raises(CommClosedError):
            end_a.recv(timeout=10)  # a's comm was closed
        p.gather(b, ["k2"])  # reused: no new comm reaches the holder
        answer(p, end_b)
        (late,) = end_b.recv(timeout=10)
        assert late["keys"] == ["k2"] and accepted.empty()
        # a fetch under way is never cut: with every kept comm waited on, the bound is
        # exceeded until one is free
        p.gather(c, ["k3"])
        end_c.recv(timeout=10)  # b's and c's comms are both waited on now ...
        p.gather(a, ["k3"])
        end_a2 = accepted.get(timeout=10)  # ... so a's new one closes neither
        end_a2.recv(timeout=10)
        assert list(p._peers) == [b, c, a]  # noqa: SLF001
    finally:
        p.close()
        for h in holders:
            h.stop()


@pytest.mark.timeout(60)
def test_the_workers_of_a_process_share_a_bounded_set_of_fetch_threads():
    """Two workers' fetches to new peers run on the process's fetch threads: at most
    ``transfer-incoming-count-limit`` per worker at once, reused from fetch to fetch, and
    gone once both workers closed."""
    fetchers = FetchThreads()
    accepted: queue.Queue = queue.Queue()
    holders = [registry.listen("inproc://", accepted.put) for _ in range(12)]
    with config.set({"worker.transfer-incoming-count-limit": 2}):
        workers = [PeerTransfers(stand_in([]), fetchers) for _ in range(2)]
    try:
        for h in holders:
            for w in workers:
                w.gather(h.address, ["k"])
        ends = [accepted.get(timeout=10) for _ in range(2 * len(holders))]
        assert 1 <= fetchers.threads <= 4
        for end in ends:
            end.recv(timeout=10)
    finally:
        for w in workers:
            w.close()
        for h in holders:
            h.stop()
    wait_until(lambda: fetchers.threads == 0, what="the fetch threads to end")


@pytest.mark.timeout(60)
def test_over_tcp_a_new_peer_is_reached_without_a_fetch_thread():
    """Over TCP the comm to a new peer is opened on the I/O thread, which sends the request
    once the handshake is done (with the cluster's secret): no fetch thread starts; the
    answer comes back through the inbox and the comm is reused for the next fetch."""
    from hpcsched.core.comm.base import Security

    security = Security(secret=b"s" * 32)
    fetchers = FetchThreads()
    accepted: queue.Queue = queue.Queue()
    holder = registry.listen("tcp://127.0.0.1:0", accepted.put, security)
    events: list = []
    worker = stand_in(events)
    worker.security = security
    p = PeerTransfers(worker, fetchers)
    try:
        p.gather(holder.address, ["x"])
        end = accepted.get(timeout=10)
        answer(p, end)
        p.gather(holder.address, ["y"])
        (again,) = end.recv(timeout=10)
        assert again["keys"] == ["y"] and accepted.empty()
        assert fetchers.threads == 0
    finally:
        p.close()
        holder.stop()


@pytest.mark.timeout(60)
def test_over_tcp_a_dead_peer_fails_the_fetch_and_a_wrong_secret_at_once():
    """A peer whose port is closed (it died): the fetch fails once the connect timeout is
    spent, as a ``GatherDepFailure`` the state machine asks another holder for. A peer that
    refuses our secret fails it at once (retrying cannot help)."""
    from hpcsched.core.comm.base import Security

    dead = registry.listen("tcp://127.0.0.1:0", lambda c: None)
    address = dead.address
    dead.stop()
    with config.set({"comm.timeouts.connect": 0.5}):
        events: list = []
        p = PeerTransfers(stand_in(events), FetchThreads())
    other = registry.listen("tcp://127.0.0.1:0", lambda c: c.close(), Security(secret=b"a" * 32))
    try:
        start = time.monotonic()
        p.worker.security = Security(secret=b"b" * 32)
        p.gather(other.address, ["y"])
        wait_until(lambda: events, what="the wrong secret to fail the fetch")
        (refused,) = events
        assert type(refused) is ev.GatherDepFailure and "secret" in refused.error
        assert time.monotonic() - start < 0.5
        p.gather(address, ["x"])
        wait_until(lambda: len(events) == 2, what="the dead peer's fetch to fail")
        failed = events[1]
        assert type(failed) is ev.GatherDepFailure and failed.worker == address
        assert failed.keys == ["x"] and "could not connect" in failed.error
        assert not p._peers  # noqa: SLF001
    finally:
        p.close()
        other.stop()
