"""The ``Comm`` contract of :mod:`hpcsched.core.comm.base`, checked the same on every transport.

A check is one conversation over one comm between its two ends: the *opener*,
which connected to a listener's address, and the *acceptor*, the comm that
listener handed to ``on_connect``. ``check(comm, end)`` runs on both ends and
branches on ``end.opener``; the ends talk only through the comm under test, so a
check runs unchanged in two threads of one process (``inproc://``, ``tcp://``,
``tls://``: :func:`run_in_threads`) and on two MPI ranks (``mpi://``:
``tests/hpc/scripts/comm_conformance.py``).

Rules for a check:

* Every wait has a timeout (:data:`WAIT`), so a failure on one end makes the other
  fail within seconds instead of hanging.
* An end never sleeps to let the other get somewhere: it waits for a message
  saying so. Where the contract holds either way (a recv that may or may not have
  blocked yet when the close comes), the docstring says so.
* Each end closes its comm before it returns (the runners close it again).

:data:`CHECKS` lists them; transport-specific behaviour (zero-copy receives, the
TCP handshake, MPI doorbells, inproc passing objects as they are) stays in the
transport's own tests.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from hpcsched.core.comm.base import Comm, CommClosedError, Inbox
from hpcsched.core.protocol import serialize

WAIT = 20.0  # seconds an end waits for its peer


@dataclass(frozen=True)
class End:
    """Which end of the comm a check runs on, and the listener's address the opener used."""

    opener: bool
    address: str


Check = Callable[[Comm, End], None]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


def by_name(name: str) -> Check:
    return next(c for c in CHECKS if c.__name__ == name)


def same(got: Any, sent: Any) -> bool:
    """``got`` is what was sent: arrays equal in dtype, shape and values; a memoryview's
    bytes (a backend that pickles delivers them as ``bytes``); containers item by item."""
    if isinstance(sent, np.ndarray):
        return (isinstance(got, np.ndarray) and got.dtype == sent.dtype
                and got.shape == sent.shape and bool(np.array_equal(got, sent)))
    if isinstance(sent, memoryview):
        return bytes(got) == sent.tobytes()
    if isinstance(sent, serialize.Serialized):
        return (isinstance(got, serialize.Serialized)
                and same(serialize.deserialize(got), serialize.deserialize(sent)))
    if isinstance(sent, (list, tuple)):
        return (type(got) is type(sent) and len(got) == len(sent)
                and all(same(g, s) for g, s in zip(got, sent, strict=True)))
    if isinstance(sent, dict):
        return (isinstance(got, dict) and got.keys() == sent.keys()
                and all(same(got[k], sent[k]) for k in sent))
    return bool(got == sent) and type(got) is type(sent)


# ---------------------------------------------------------------- what arrives
@check
def peer_addresses(comm: Comm, end: End) -> None:
    """The opener's ``peer_address`` is the address it connected to, the acceptor's
    ``local_address`` the address it listens at, and each end's ``peer_address`` is the
    other's ``local_address``."""
    assert comm.local_address and comm.peer_address, repr(comm)
    if end.opener:
        assert comm.peer_address == end.address, (comm.peer_address, end.address)
    else:
        assert comm.local_address == end.address, (comm.local_address, end.address)
    comm.send((comm.local_address, comm.peer_address))
    local, peer = comm.recv(timeout=WAIT)
    assert (local, peer) == (comm.peer_address, comm.local_address)


@check
def messages_arrive_in_order(comm: Comm, end: End) -> None:
    """``send`` delivers in order: 1000 messages of varied sizes, every 100th carrying a
    large out-of-band frame, so large frames and small messages keep their order too."""
    n = 1000
    if end.opener:
        for i in range(n):
            big = np.full(20_000, i, dtype=np.int64) if i % 100 == 0 else None
            comm.send({"op": "ping", "i": i, "payload": b"x" * (i % 50), "big": big})
        assert comm.recv(timeout=WAIT) == "done"
    else:
        got = [comm.recv(timeout=WAIT) for _ in range(n)]
        assert [m["i"] for m in got] == list(range(n))
        for m in got:
            assert m["payload"] == b"x" * (m["i"] % 50)
            if m["i"] % 100 == 0:
                assert m["big"].shape == (20_000,) and (m["big"] == m["i"]).all()
            else:
                assert m["big"] is None
        comm.send("done")
    comm.close()


