"""The client's parts on their own: its futures table, its dispatch of scheduler messages,
and ``Client.request`` (the one way its extensions ask the scheduler something)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hpcsched.core.client.future_state import FutureTable
from hpcsched.core.client.futures import FutureState
from hpcsched.core.protocol.messages import SchedulerInfo, WhoHas, encode
from tests.conftest import wait_until


def inc(x: int) -> int:
    return x + 1


# ---------------------------------------------------------------- FutureTable, no process
def test_the_last_future_of_a_key_released_tells_the_scheduler_once():
    sent: list[dict] = []
    table = FutureTable(sent.append)
    st = table.acquire("x")
    assert table.acquire("x") is st and table.states == {"x": st}
    table.release("x")
    assert sent == [] and "x" in table.states  # one future of "x" is still held
    table.release("x")
    assert [encode(m) for m in sent] == [{"op": "client-releases-keys", "keys": ["x"]}]
    assert table.states == {}


def test_a_given_state_is_used_and_counted_but_not_stored():
    sent: list[dict] = []
    table = FutureTable(sent.append)
    mine = FutureState()
    assert table.acquire("y", mine) is mine
    assert "y" not in table.states
    table.release("y")  # names the key's state, which is not the given one: ignored
    assert sent == []
    table.release("y", mine)  # a future releases its own state
    assert [encode(m) for m in sent] == [{"op": "client-releases-keys", "keys": ["y"]}]


def test_a_closed_table_sends_no_releases():
    sent: list[dict] = []
    table = FutureTable(sent.append)
    table.acquire("x")
    table.close()
    table.release("x")
    assert sent == [] and table.states == {}


def test_known_keys_and_a_cancelled_one_submitted_again():
    table = FutureTable(lambda msg: None)
    assert not table.known("x")
    st = table.acquire("x")
    assert table.known("x")
    st.cancel()
    assert not table.known("x")  # to be submitted anew ...
    assert st.status == "pending" and not st.done()  # ... and waited for again


def test_wait_times_out_on_a_state_never_done():
    table = FutureTable(lambda msg: None)
    done, pending = FutureState(), FutureState()
    done.finish()
    table.wait([done], None, None)  # returns at once
    with pytest.raises(TimeoutError):
        table.wait([pending], time.monotonic() + 0.05, 0.05)


def test_wait_is_woken_once_all_its_states_are_done():
    """A gather sleeps until the batch that finishes its last future; batches that finish
    only some of them do not wake it."""
    table = FutureTable(lambda msg: None)
    states = [FutureState() for _ in range(3)]
    returned = threading.Event()
    woken: list[int] = []
    waiter = threading.Thread(target=lambda: (table.wait(states, None, None), returned.set()))
    waiter.start()
    try:
        wait_until(lambda: table._waits, timeout=5)
        [w] = table._waits
        real_set = w.event.set
        w.event.set = lambda: (woken.append(1), real_set())  # type: ignore[method-assign]
        for st in states[:2]:
            st.finish()
            table.notify()
        assert woken == [] and not returned.is_set()
        states[2].finish()
        table.notify()
        assert returned.wait(5) and woken == [1]
        table.notify()  # a later batch sets nothing again
        assert woken == [1] and table._waits == []
    finally:
        for st in states:
            st.finish()
        table.notify()
        waiter.join(5)


def test_state_changes_through_the_table():
    table = FutureTable(lambda msg: None)
    a, b, c = (table.acquire(k) for k in "abc")
    table.erred("a", b"blob", "tb", "ValueError: x")
    table.erred("gone", b"blob", "", "")  # a key no future holds: nothing to do
    assert a.status == "error" and (a.exception, a.traceback) == (b"blob", "tb")
    table.cancel([b])
    assert b.status == "cancelled" and b.done()
    c.finish()
    table.fail(b"lost", "lost the scheduler")  # only what is not done yet errs
    assert (a.exception, b.status, c.status) == (b"blob", "cancelled", "finished")
    d = table.acquire("d")
    table.fail(b"lost", "lost the scheduler")
    assert d.status == "error" and d.exception_text == "lost the scheduler"


# ---------------------------------------------------------------- against a scheduler
@pytest.fixture(scope="module")
def c(shared_client: Any) -> Iterator[Any]:
    yield shared_client


def _send_to_client(client_id: str, msgs: list, dask_scheduler: Any = None) -> None:
    for msg in msgs:
        dask_scheduler.send(client_id, msg)


def test_a_message_the_client_cannot_handle_is_logged_with_its_op_and_dropped(c, caplog):
    """Unknown ops and malformed messages take one path: logged (with the op), dropped; the
    client goes on receiving."""
    bad = [{"op": "no-such-op"}, {"op": "key-in-memory"}, {"op": "cancelled-keys", "keys": 3}]
    with caplog.at_level(logging.ERROR, logger="hpcsched.client"):
        c.run_on_scheduler(_send_to_client, c.id, bad)

        def logged() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if "dropped a message" in r.getMessage()]

        wait_until(lambda: len(logged()) >= 3, what="three dropped messages logged")
    found = logged()
    assert any("'no-such-op'" in m and "unknown op" in m for m in found)
    assert any("'key-in-memory'" in m and "MalformedMessage" in m and "'key'" in m
               for m in found)
    assert any("'cancelled-keys'" in m and "TypeError" in m for m in found)
    assert c.status == "running"
    assert c.submit(inc, 1, pure=False).result(timeout=30) == 2  # still receiving


def test_request_returns_the_schedulers_reply(c):
    asked = SchedulerInfo("")
    info = c.request(asked, timeout=30).info
    assert asked.request_id == ""  # the record sent is a copy with a fresh id
    assert set(info["workers"]) == set(c.scheduler_info()["workers"])
    assert len(info["workers"]) == 2
    reply = c.request(WhoHas("", keys=None), timeout=30)  # a record: a record back
    assert reply.op == "control-reply" and reply.request_id.startswith(c.id)
    assert isinstance(reply.result, dict)


def test_a_request_is_a_record_never_a_dict(c):
    with pytest.raises(TypeError, match="protocol record"):
        c.request({"op": "scheduler-info"}, timeout=30)


def test_every_record_the_scheduler_sends_a_client_has_a_handler():
    """The client's dispatch table and the protocol's scheduler -> client direction name the
    same records: a new one cannot reach the client's 'unknown op' path by omission."""
    from hpcsched.core.client.client import Client
    from hpcsched.core.protocol.messages import SCHEDULER_TO_CLIENT

    assert set(Client.handlers.table) == set(SCHEDULER_TO_CLIENT.values())
