"""The scheduler on the protocol's records: its state machine emits records, the server
encodes them once when it sends, its internal events are frozen, and the remove_worker hooks
of scheduler plugins name the event that removed the worker."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from hpcsched.core.comm import registry
from hpcsched.core.protocol import messages as protocol
from hpcsched.core.protocol import records
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.protocol.serialize import dumps_function
from hpcsched.core.scheduler.server import Scheduler
from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState


def inc(x: int) -> int:
    return x + 1


def test_the_state_machine_emits_records():
    s = SchedulerState()
    s.handle(ev.AddWorker("tcp://a:1", 1))
    s.handle(ev.AddClient("c"))
    out = s.handle(ev.UpdateGraph("c", {"x": {"run_spec": "r", "deps": []}}, ["x"]))
    assert [type(c.msg) for c in out] == [protocol.ComputeTask]
    out = s.handle(ev.TaskFinished("tcp://a:1", "x", nbytes=8, typename="int"))
    assert [type(c.msg) for c in out] == [protocol.KeyInMemory]
    assert out[0].wire() == {"op": "key-in-memory", "key": "x", "type": "int"}


@pytest.mark.parametrize("event", [
    ev.AddWorker("tcp://a:1", 1), ev.RemoveWorker("tcp://a:1"), ev.AddClient("c"),
    ev.RemoveClient("c"), ev.RetireWorkers("r", "c", []), ev.RebalanceKeys("r", "c"),
    ev.Tick(now=1.0), ev.PauseWorker(True), ev.Secede("x"), ev.Rejoin("x"), ev.ServeFailed("x"),
    ev.GatherDepFailure("tcp://a:1", ["x"]), ev.ExecuteFailure("x", None)])
def test_internal_events_are_frozen(event: Any):
    with pytest.raises(AttributeError):
        event.stimulus_id = "changed"  # type: ignore[misc]
    assert records.replace(event, stimulus_id="s").stimulus_id == "s"


class RemovalLog:
    """A scheduler plugin recording the stimulus id its remove_worker hook is given."""

    def __init__(self) -> None:
        self.removed: list[tuple[str, str]] = []
        self.changed = threading.Event()

    def remove_worker(self, scheduler: Any = None, worker: str = "",
                      stimulus_id: str = "") -> None:
        self.removed.append((worker, stimulus_id))
        self.changed.set()


def test_remove_worker_hooks_get_the_stimulus_id_of_the_removal():
    s = Scheduler("inproc://").start()
    comms: list = []
    log = RemovalLog()

    def join(first: dict) -> Any:
        c = registry.connect(s.address, 10)
        comms.append(c)
        c.send([first])
        reply = c.recv(timeout=10)
        assert reply[0]["op"] == "registered"
        return c

    try:
        s.call(lambda sch: sch.control.scheduler_plugins.__setitem__("log", log))
        lost = join({"op": "register-worker", "address": "inproc://lost", "nthreads": 1})
        join({"op": "register-worker", "address": "inproc://retired", "nthreads": 1})
        client = join({"op": "register-client", "client": "c"})
        client.send([{"op": "update-graph", "keys": ["x"], "tasks": {
            "x": {"run_spec": RunSpec(dumps_function(inc), None), "deps": []}}}])
        lost.close()  # its connection closes: a remove-worker event of the server's
        assert log.changed.wait(10)
        assert log.removed[0][0] == "inproc://lost"
        assert log.removed[0][1].startswith("remove-worker-")
        log.changed.clear()
        # retired by the state machine (a retire-workers event), then its comm closes
        assert s.retire_workers(["inproc://retired"], timeout=10) == ["inproc://retired"]
        assert log.changed.wait(10)
        assert log.removed[1][0] == "inproc://retired"
        assert log.removed[1][1].startswith("retire-workers-"), log.removed
    finally:
        for c in comms:
            c.close()
        s.close()
