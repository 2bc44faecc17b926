"""A simulated cluster for stories of the state machines: one ``SchedulerState``, N
``WorkerState``s, a router that carries every message both ways through the wire (encoded
and decoded with the receiver's context, as the servers do) and a fake clock. No process,
thread or socket.

A worker runs nothing: the tasks it was told to execute stay running until the story
says how they end (:meth:`SimCluster.finish`, :meth:`SimCluster.fail`). Everything else
happens by itself: :meth:`SimCluster.settle` delivers messages until none is left,
dependencies travel from peer to peer, and ``validate()`` of the scheduler runs after
every event it handles. What a worker's server would do beyond its state machine (bulk
maps' ranges, heartbeats) is kept in :attr:`SimCluster.unrouted` for the story to read.

    sim = SimCluster(seed=1)
    sim.add_worker("a", 1)
    sim.submit({"x": []}, ["x"])
    sim.settle()
    assert sim.running("a") == ["x"]
    sim.finish("x")
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hpcsched.core.protocol import records
from hpcsched.core.protocol.messages import (
    SCHEDULER_TO_CLIENT,
    SCHEDULER_TO_WORKER,
    WORKER_TO_SCHEDULER,
    WORKER_TO_WORKER,
    encode,
)
from hpcsched.core.protocol.wire import receive
from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState
from hpcsched.core.state.worker_state import WorkerState

CLIENT = "client"


def address(name: str) -> str:
    return f"sim://{name}"


@dataclass
class SimCluster:
    """The scheduler, its workers (by name), what each client heard, and the clock."""

    seed: int = 0
    scheduler_kw: dict = field(default_factory=dict)
    now: float = 1.0

    def __post_init__(self) -> None:
        self.s = SchedulerState(seed=self.seed, **self.scheduler_kw)
        self.workers: dict[str, WorkerState] = {}
        self.executing: dict[str, list] = {}  # worker name -> keys it runs, in order started
        self.heard: dict[str, list] = {CLIENT: []}  # client -> records it was sent
        self.unrouted: list[tuple[str, Any]] = []  # (to, record) no state machine handles
        self._queue: list[tuple[str, str, dict]] = []  # (from, to, wire message)
        self._ids = 0
        self._worker_events = WorkerState.handlers.table
        self._scheduler_events = SchedulerState.event_types()
        self.rng = random.Random(self.seed)
        self.scheduler(ev.AddClient(CLIENT))

    # ------------------------------------------------------------ the clock and ids
    def tick(self, seconds: float) -> None:
        self.now += seconds

    def stimulus(self, op: str) -> str:
        self._ids += 1
        return f"{op}-{self._ids}"

    # ------------------------------------------------------------ driving the machines
    def scheduler(self, event: Any) -> None:
        """The scheduler handles ``event`` (its ``now`` and stimulus id set here if unset);
        what it sends is queued for delivery."""
        if getattr(event, "now", 1) == 0.0 or not getattr(event, "stimulus_id", "x"):
            kw = {}
            if getattr(event, "now", 1) == 0.0:
                kw["now"] = self.now
            if not getattr(event, "stimulus_id", "x"):
                kw["stimulus_id"] = self.stimulus(type(event).__name__.lower())
            event = _replace(event, **kw)
        out = self.s.handle(event)
        self.s.validate()
        for send in out:
            self._queue.append(("scheduler", send.to, send.wire()))

    def worker(self, name: str, event: Any) -> None:
        """Worker ``name`` handles ``event``; its commands are carried out."""
        ws = self.workers[name]
        for cmd in ws.handle(event):
            self._command(name, cmd)

    def _command(self, name: str, cmd: Any) -> None:
        if isinstance(cmd, ev.Send):
            to = cmd.to if cmd.to != "scheduler" else "scheduler"
            self._queue.append((address(name), to, cmd.wire()))
        elif isinstance(cmd, ev.Execute):
            self.executing[name].append(cmd.key)
        elif isinstance(cmd, ev.GatherDep):
            self._queue.append((address(name), cmd.worker,
                                {"op": "_gather", "keys": list(cmd.keys)}))
        else:
            self.unrouted.append((address(name), cmd))

    def settle(self, limit: int = 100_000) -> int:
        """Deliver messages until none is left (in the order sent); returns how many."""
        n = 0
        while True:
            if not self._queue:
                if not self.s.fill_pending:
                    return n
                self.scheduler(ev.FillQueue())  # what a server does in its next loop turn
                continue
            n += 1
            assert n <= limit, "messages kept coming: a loop between the machines"
            sender, to, msg = self._queue.pop(0)
            self._deliver(sender, to, msg)

    def _deliver(self, sender: str, to: str, msg: dict) -> None:
        if to == "scheduler":
            record = receive(WORKER_TO_SCHEDULER, msg, self.stimulus, worker=sender,
                             now=self.now)
            if type(record) in self._scheduler_events:
                self.scheduler(record)
            else:
                self.unrouted.append((to, record))
            return
        if to in self.heard:
            self.heard[to].append(receive(SCHEDULER_TO_CLIENT, msg, self.stimulus))
            return
        name = to.removeprefix("sim://")
        if name not in self.workers:
            return  # it left: the message is lost
        if msg.get("op") == "_gather":  # a peer asks for data: answered from its store
            peer = self.workers[name]
            data = {k: peer.data[k] for k in msg["keys"] if k in peer.data}
            missing = [k for k in msg["keys"] if k not in peer.data]
            self.worker(sender.removeprefix("sim://"), ev.GatherDepSuccess(
                to, data, missing, now=self.now, stimulus_id=self.stimulus("gather")))
            return
        direction = SCHEDULER_TO_WORKER if sender == "scheduler" else WORKER_TO_WORKER
        record = receive(direction, msg, self.stimulus, now=self.now)
        if type(record) in self._worker_events:
            self.worker(name, record)
        else:
            self.unrouted.append((to, record))

    # ------------------------------------------------------------ the story's verbs
    def add_worker(self, name: str, nthreads: int = 1, host: str = "", **kw: Any) -> str:
        """Worker ``name`` joins (on ``host``, default its own)."""
        a = address(name)
        self.workers[name] = WorkerState(a, nthreads)
        self.executing[name] = []
        self.scheduler(ev.AddWorker(a, nthreads, host=host or name, **kw))
        return a

    def remove_worker(self, name: str, reason: str = "died") -> None:
        """Worker ``name`` is gone (its process died, or its node was lost)."""
        del self.workers[name]
        del self.executing[name]
        self.scheduler(ev.RemoveWorker(address(name), reason=reason))

    def submit(self, deps: dict[str, list[str]], keys: list[str], **kw: Any) -> None:
        """The client submits tasks ``{key: [dependency keys]}`` and wants ``keys``."""
        tasks = {k: {"run_spec": ("run", k), "deps": list(d)} for k, d in deps.items()}
        self.scheduler(ev.UpdateGraph(CLIENT, tasks=tasks, keys=list(keys), **kw))

    def release(self, keys: list[str]) -> None:
        self.scheduler(ev.ClientReleasesKeys(CLIENT, list(keys)))

    def cancel(self, keys: list[str]) -> None:
        self.scheduler(ev.CancelKeys(CLIENT, list(keys)))

    def finish(self, key: str, name: str | None = None, value: Any = None,
               nbytes: int = 8, seconds: float = 0.1) -> None:
        """The task ``key`` running on worker ``name`` (the one running it, if None)
        returns ``value``; the messages that follow are delivered."""
        name = name or self.where(key)
        self.executing[name].remove(key)
        self.tick(seconds)
        self.worker(name, ev.ExecuteSuccess(key, value if value is not None else key, nbytes,
                                            "str", self.now - seconds, self.now,
                                            now=self.now, stimulus_id=self.stimulus("run")))
        self.settle()

    def started(self, key: str) -> None:
        """The worker running ``key`` says it started it (as a server does for a task not
        known to be short), and the scheduler hears it."""
        self._queue.append((address(self.where(key)), "scheduler",
                            {"op": "task-started", "key": key}))
        self.settle()

    def fail(self, key: str, exception: BaseException, name: str | None = None) -> None:
        name = name or self.where(key)
        self.executing[name].remove(key)
        self.worker(name, ev.ExecuteFailure(key, exception, "", str(exception),
                                            now=self.now, stimulus_id=self.stimulus("run")))
        self.settle()

    # ------------------------------------------------------------ what the story reads
    def where(self, key: str) -> str:
        """The name of the worker running ``key`` (exactly one must; of a gang's members,
        which all run it, the first: the one whose result is the task's)."""
        names = [n for n, keys in self.executing.items() if key in keys]
        ts = self.s.tasks.get(key)
        if len(names) > 1 and ts is not None and ts.processing_on is not None:
            names = [n for n in names if address(n) == ts.processing_on.address]
        assert len(names) == 1, (key, names)
        return names[0]

    def running(self, name: str) -> list:
        return list(self.executing[name])

    def state(self, key: str) -> str:
        ts = self.s.tasks.get(key)
        return "forgotten" if ts is None else ts.state

    def told(self, op: str, client: str = CLIENT) -> list:
        """The records of ``op`` the client heard, in order."""
        return [r for r in self.heard[client] if encode(r)["op"] == op]

    def replay(self) -> list:
        """The scheduler's transitions so far, as ``(key, start, finish)`` (a seeded story
        told again must make the same ones)."""
        return [(key, start, finish) for key, start, finish, *_ in self.s.transition_log]


def _replace(event: Any, **kw: Any) -> Any:
    return records.replace(event, **kw)
