"""What a running cluster really sends is what the protocol's records say: every message of
an in-process cluster (scheduler, two workers, a client, over ``inproc://``) decodes, field
types checked, as the record of its op."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from hpcsched.core.comm.inproc import InprocComm
from hpcsched.core.protocol import messages as protocol
from hpcsched.core.protocol.wire import Direction, MalformedMessage, decode

CONTEXT = {"worker": "inproc://w", "client": "c", "now": 1.0, "stimulus_id": ""}


def checked(d: Direction) -> Direction:
    copy = Direction(d.sender, d.receiver, checked=True)
    copy.update(d)
    return copy


DIRECTIONS = [checked(d) for d in protocol.DIRECTIONS]


def problems_of(msg: Any) -> list[str]:
    """[] if ``msg`` is the well-formed record of its op in some direction, else why not."""
    if not isinstance(msg, dict):
        return []  # transport markers, not messages
    why = []
    for d in DIRECTIONS:
        cls = d.get(msg.get("op"))
        if cls is None:
            continue
        context = {f.name: CONTEXT[f.name] for f in protocol.spec(cls).context}
        try:
            decode(d, msg, **context)
            return []
        except MalformedMessage as e:
            why.append(f"{d.name}: {e}")
    return why or [f"no record for op {msg.get('op')!r}"]


class Plugin:
    def setup(self, worker: Any) -> None:
        pass


def inc(x: int) -> int:
    return x + 1


def boom() -> None:
    raise ValueError("boom")


@pytest.fixture
def traffic(monkeypatch):
    sent: list = []
    lock = threading.Lock()
    original = InprocComm.send

    def recording_send(self: InprocComm, msg: Any) -> None:
        with lock:
            sent.extend(msg if isinstance(msg, list) else [msg])
        original(self, msg)

    monkeypatch.setattr(InprocComm, "send", recording_send)
    return sent


def test_every_message_a_cluster_sends_is_its_record(traffic, tmp_path):
    from hpcsched import Client, Lock, Queue, Variable
    from hpcsched.launchers.local_cluster import LocalCluster

    module = tmp_path / "protocol_traffic_module.py"
    module.write_text("VALUE = 1\n")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, timeout=60,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        futures = client.map(inc, range(8))
        total = client.submit(sum, futures)
        assert total.result(timeout=60) == sum(range(1, 9))
        [data] = client.scatter([41], broadcast=True)
        assert client.submit(inc, data).result(timeout=60) == 42
        bad = client.submit(boom)
        with pytest.raises(ValueError):
            bad.result(timeout=60)
        client.retry([bad])
        assert client.run(lambda: 1) and client.run_on_scheduler(lambda: 2) == 2
        assert client.who_has(futures) and client.has_what() and client.nthreads()
        client.replicate(futures[:2], n=2)
        client.upload_file(str(module))
        client.register_worker_plugin(Plugin(), name="p")
        client.publish_dataset(x=futures[0])
        assert client.get_dataset("x").result(timeout=60) == 1
        with Lock("l", client=client):
            pass
        v = Variable("v", client=client)
        v.set(3)
        assert v.get(timeout=10) == 3
        q = Queue("q", client=client)
        q.put(1)
        assert q.get(timeout=10) == 1
        client.cancel(futures[-1])
        client.get_task_stream()
        del futures, total, data
        client.retire_workers(n=1)
    ops = {m.get("op") for m in traffic if isinstance(m, dict)}
    assert {"update-graph", "compute-task", "task-finished", "get-data", "data-reply",
            "scatter", "update-data", "task-erred", "run", "run-reply", "lock-acquire",
            "variable-set", "variable-get", "queue-put", "queue-get", "dataset-publish",
            "control-reply", "extension", "retire-workers"} <= ops, ops
    wrong = {}
    for m in traffic:
        why = problems_of(m)
        if why:
            wrong.setdefault(m.get("op"), why)
    assert not wrong, wrong


def test_the_traffic_check_refuses_what_no_record_allows():
    assert problems_of({"op": "task-finished", "key": "x", "nbytes": 8}) == []
    assert problems_of({"op": "task-finished", "key": "x", "nbytes": "big"})
    assert problems_of({"op": "compute-task", "key": "x", "run_spec": None, "extra": 1})
    assert problems_of({"op": "no-such-op"}) == ["no record for op 'no-such-op'"]
