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
from hpcsched.core.worker.parts.inbox import FromPeer, PeerGone, Tagged, stimulus
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
        inbox = Tagged(loop, partial(FromPeer, b), PeerGone(b))
        assert inbox.any_thread is any_thread  # the transport sees the loop's choice
        inbox.take_from(b)
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