def _samples() -> list:
    rng = np.random.default_rng(0)
    return [
        [{"op": "compute-task", "key": ("x", 1), "priority": (0, 1, -3)}],
        b"",
        b"\x00" * 100_000,  # a large in-band pickle stream
        bytearray(range(256)) * 1000,
        memoryview(bytes(range(256)) * 800),
        {"nested": [1.5, None, "s" * 10_000, ("t", 2)], 3: {"k": frozenset({1, 2})}},
        np.arange(1000, dtype=np.int16),  # small: in band
        np.arange(5000, dtype=np.float64),  # 40 kB out of band
        np.zeros((0, 3)),
        np.arange(100_000, dtype=np.int32)[::3],  # not contiguous
        np.asfortranarray(rng.random((300, 200))),
        {"op": "mixed", "arrays": [np.arange(n, dtype="u1") for n in (0, 10, 5000, 70_000, 300_000)],
         "blob": bytes(200_000)},
        serialize.serialize({"data": np.arange(50_000), "note": "frames kept out of band"}),
        rng.random(2**20),  # 8 MiB
    ]


@check
def frames_and_large_buffers_arrive_intact(comm: Comm, end: End) -> None:
    """Bytes, bytearrays, memoryviews, numpy arrays (in band, out of band, empty, strided,
    Fortran-ordered, 8 MiB), ``Serialized`` frames and nested messages arrive equal to
    what was sent: the acceptor sends each back and the opener compares."""
    for i, msg in enumerate(_samples()):
        if end.opener:
            comm.send(msg)
            back = comm.recv(timeout=WAIT)
            assert same(back, msg), f"sample {i} ({type(msg).__name__}) came back changed"
        else:
            comm.send(comm.recv(timeout=WAIT))
    comm.close()


@check
def a_batch_of_many_messages_arrives_whole(comm: Comm, end: End) -> None:
    """A server sends a list of op dicts as one message: 10,000 ops arrive as one list, in
    order; then 2,000 messages sent without waiting for any answer all arrive."""
    ops = [{"op": "task-finished", "key": f"x-{i}", "nbytes": i} for i in range(10_000)]
    if end.opener:
        comm.send(ops)
        for i in range(2000):
            comm.send(i)
        assert comm.recv(timeout=WAIT) == "all there"
    else:
        assert comm.recv(timeout=WAIT) == ops
        assert [comm.recv(timeout=WAIT) for _ in range(2000)] == list(range(2000))
        comm.send("all there")
    comm.close()


@check
def concurrent_senders_keep_messages_whole_and_ordered(comm: Comm, end: End) -> None:
    """``send`` is safe from several threads at once: 4 threads send 100 messages each,
    every 10th with a 160 kB array; each thread's messages arrive whole and in its order."""
    n_threads, n_msgs = 4, 100
    if end.opener:
        errors: list[BaseException] = []

        def sender(tid: int) -> None:
            try:
                for i in range(n_msgs):
                    big = np.full(20_000, tid * 1000 + i, dtype="f8") if i % 10 == 0 else None
                    comm.send((tid, i, big))
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=sender, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads), "a sender is stuck"
        assert comm.recv(timeout=WAIT) == "ok"
    else:
        last = dict.fromkeys(range(n_threads), -1)
        for _ in range(n_threads * n_msgs):
            tid, i, big = comm.recv(timeout=WAIT)
            assert i == last[tid] + 1, (tid, i, last[tid])  # per-sender order is kept
            last[tid] = i
            if i % 10 == 0:
                # a message's large frame never gets mixed up with another's
                assert big.shape == (20_000,) and (big == tid * 1000 + i).all()
            else:
                assert big is None
        assert all(v == n_msgs - 1 for v in last.values())
        comm.send("ok")
    comm.close()


