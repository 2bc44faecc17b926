"""One peer's bad messages cost that peer its connection, and nobody else anything.

A real LocalCluster (worker processes over authenticated TCP) serves a
legitimate client while an authenticated but hostile (or buggy) peer sends
malformed messages over its own TCP connection. Each message is checked and
handled on its own: the offender gets one error message and is disconnected,
the other peers' messages in the same batch are handled, and the scheduler's
state stays valid.
"""

from __future__ import annotations

import threading
from operator import add
from typing import Any

import pytest

from hpcsched.core.comm import CommClosedError, registry
from hpcsched.core.protocol.run_spec import RunSpec

pytestmark = pytest.mark.timeout(120)


def inc(x: int) -> int:
    return x + 1


def tree_graph(leaves: int) -> tuple[dict, Any]:
    """``leaves`` inc tasks summed pairwise: 2 * leaves - 1 tasks."""
    dsk: dict = {("leaf", i): (inc, i) for i in range(leaves)}
    level = [("leaf", i) for i in range(leaves)]
    depth = 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            k = ("add", depth, i)
            dsk[k] = (add, level[i], level[i + 1])
            nxt.append(k)
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
        depth += 1
    return dsk, level[0]


class RawClient:
    """An authenticated peer speaking the client protocol by hand."""

    def __init__(self, cluster: Any, name: str):
        self.comm = registry.connect(cluster.scheduler_address, 10, cluster.security)
        self.comm.send([{"op": "register-client", "client": name}])
        first = self.comm.recv(timeout=10)
        assert first[0]["op"] == "registered"

    def send(self, *msgs: dict) -> None:
        self.comm.send(list(msgs))

    def until_closed(self, timeout: float = 20) -> list[dict]:
        """Every message received until the scheduler hangs up."""
        got: list[dict] = []
        try:
            while True:
                got += self.comm.recv(timeout=timeout)
        except CommClosedError:
            return got

    def close(self) -> None:
        self.comm.close()


def errors(msgs: list[dict]) -> list[str]:
    return [m["message"] for m in msgs if m.get("op") == "error"]


def scheduler_state_is_valid(cluster: Any) -> None:
    cluster.scheduler.call(lambda s: s.state.validate())


def test_bad_messages_do_not_stop_another_clients_tree_reduction(cluster, client):
    """A peer that keeps sending an unhashable key (reconnecting whenever it is dropped)
    cannot make the scheduler lose the workers' messages of another client's graph."""
    dsk, root = tree_graph(1000)  # 1,999 tasks
    stop = threading.Event()
    refusals: list[str] = []

    def attack() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            peer = RawClient(cluster, f"attacker-{n}")
            sent = False
            try:
                while not stop.is_set():
                    peer.send({"op": "client-desires-keys", "keys": [[1]]})
                    sent = True
                    stop.wait(0.05)  # 20 a second, until the scheduler hangs up
            except CommClosedError:
                pass
            if sent:  # (stopped before its first message: nothing to hang up on)
                refusals.extend(errors(peer.until_closed()))
            peer.close()

    t = threading.Thread(target=attack, name="attacker")
    t.start()
    try:
        assert client.get(dsk, root, timeout=90) == sum(range(1, 1001))
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive()
    assert refusals, "the attacker was never told why it was dropped"
    assert all("'keys'" in r and "not a key" in r for r in refusals)
    scheduler_state_is_valid(cluster)


MALFORMED = [
    ({"op": [1]}, "op must be a string"),
    ({"op": "update-graph"}, "lacks the field 'tasks'"),
    ({"op": "update-graph", "tasks": {}, "keys": 5}, "expected a list of keys"),
    ({"op": "update-graph", "tasks": {"x": {"run_spec": None, "deps": [{}]}}, "keys": ["x"]},
     "not a key"),
    ({"op": "update-graph", "tasks": {}, "keys": [], "priority": "high"}, "finite number"),
    ({"op": "gather", "keys": ["x"]}, "lacks the field 'request_id'"),
    ({"op": "gather", "request_id": "r", "keys": "x"}, "expected a list of keys"),
    ({"op": "cancel-keys"}, "lacks the field 'keys'"),
    ({"op": "client-releases-keys", "keys": [{"a": 1}]}, "not a key"),
    ({"op": "scatter", "scatter_id": "s", "data": {"x": 1}}, "serialized data"),
    ({"op": "retire-workers", "request_id": "r", "n": -3}, "integer >= 0"),
    ({"op": "scheduler-info"}, "lacks the field 'request_id'"),
    ({"op": "task-finished", "key": "x"}, "not a client's op"),
    ({"op": "update-graph", "tasks": {}, "keys": [], "bogus": 1}, "unknown fields"),
    ("not a dict", "expected an op dict"),
    ({"op": "no-such-op"}, "not a client's op"),
]


