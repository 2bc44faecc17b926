"""inproc:// comm: what only it does (objects passed as they are, pipes, listen/connect,
delivery to an inbox by put or offer, a closed comm's references).

What every transport promises (order, intact frames, close, timeouts, deliver_to) is
checked for inproc too by the conformance suite: tests/core/comm/test_comm_conformance.py.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
import weakref

import pytest

from hpcsched.core.comm import inproc, registry
from hpcsched.core.comm.base import Inbox

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def cleanup():
    items: list = []
    try:
        yield items
    finally:
        for x in items:
            if isinstance(x, threading.Thread):
                x.join(timeout=5)
            elif hasattr(x, "stop"):
                x.stop()
            else:
                x.close()


def test_pipe_passes_objects_as_they_are():
    a, b = inproc.pipe()
    payload = {"op": "compute", "data": [1, 2, 3], "lock": threading.Lock()}  # no pickling
    a.send(payload)
    got = b.recv(timeout=1)
    assert got is payload
    b.send("back")
    assert a.recv(timeout=1) == "back"
    assert (a.local_address, a.peer_address) == ("inproc://a", "inproc://b")
    assert (b.local_address, b.peer_address) == ("inproc://b", "inproc://a")
    a.close()
    b.close()


def test_a_zero_timeout_still_delivers_a_message_already_there():
    a, b = inproc.pipe()  # a send is in the peer's queue when it returns: no wait needed
    a.send(1)
    assert b.recv(timeout=0) == 1  # already there: a zero timeout still delivers it
    a.close()


def test_listen_connect_and_stop(cleanup):
    accepted: queue.Queue = queue.Queue()
    lst = registry.listen("inproc://", accepted.put)
    cleanup.append(lst)
    assert lst.address.startswith("inproc://")
    client = registry.connect(lst.address, 1)
    cleanup.append(client)
    server_side = accepted.get(timeout=2)
    cleanup.append(server_side)
    client.send({"op": "hello"})
    assert server_side.recv(timeout=1) == {"op": "hello"}
    server_side.send("welcome")
    assert client.recv(timeout=1) == "welcome"
    assert client.peer_address == lst.address and server_side.local_address == lst.address
    lst.stop()
    client.send("after stop")  # accepted comms outlive their listener
    assert server_side.recv(timeout=1) == "after stop"
    with pytest.raises(ConnectionRefusedError, match=lst.address):
        registry.connect(lst.address, 0.05)


def test_address_in_use(cleanup):
    address = inproc.new_address("dup")
    cleanup.append(registry.listen(address, lambda c: None))
    with pytest.raises(OSError, match="already in use"):
        registry.listen(address, lambda c: None)


def test_connect_waits_for_a_listener_that_appears_later(cleanup):
    address = inproc.new_address("late")
    accepted: queue.Queue = queue.Queue()

    def late() -> None:
        time.sleep(0.2)
        cleanup.append(registry.listen(address, accepted.put))

    t = threading.Thread(target=late)
    t.start()
    cleanup.append(t)
    t0 = time.monotonic()
    client = registry.connect(address, 5)
    cleanup.append(client)
    assert 0.1 < time.monotonic() - t0 < 3
    client.send(42)
    assert accepted.get(timeout=2).recv(timeout=1) == 42


def test_connect_to_nobody_times_out_naming_the_address():
    address = inproc.new_address("nobody")
    t0 = time.monotonic()
    with pytest.raises(ConnectionRefusedError, match=address):
        registry.connect(address, 0.1)
    assert time.monotonic() - t0 < 2


def test_unknown_scheme_and_bad_address():
    with pytest.raises(ValueError, match="unknown transport scheme 'carrier-pigeon'"):
        registry.connect("carrier-pigeon://x", 0.1)
    with pytest.raises(ValueError, match="not an hpcsched address"):
        registry.connect("localhost:8786", 0.1)


class _Recording(Inbox):
    """An inbox noting which thread each item arrived in, and how (put or offer)."""

    def __init__(self, any_thread: bool):
        self.any_thread = any_thread
        self.got: list = []

    def put(self, item):
        self.got.append(("put", threading.get_ident(), item))

    def offer(self, item):
        self.got.append(("offer", threading.get_ident(), item))


@pytest.mark.parametrize("any_thread", [False, True])
def test_delivery_offers_only_to_an_inbox_that_may_run_in_any_thread(any_thread):
    """``deliver_to`` queues (``put``) unless the inbox says its handler may run in the
    sender's thread (``Inbox.any_thread``): then ``offer``, for what was waiting before
    the redirection as for what follows, in order, and for the closed marker."""
    a, b = inproc.pipe()
    a.send("early")
    inbox = _Recording(any_thread)
    b.deliver_to(inbox, "src", "CLOSED")
    sender = []

    def send_later():
        sender.append(threading.get_ident())
        a.send("late")
        a.close()

    t = threading.Thread(target=send_later)
    t.start()
    t.join(5)
    how = "offer" if any_thread else "put"
    me = threading.get_ident()
    assert inbox.got == [(how, me, ("src", "early")), (how, sender[0], ("src", "late")),
                         (how, sender[0], ("src", "CLOSED"))]


@pytest.mark.parametrize("closed_by", ["peer", "us", "peer-before-deliver_to"])
def test_a_closed_comm_goes_with_its_last_user_not_with_the_collector(closed_by):
    """A worker receives a peer comm's messages with the comm named where it
    delivers) and closes peer comms all the time: once the closed marker is handed over, the
    comm is freed with its last user, not kept by a reference cycle through its own source
    until the cyclic collector's next full pass (rare in a server: admin.gc-threshold)."""
    a, b = inproc.pipe()
    inbox = _Recording(any_thread=False)
    if closed_by == "peer-before-deliver_to":
        a.close()
        b.deliver_to(inbox, ("peer", b), "CLOSED")
    else:
        b.deliver_to(inbox, ("peer", b), "CLOSED")
        a.send("hello")
        (a if closed_by == "peer" else b).close()
    assert [item[1] for _, _, item in inbox.got][-1] == "CLOSED"
    freed = weakref.ref(b)
    gc.disable()
    try:
        inbox.got.clear()
        del b
        assert freed() is None
    finally:
        gc.enable()