# ---------------------------------------------------------------- waiting
@check
def recv_with_a_timeout_does_not_hang(comm: Comm, end: End) -> None:
    """``recv(timeout)`` raises TimeoutError when nothing comes in time (also a zero
    timeout), and the comm stays usable: with a timeout and blocking (no timeout)."""
    if end.opener:
        assert comm.recv(timeout=WAIT) == "timed out"
        comm.send("after the timeout")
        comm.send("blocking")
        assert comm.recv(timeout=WAIT) == "done"
    else:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            comm.recv(timeout=0.2)
        assert 0.15 < time.monotonic() - t0 < 5
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            comm.recv(timeout=0)
        assert time.monotonic() - t0 < 2
        comm.send("timed out")
        assert comm.recv(timeout=WAIT) == "after the timeout"
        assert comm.recv() == "blocking"  # back to blocking mode (the test has a timeout)
        comm.send("done")
    comm.close()


# ---------------------------------------------------------------- closing
def _closed_for_good(comm: Comm) -> None:
    """A closed comm: ``closed``, sends and receives raise CommClosedError, and keep
    raising; ``close()`` again does nothing."""
    assert comm.closed
    with pytest.raises(CommClosedError):
        comm.send("after close")
    for _ in range(2):  # stays closed
        with pytest.raises(CommClosedError):
            comm.recv(timeout=1)
    comm.close()  # idempotent
    assert comm.closed


def _messages_before_close_arrive(opener_closes: bool) -> Check:
    def run(comm: Comm, end: End) -> None:
        if end.opener == opener_closes:
            for i in range(3):
                comm.send(i)
            comm.send(np.arange(100_000))  # a large frame just before the close
            comm.close()
            _closed_for_good(comm)
        else:
            # everything sent before the close arrives, then recv says the peer closed
            assert [comm.recv(timeout=WAIT) for _ in range(3)] == [0, 1, 2]
            assert (comm.recv(timeout=WAIT) == np.arange(100_000)).all()
            with pytest.raises(CommClosedError, match="peer closed"):
                comm.recv(timeout=WAIT)
            _closed_for_good(comm)

    side = "opener" if opener_closes else "acceptor"
    run.__name__ = f"messages_sent_before_close_by_the_{side}_arrive"
    run.__doc__ = (f"The {side} sends, then closes: the peer receives everything sent before, "
                   "then CommClosedError ('peer closed'); both ends are closed for good: "
                   "sends and receives raise, close() is idempotent.")
    return run


def _peer_close_wakes_a_blocked_recv(opener_closes: bool) -> Check:
    def run(comm: Comm, end: End) -> None:
        if end.opener == opener_closes:
            assert comm.recv(timeout=WAIT) == "waiting"
            comm.close()
        else:
            # the peer closes once told; whether recv is already blocked then or not, it
            # must raise CommClosedError, well before its timeout
            comm.send("waiting")
            t0 = time.monotonic()
            with pytest.raises(CommClosedError):
                comm.recv(timeout=WAIT)
            assert time.monotonic() - t0 < WAIT / 2
            _closed_for_good(comm)

    side = "opener" if opener_closes else "acceptor"
    run.__name__ = f"close_by_the_{side}_wakes_the_peers_blocked_recv"
    run.__doc__ = f"A recv blocked on one end raises CommClosedError when the {side} closes."
    return run


