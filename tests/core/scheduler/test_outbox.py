"""The scheduler's outgoing batches (:mod:`hpcsched.core.scheduler.outbox`): one per peer
and loop turn, free-keys held back until something else goes to that worker or the tick,
neighbouring free-keys merged, and replies to calls made in this process delivered to
their future. No process: the outbox is given the peers' comms."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from hpcsched.core.protocol.messages import ComputeTask, FreeKeys, RetireWorkersReply
from hpcsched.core.scheduler.outbox import INTERNAL, Outbox

pytestmark = pytest.mark.timeout(30)


def failed(peer: str) -> None:
    raise AssertionError(f"no send fails here ({peer})")


class _RecordingComm:
    def __init__(self) -> None:
        self.sent: list[list] = []
        self.messages: list[list] = []
        self.closed = False

    def send(self, msgs: list) -> None:
        self.sent.append([m["op"] for m in msgs])
        self.messages.append(msgs)

    def close(self) -> None:
        self.closed = True


def test_free_keys_wait_for_the_next_message_or_the_tick():
    """A batch of only free-keys (the state machine's records) is held back (it is not urgent and every message costs
    both ends a wake-up); it goes first in the next batch to that worker, or at the tick."""
    box = Outbox()
    comm = _RecordingComm()
    comms = {"w1": comm}
    box.queue("w1", FreeKeys(["a"]))
    box.flush(comms, failed)
    box.queue("w1", FreeKeys(["b"]))
    box.flush(comms, failed)
    assert comm.sent == []
    box.queue("w1", ComputeTask("c", None))
    box.flush(comms, failed)
    # in order, one message; the two frees side by side travel as one
    assert comm.sent == [["free-keys", "compute-task"]]
    assert comm.messages[0][0]["keys"] == ["a", "b"]
    box.queue("w1", FreeKeys(["c"]))
    box.flush(comms, failed)
    assert len(comm.sent) == 1
    box.release_held()  # the tick
    box.flush(comms, failed)
    assert comm.sent[-1] == ["free-keys"]
    box.flush(comms, failed)
    assert len(comm.sent) == 2  # nothing is sent twice


def test_free_keys_merge_only_with_their_neighbours():
    """Consecutive free-keys to one worker become one message; a compute-task between two
    frees keeps its place (freeing a key the worker is then told to compute, or the
    reverse, must reach it in that order), and the queued records are left as they were."""
    box = Outbox()
    comm = _RecordingComm()
    comms = {"w1": comm}
    queued = [FreeKeys(["a"]), FreeKeys(["b"]), ComputeTask("b", None), FreeKeys(["b"]),
              FreeKeys(["c"]), FreeKeys(["d"])]
    for record in queued:
        box.queue("w1", record)
    box.release_held()  # the tick
    box.flush(comms, failed)
    [msgs] = comm.messages
    assert [(m["op"], m.get("keys", m.get("key"))) for m in msgs] == [
        ("free-keys", ["a", "b"]), ("compute-task", "b"), ("free-keys", ["b", "c", "d"])]
    assert [r.keys for r in queued if isinstance(r, FreeKeys)] == [["a"], ["b"], ["b"], ["c"],
                                                                   ["d"]]


class _BrokenComm(_RecordingComm):
    def send(self, msgs: list) -> None:
        raise OSError("connection reset")


def test_a_failed_send_names_its_peer_and_the_others_are_served():
    box = Outbox()
    ok = _RecordingComm()
    lost: list[str] = []
    box.queue("w1", ComputeTask("a", None))
    box.queue("w2", ComputeTask("b", None))
    box.flush({"w1": _BrokenComm(), "w2": ok}, lost.append)
    assert lost == ["w1"]
    assert ok.sent == [["compute-task"]]


def test_before_tasks_goes_ahead_of_the_queued_tasks_and_first_before_all():
    box = Outbox()
    comm = _RecordingComm()
    box.queue("w1", FreeKeys(["x"]))
    box.queue("w1", ComputeTask("a", None))
    box.queue_before_tasks("w1", RetireWorkersReply("r", []))
    box.queue_first("w1", FreeKeys(["y"]))
    box.flush({"w1": comm}, failed)
    # the two frees, neighbours now, travel as one
    assert comm.sent == [["free-keys", "retire-workers-reply", "compute-task"]]
    assert comm.messages[0][0]["keys"] == ["y", "x"]


def test_a_reply_to_this_process_completes_its_future_and_goes_nowhere():
    box = Outbox()
    fut: Future = Future()
    box.expect("r1", fut)
    box.queue(INTERNAL, RetireWorkersReply("r1", ["tcp://w:1"]))
    assert fut.result(0).retired == ["tcp://w:1"]
    comm = _RecordingComm()
    box.flush({INTERNAL: comm}, failed)
    assert comm.sent == []
