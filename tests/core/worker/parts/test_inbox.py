"""The items of a worker's inbox (hpcsched.core.worker.parts.inbox): what a comm delivers
becomes a typed record on a real loop, handed over the way the transport hands it (the
loop may run it on the sender's thread when idle), its end a record of its own; the
worker's own events are named."""

from __future__ import annotations

import threading
from functools import partial

import pytest

from hpcsched.core.comm import inproc
from hpcsched.core.comm.loop import Loop
from hpcsched.core.worker.parts.inbox import (
    SCHEDULER_GONE,
    CommInbox,
    FromPeer,
    FromScheduler,
    PeerGone,
    stimulus,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("any_thread", [False, True])
def test_a_comms_messages_and_its_end_reach_the_loop_as_records(any_thread):
    got: list = []
    threads: set[int] = set()

    def process(items: list) -> None:
        threads.add(threading.get_ident())
        got.extend(items)

    loop = Loop("test-inbox", process, lambda: None, any_thread=any_thread, raise_gc=False)
    loop.start()
    a, b = inproc.pipe()
    try:
        inbox = CommInbox(loop)
        assert inbox.any_thread is any_thread  # the transport sees the loop's choice
        inbox.take_from(b, partial(FromPeer, b), PeerGone(b))
        a.send({"op": "one"})
        a.send({"op": "two"})
        a.close()
        wait_until(lambda: len(got) == 3, timeout=30, what="both messages and the end")
        assert got == [FromPeer(b, {"op": "one"}), FromPeer(b, {"op": "two"}), PeerGone(b)]
        if not any_thread:  # put, never offered: the loop's own thread handles them all
            assert threading.get_ident() not in threads
    finally:
        a.close()
        b.close()
        loop.stop()


def test_the_records_are_frozen():
    item = PeerGone(comm=None)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        item.comm = 1  # type: ignore[misc]


def test_each_stimulus_of_the_worker_is_named_and_unique():
    ids = [stimulus("execute-success") for _ in range(1000)]
    assert all(i.startswith("execute-success-") for i in ids)
    assert len(set(ids)) == len(ids)


def test_one_inbox_takes_every_comm_each_message_named_by_its_own():
    """The scheduler's comm and a peer's deliver to the worker's one inbox (so a transport
    that gathers a round's messages per inbox hands them all over at once); each message
    becomes the record of the comm it came on."""
    got: list = []
    loop = Loop("test-inbox", got.extend, lambda: None, raise_gc=False)
    loop.start()
    s_end, s = inproc.pipe()
    p_end, p = inproc.pipe()
    try:
        inbox = CommInbox(loop)
        inbox.take_from(s, FromScheduler, SCHEDULER_GONE)
        inbox.take_from(p, partial(FromPeer, p), PeerGone(p))
        s_end.send([{"op": "free-keys"}])
        p_end.send({"op": "get-data"})
        p_end.close()
        s_end.close()
        wait_until(lambda: len(got) == 4, timeout=30, what="two messages and two ends")
        assert sorted(map(repr, got)) == sorted(
            map(
                repr,
                [
                    FromScheduler([{"op": "free-keys"}]),
                    FromPeer(p, {"op": "get-data"}),
                    PeerGone(p),
                    SCHEDULER_GONE,
                ],
            )
        )
        assert got.index(PeerGone(p)) > got.index(FromPeer(p, {"op": "get-data"}))
    finally:
        for c in (s_end, s, p_end, p):
            c.close()
        loop.stop()
