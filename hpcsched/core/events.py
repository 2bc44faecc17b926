"""Events (stimuli in) and commands (instructions out) of the two state machines.

Servers turn each received op dict ``{"op": "task-finished", ...}`` into an
event with :func:`from_message` (unknown ops or wrong fields raise
:class:`MalformedMessage`) and carry out the commands the state machine returns.
Events carry ``now`` (seconds, from the server's clock) wherever time matters;
state machines never read a clock.

Commands are few: ``Send`` (a message to a peer: a worker address, a client id
or ``"scheduler"``), and on the worker side ``Execute``, ``GatherDep`` and
``Resume`` (a seceded task may take a thread slot again).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

Key = Any


class MalformedMessage(ValueError):
    """A message that is not a known op with the right fields."""


# ============================================================ commands
@dataclass(slots=True)
class Send:
    to: str
    msg: dict

    def match(self, **kw: Any) -> bool:
        return all(self.msg.get(k) == v if k != "to" else self.to == v for k, v in kw.items())


@dataclass(slots=True)
class Execute:
    key: Key
    run_spec: Any


@dataclass(slots=True)
class GatherDep:
    worker: str
    keys: list


@dataclass(slots=True)
class Resume:
    """A seceded task that asked to rejoin has a thread slot again: let it go on."""

    key: Key


# ============================================================ scheduler events
@dataclass(slots=True)
class AddWorker:
    address: str
    nthreads: int
    memory_limit: int = 0
    name: str | int = ""  # dask-mpi names workers by their rank
    host: str = ""
    resources: dict = field(default_factory=dict)
    keys: dict = field(default_factory=dict)  # key -> nbytes already held
    pid: int = 0
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class RemoveWorker:
    address: str
    reason: str = ""
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class AddClient:
    client: str
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class RemoveClient:
    client: str
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class UpdateGraph:
    """A client submits tasks: ``tasks[key] = {"run_spec": ..., "deps": [...]}``."""

    client: str
    tasks: dict
    keys: list  # keys the client holds futures to
    priority: int = 0  # user priority: higher runs earlier
    retries: dict = field(default_factory=dict)  # key -> n
    resources: dict | None = None  # {"GPU": 1}: applies to all tasks of the call
    workers: list | None = None  # worker addresses or names allowed
    allow_other_workers: bool = False
    static_priorities: dict | None = None  # key -> int, from the client (else order())
    # per-key annotations (dask.annotate): name -> {key: value}; override the call's values
    annotations: dict | None = None
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class ClientDesiresKeys:
    client: str
    keys: list
    fire_and_forget: bool = False  # run them even once no client wants them
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class RetryKeys:
    """Run erred tasks again, with the erred tasks they depend on."""

    client: str
    keys: list
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class ClientReleasesKeys:
    client: str
    keys: list
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class CancelKeys:
    client: str
    keys: list
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class TaskStarted:
    worker: str
    key: Key
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class TaskFinished:
    worker: str
    key: Key
    nbytes: int = 0
    typename: str = ""
    start: float = 0.0
    stop: float = 0.0
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class TaskErred:
    worker: str
    key: Key
    exception: Any = None  # Serialized exception object
    traceback: str = ""
    exception_text: str = ""
    start: float = 0.0
    stop: float = 0.0
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class LongRunning:
    """A task on ``worker`` seceded from the thread pool: it no longer occupies a slot."""

    worker: str
    key: Key
    compute_duration: float = 0.0  # seconds it ran before seceding
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class ResultErred:
    """The result of ``key``, held by ``worker``, could not be serialized to leave it."""

    worker: str
    key: Key
    exception: Any = None  # Serialized exception object
    traceback: str = ""
    exception_text: str = ""
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class MissingData:
    """``worker`` could not get ``key`` from ``errant_worker``."""

    worker: str
    key: Key
    errant_worker: str
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class AddKeys:
    """``worker`` now holds ``keys`` (replicas acquired, scattered data stored)."""

    worker: str
    keys: dict  # key -> nbytes
    scatter_id: str | None = None
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class ReleaseWorkerData:
    """``worker`` dropped its copy of ``keys``."""

    worker: str
    keys: list
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class StealResponse:
    worker: str
    key: Key
    state: str
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class Heartbeat:
    worker: str
    metrics: dict = field(default_factory=dict)
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class WorkerStatusChange:
    """``worker`` paused (its memory is past the pause fraction: it starts nothing) or runs
    again; a paused worker is given no new task."""

    worker: str
    status: str  # "paused" | "running"
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class ScatterData:
    client: str
    scatter_id: str
    data: dict  # key -> Serialized
    nbytes: dict  # key -> int
    workers: list | None = None
    broadcast: bool = False
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class RetireWorkers:
    request_id: str
    requester: str
    workers: list  # addresses
    close: bool = True
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class RebalanceKeys:
    """``Client.rebalance``: spread ``keys`` (all if None) over ``workers`` (all if None)."""

    request_id: str
    requester: str
    keys: list | None = None
    workers: list | None = None
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class Tick:
    now: float = 0.0
    stimulus_id: str = ""


# ============================================================ worker events
@dataclass(slots=True)
class ComputeTask:
    key: Key
    run_spec: Any
    priority: tuple = ()
    who_has: dict = field(default_factory=dict)  # dep key -> [worker addresses]
    nbytes: dict = field(default_factory=dict)  # dep key -> nbytes
    resource_restrictions: dict | None = None
    duration: float = 0.5
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class FreeKeys:
    keys: list
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class StealRequest:
    key: Key
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class AcquireReplicas:
    who_has: dict  # key -> [worker addresses]
    nbytes: dict = field(default_factory=dict)
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class RefreshWhoHas:
    who_has: dict
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class UpdateData:
    data: dict  # key -> value (deserialized by the server)
    scatter_id: str | None = None
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class PauseWorker:
    """The worker's memory monitor: stop starting tasks and fetching (``paused=True``), or
    go on again."""

    paused: bool
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class ExecuteSuccess:
    key: Key
    value: Any
    nbytes: int
    typename: str = ""
    start: float = 0.0
    stop: float = 0.0
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class ExecuteFailure:
    key: Key
    exception: Any
    traceback: str = ""
    exception_text: str = ""
    start: float = 0.0
    stop: float = 0.0
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class GatherDepSuccess:
    worker: str
    data: dict  # key -> value
    missing: list = field(default_factory=list)  # asked for but not held by the peer
    # key -> text: held by the peer but could not be serialized (the peer reports it)
    errors: dict = field(default_factory=dict)
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class Secede:
    """The task ``key`` gave its thread back to the pool (``hpcsched.secede()``)."""

    key: Key
    compute_duration: float = 0.0
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class Rejoin:
    """The seceded task ``key`` waits for a thread slot (``hpcsched.rejoin()``)."""

    key: Key
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class ServeFailed:
    """The result of ``key`` could not be serialized for a peer or a client."""

    key: Key
    exception: Any = None
    traceback: str = ""
    exception_text: str = ""
    now: float = 0.0
    stimulus_id: str = ""


@dataclass(slots=True)
class GatherDepFailure:
    """The peer could not be reached (or died while sending)."""

    worker: str
    keys: list
    error: str = ""
    now: float = 0.0
    stimulus_id: str = ""


# ============================================================ op table
# ops a peer may send, and the event each becomes; the server adds the sender
# (worker=/client=) and now=.
SCHEDULER_OPS: dict[str, type] = {
    "task-started": TaskStarted,
    "task-finished": TaskFinished,
    "task-erred": TaskErred,
    "missing-data": MissingData,
    "long-running": LongRunning,
    "result-erred": ResultErred,
    "add-keys": AddKeys,
    "release-worker-data": ReleaseWorkerData,
    "steal-response": StealResponse,
    "heartbeat": Heartbeat,
    "worker-status-change": WorkerStatusChange,
    "update-graph": UpdateGraph,
    "client-desires-keys": ClientDesiresKeys,
    "client-releases-keys": ClientReleasesKeys,
    "cancel-keys": CancelKeys,
    "retry-keys": RetryKeys,
}

WORKER_OPS: dict[str, type] = {
    "compute-task": ComputeTask,
    "free-keys": FreeKeys,
    "steal-request": StealRequest,
    "acquire-replicas": AcquireReplicas,
    "refresh-who-has": RefreshWhoHas,
}

_field_names: dict[type, frozenset] = {}


def from_message(table: dict[str, type], msg: Any, **extra: Any) -> Any:
    """The event for op dict ``msg``; raises MalformedMessage naming what is wrong."""
    if not isinstance(msg, dict):
        raise MalformedMessage(f"expected an op dict, got {type(msg).__name__}")
    op = msg.get("op")
    cls = table.get(op)  # type: ignore[arg-type]
    if cls is None:
        raise MalformedMessage(f"unknown op {op!r}")
    names = _field_names.get(cls)
    if names is None:
        names = _field_names[cls] = frozenset(f.name for f in fields(cls))
    kw = {k: v for k, v in msg.items() if k != "op"}
    kw.update(extra)
    bad = set(kw) - names
    if bad:
        raise MalformedMessage(f"op {op!r} has unknown fields {sorted(bad)}")
    try:
        return cls(**kw)
    except TypeError as e:
        raise MalformedMessage(f"op {op!r}: {e}") from None