@pytest.mark.parametrize("msg, complaint", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_client_message_drops_that_client_only(shared_cluster, shared_client, msg,
                                                         complaint):
    bad = RawClient(shared_cluster, "bad-client")
    good = RawClient(shared_cluster, "good-client")
    try:
        # in one batch if the scheduler is quick: a good message before and after the bad one
        bad.send({"op": "scheduler-info", "request_id": "before"}, msg,
                 {"op": "scheduler-info", "request_id": "after"})
        good.send({"op": "scheduler-info", "request_id": "good"})
        got = bad.until_closed()
        assert [m.get("request_id") for m in got if m["op"] == "scheduler-info-reply"] == \
            ["before"]
        assert len(errors(got)) == 1 and complaint in errors(got)[0]
        reply = good.comm.recv(timeout=10)
        assert reply[0]["request_id"] == "good"
        assert shared_client.submit(inc, 41).result(timeout=30) == 42  # still serving
        scheduler_state_is_valid(shared_cluster)
    finally:
        bad.close()
        good.close()


def test_a_handler_failure_is_isolated_like_a_malformed_message(shared_cluster, shared_client,
                                                                monkeypatch):
    """Not only malformed messages: any exception a handler raises drops that peer only."""
    from hpcsched.core.protocol.messages import SchedulerInfo

    def broken(source: str, msg: Any) -> None:
        raise KeyError("a handler bug")

    # the scheduler's bound table of handlers (made at its construction)
    monkeypatch.setitem(shared_cluster.scheduler._table, SchedulerInfo, broken)
    bad = RawClient(shared_cluster, "unlucky-client")
    try:
        bad.send({"op": "scheduler-info", "request_id": "r"})
        got = bad.until_closed()
        assert len(errors(got)) == 1 and "KeyError" in errors(got)[0]
    finally:
        bad.close()
        monkeypatch.undo()
    assert shared_client.submit(inc, 1).result(timeout=30) == 2


def test_malformed_worker_registration_is_refused(shared_cluster):
    comm = registry.connect(shared_cluster.scheduler_address, 10, shared_cluster.security)
    try:
        comm.send([{"op": "register-worker", "address": "tcp://127.0.0.1:1", "nthreads": -4}])
        reply = comm.recv(timeout=10)
        assert reply[0]["op"] == "register-error"
        assert "nthreads" in reply[0]["message"] and "> 0" in reply[0]["message"]
        with pytest.raises(CommClosedError):
            comm.recv(timeout=10)
    finally:
        comm.close()
    assert "tcp://127.0.0.1:1" not in shared_cluster.scheduler.workers_info()


def test_a_batch_keeps_other_peers_messages_after_a_bad_one():
    """Deterministic: one batch holds a bad client message and then a worker's
    task-finished; the worker's message is handled (its client hears the result)."""
    from hpcsched.core.protocol.serialize import dumps_function
    from hpcsched.core.scheduler.server import Scheduler

    s = Scheduler("inproc://").start()
    comms: list = []

    def join(first: dict) -> Any:
        c = registry.connect(s.address, 10)
        comms.append(c)
        c.send([first])
        assert c.recv(timeout=10)[0]["op"] == "registered"
        return c

    try:
        worker = join({"op": "register-worker", "address": "inproc://fake-worker",
                       "nthreads": 1})
        good = join({"op": "register-client", "client": "good"})
        bad = join({"op": "register-client", "client": "bad"})
        good.send([{"op": "update-graph", "tasks": {"x": {"run_spec": RunSpec(dumps_function(inc),
                                                                            None),
                                                          "deps": []}},
                    "keys": ["x"]}])
        assert any(m["op"] == "compute-task" for m in worker.recv(timeout=10))
        s.call(lambda sch: sch._process([
            ("bad", [{"op": "client-desires-keys", "keys": [[1]]}]),
            ("inproc://fake-worker", [{"op": "task-finished", "key": "x", "nbytes": 8}]),
        ]))
        assert [m["key"] for m in good.recv(timeout=10) if m["op"] == "key-in-memory"] == ["x"]
        got = []
        with pytest.raises(CommClosedError):
            while True:
                got += bad.recv(timeout=10)
        assert len(errors(got)) == 1
        s.call(lambda sch: sch.state.validate())
    finally:
        for c in comms:
            c.close()
        s.close()


def test_every_op_the_scheduler_handles_has_its_checks():
    """A new op must say what its fields are: the scheduler's table of handlers is exactly
    the ops the protocol's inbound directions define (with every field's check)."""
    from hpcsched.core.protocol import messages as protocol
    from hpcsched.core.scheduler.server import Scheduler

    inbound = set(protocol.WORKER_TO_SCHEDULER.values()) | \
        set(protocol.CLIENT_TO_SCHEDULER.values())
    assert set(Scheduler.handlers.table) == \
        inbound - {protocol.RegisterWorker, protocol.RegisterClient}


def test_workers_may_be_named_by_address_name_or_rank():
    # dask-mpi names workers by rank: submit(..., workers=2) must not cost the client its
    # connection; a list where a worker goes is still refused
    from hpcsched.core.protocol.messages import CLIENT_TO_SCHEDULER, decode
    from hpcsched.core.state import events as ev

    msg = {"op": "update-graph", "tasks": {}, "keys": [], "workers": ["tcp://a:1", "w-1", 2]}
    assert decode(CLIENT_TO_SCHEDULER, msg, client="c").workers == ["tcp://a:1", "w-1", 2]
    with pytest.raises(ev.MalformedMessage, match="workers"):
        decode(CLIENT_TO_SCHEDULER, {**msg, "workers": [["tcp://a:1"]]}, client="c")
    with pytest.raises(ev.MalformedMessage, match="workers"):
        decode(CLIENT_TO_SCHEDULER, {**msg, "workers": [True]}, client="c")