def _local_close_wakes_a_blocked_recv(opener_closes: bool) -> Check:
    def run(comm: Comm, end: End) -> None:
        if end.opener == opener_closes:
            outcome: queue.SimpleQueue = queue.SimpleQueue()
            reading = threading.Event()

            def reader() -> None:
                reading.set()
                try:
                    outcome.put(comm.recv(timeout=WAIT))
                except BaseException as e:
                    outcome.put(e)

            t = threading.Thread(target=reader)
            t.start()
            assert reading.wait(WAIT)
            # the reader may or may not be blocked in recv yet: it must raise either way, at once
            t0 = time.monotonic()
            comm.close()
            t.join(WAIT)
            assert not t.is_alive(), "close() left a recv blocked"
            assert time.monotonic() - t0 < 2, "close() woke the blocked recv only late"
            assert isinstance(outcome.get(timeout=1), CommClosedError)
            _closed_for_good(comm)
        else:
            with pytest.raises(CommClosedError):  # the close reached the peer too
                comm.recv(timeout=WAIT)
            _closed_for_good(comm)

    side = "opener" if opener_closes else "acceptor"
    run.__name__ = f"close_by_the_{side}_wakes_its_own_blocked_recv"
    run.__doc__ = (f"The {side}'s close() wakes a recv blocked in another of its threads "
                   "with CommClosedError, and the peer sees the close.")
    return run


for _opener_closes in (True, False):
    check(_messages_before_close_arrive(_opener_closes))
    check(_peer_close_wakes_a_blocked_recv(_opener_closes))
    check(_local_close_wakes_a_blocked_recv(_opener_closes))


# ---------------------------------------------------------------- delivery to an inbox
class Collected(Inbox):
    """An inbox that only queues, as a server's loop does for a handler bound to its thread."""

    def __init__(self) -> None:
        self.items: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, item: Any) -> None:
        self.items.put(item)


CLOSED_MARKER = "<closed>"


@check
def deliver_to_hands_over_in_order_then_the_closed_marker(comm: Comm, end: End) -> None:
    """``deliver_to(inbox, source, marker)``: the messages that arrived before go first, then
    the later ones, in order, each as ``(source, message)``, then ``(source, marker)`` once
    the peer closes, and nothing after it. The comm is then closed: sends fail."""
    if end.opener:
        for i in range(10):
            comm.send(i)
        assert comm.recv(timeout=WAIT) == "delivering"
        for i in range(10, 20):
            comm.send(np.full(50_000, i) if i == 15 else i)
        comm.close()
    else:
        assert comm.recv(timeout=WAIT) == 0  # the rest are on their way or waiting
        inbox = Collected()
        comm.deliver_to(inbox, "src", CLOSED_MARKER)
        comm.send("delivering")
        got = []
        while True:
            source, msg = inbox.items.get(timeout=WAIT)
            assert source == "src"
            if isinstance(msg, str) and msg == CLOSED_MARKER:
                break
            got.append(msg)
        assert [int(m[0]) if isinstance(m, np.ndarray) else m for m in got] == list(range(1, 20))
        assert (got[14] == 15).all() and got[14].shape == (50_000,)
        assert inbox.items.empty(), "something was delivered after the closed marker"
        assert comm.closed, "the closed marker was delivered, but the comm says it is open"
        with pytest.raises(CommClosedError):
            comm.send("to a closed peer")
        comm.close()


# ---------------------------------------------------------------- running both ends
def run_in_threads(fn: Check, opener: Comm, acceptor: Comm, address: str) -> None:
    """Run ``fn`` on both ends of one comm, the acceptor in a thread of its own; raise the
    first failure, naming the end, once both ends are done (each within its waits)."""
    errors: dict[str, BaseException] = {}

    def play(comm: Comm, end: End) -> None:
        try:
            fn(comm, end)
        except BaseException as e:  # reported below, naming the end
            errors["opener" if end.opener else "acceptor"] = e
        finally:
            comm.close()

    t = threading.Thread(target=play, args=(acceptor, End(False, address)),
                         name=f"conformance-acceptor {fn.__name__}")
    t.start()
    play(opener, End(True, address))
    t.join(WAIT * 3)
    assert not t.is_alive(), f"{fn.__name__}: the acceptor did not finish"
    for side in ("opener", "acceptor"):
        if side in errors:
            raise AssertionError(f"{fn.__name__} failed on the {side}'s end: "
                                 f"{type(errors[side]).__name__}: {errors[side]}") from errors[side]
