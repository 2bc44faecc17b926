"""Events (stimuli in) and commands (instructions out) of the two state machines.

An event that arrives as a message *is* that message's record in
:mod:`hpcsched.core.protocol.messages` (``TaskFinished`` is the ``task-finished`` op);
the others happen inside a server (a worker joined, a task ran, a tick). Every
event carries ``now`` (seconds, from the server's clock) wherever time matters
-- state machines never read a clock -- and a ``stimulus_id`` naming it, so a
state change can be traced to the event that caused it, as in distributed's
worker state machine.

Servers turn each received message into its record with
:func:`hpcsched.core.protocol.wire.receive`, which fills in the sender, ``now`` and the
``stimulus_id`` as it builds it (unknown ops or wrong fields raise
:class:`MalformedMessage`), and carry out the commands the state machine returns.

Events and commands are frozen records (:mod:`hpcsched.core.protocol.records`), as in
distributed's worker state machine: nothing can assign to one once it is built, and a
server that must change one (a stimulus id it lacks) makes a changed copy.

Commands are few: ``Send`` (a message to a peer: a worker address, a client id
or ``"scheduler"``; a wire dict or a protocol record), and on the worker side
``Execute``, ``GatherDep`` and ``Resume`` (a seceded task may take a thread
slot again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from hpcsched.core.protocol.records import Record, field
from hpcsched.core.protocol.wire import MalformedMessage, encode
from hpcsched.core.protocol.worker import (
    AcquireReplicas,
    AddKeys,
    ComputeTask,
    FreeKeys,
    Heartbeat,
    LongRunning,
    MissingData,
    RangeFinished,
    RangeReleased,
    RefreshWhoHas,
    ReleaseWorkerData,
    ResultErred,
    StealRequest,
    StealResponse,
    TaskErred,
    TaskFinished,
    TaskStarted,
    UpdateData,
    WorkerStatusChange,
)

if TYPE_CHECKING:  # at run time, from __getattr__ below
    from hpcsched.core.protocol.client import (
        CancelKeys,
        ClientDesiresKeys,
        ClientReleasesKeys,
        RetryKeys,
        ScatterData,
        UpdateGraph,
        UpdateMap,
    )

#: the client's requests that are events of the scheduler's state machine: imported when
#: first asked for, so that a worker, which never asks, is spared the client's protocol
_CLIENT_EVENTS = frozenset({"CancelKeys", "ClientDesiresKeys", "ClientReleasesKeys",
                            "RetryKeys", "ScatterData", "UpdateGraph", "UpdateMap"})


def __getattr__(name: str) -> Any:
    if name in _CLIENT_EVENTS:
        from hpcsched.core.protocol import client

        value = globals()[name] = getattr(client, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AcquireReplicas", "AddClient", "AddKeys", "AddWorker", "CancelKeys", "ClientDesiresKeys",
    "ClientReleasesKeys", "ComputeTask", "Execute", "ExecuteFailure", "ExecuteSuccess",
    "FillQueue", "FreeKeys", "GatherDep", "GatherDepFailure", "GatherDepSuccess", "Heartbeat", "Key",
    "LongRunning", "MalformedMessage", "MissingData", "RangeFinished", "RangeReleased", "PauseWorker", "RefreshWhoHas", "Rejoin",
    "ReleaseWorkerData", "RemoveClient", "RemoveWorker", "ResultErred", "Resume",
    "RetireWorkers", "RetryKeys", "ScatterData", "Secede", "Send",
    "ServeFailed", "StealRequest", "StealResponse", "TaskErred", "TaskFinished", "TaskStarted",
    "Tick", "UpdateData", "UpdateGraph", "UpdateMap", "WorkerStatusChange",
]

Key = Any

#: seconds: a ``compute-task`` whose duration estimate is shorter is not answered with a
#: ``task-started`` (one message fewer per short task); the scheduler sends a longer
#: estimate for a task a worker died with, so that a further death is blamed on it alone
SHORT_TASK = 0.01


# ============================================================ commands
class Send(Record):
    """Send ``msg`` -- a wire dict or a protocol record -- to peer ``to``."""

    to: str
    msg: Any

    def match(self, **kw: Any) -> bool:
        """Whether ``to`` and the message's fields (``op`` included) have these values."""
        msg = self.msg
        if isinstance(msg, dict):
            return all(msg.get(k) == v if k != "to" else self.to == v for k, v in kw.items())
        return all(getattr(msg, k, None) == v if k != "to" else self.to == v
                   for k, v in kw.items())

    def wire(self) -> dict:
        """The message as it goes on the wire."""
        return self.msg if isinstance(self.msg, dict) else encode(self.msg)



class InvalidTransition(AssertionError):
    """A task was asked to go from one state to another its state machine does not allow
    (the scheduler's or a worker's): a bug in that machine, never the peer's fault."""


class GangLease(NamedTuple):
    """What the members of a task holding many slots share, as the scheduler sent it:
    their communicator's number (:class:`~.tasks.GangComms`), the numbers of those to free
    first, and each member's host, in member order."""

    comm: int
    free_comms: tuple
    hosts: tuple


class Execute(Record):
    """Run task ``key`` (its ``run_spec``) on a thread of the worker's pool; ``announced``:
    its ``task-started`` is among the messages this batch sends, and must leave first."""

    key: Key
    run_spec: Any
    announced: bool = False
    gang: tuple = ()  # a member of a task holding many slots: every member's address
    #: resource name -> the ids of the devices of it the task holds while it runs ("GPU")
    devices: dict | None = None
    lease: GangLease | None = None  # and what its members share


class GatherDep(Record):
    """Fetch ``keys`` from peer ``worker``."""

    worker: str
    keys: list


class Resume(Record):
    """A seceded task that asked to rejoin has a thread slot again: let it go on."""

    key: Key


class Interrupt(Record):
    """The results of ``keys`` are no longer wanted (released, cancelled): a task among
    them still running may stop early, if it asked to be told (a command task's program,
    :func:`hpcsched.core.worker.context.on_interrupt`)."""

    keys: list


class RunRanges(Record):
    """Start a thread on the worker's waiting ranges of bulk maps: it holds one of the
    ``nthreads`` slots until it ends (``RangeThreadDone``). It starts once this batch's
    messages have left: should an element kill the worker, the scheduler knows what
    finished before it."""


# ============================================================ events the servers make
class Internal(Record, kw_only=True):
    """Base of the events a server makes itself (not read off a message): frozen, with
    when it happened and the ``stimulus_id`` that names it, as the records have."""

    now: float = 0.0
    stimulus_id: str = ""


# ============================================================ scheduler events
# (those a worker or a client sends are protocol records, imported above)
class AddWorker(Internal):
    """A worker registered (the scheduler's reading of its ``register-worker``)."""

    address: str
    nthreads: int
    memory_limit: int = 0
    name: str | int = ""  # dask-mpi names workers by their rank
    host: str = ""
    resources: dict = field(factory=dict)
    keys: dict = field(factory=dict)  # key -> nbytes already held
    pid: int = 0
    running: list = field(factory=list)  # tasks it is running (it registers again)
    paused: bool = False  # given no new task until it runs (WorkerStatusChange)
    lifetime_end: float | None = None  # when it will leave (its lifetime, its walltime)
    gpus: list = field(factory=list)  # the ids of the GPUs behind its GPU resource
    resources_only: bool = False  # only tasks asking for one of its resources run there
    job: str | None = None  # the batch job it runs in (a gang's slots come from one)


class RemoveWorker(Internal):
    """A worker left (its connection closed, it timed out, it was retired)."""

    address: str
    reason: str = ""


class AddClient(Internal):
    """A client registered."""

    client: str


class RemoveClient(Internal):
    """A client left (it closed, or its connection did)."""

    client: str


class RetireWorkers(Internal):
    """Retire ``workers`` (addresses, resolved from a ``retire-workers`` request or a
    worker's ``retire-me``); ``requester`` hears the reply."""

    request_id: str
    requester: str
    workers: list  # addresses
    close: bool = True


class RebalanceKeys(Internal):
    """``Client.rebalance``: spread ``keys`` (all if None) over ``workers`` (all if None)."""

    request_id: str
    requester: str
    keys: list | None = None
    workers: list | None = None


class FillQueue(Internal):
    """Queued tasks still wait for free workers that the last event left unfilled
    (:attr:`~hpcsched.core.state.scheduler_state.SchedulerState.fill_pending`): the
    server sends it once that event's messages are out, and it hands the next ones."""


class Tick(Internal):
    """The server's periodic tick: timeouts, work stealing, retirements in progress."""


# ============================================================ worker events
class PauseWorker(Internal):
    """The worker's memory monitor: stop starting tasks and fetching (``paused=True``), or
    go on again."""

    paused: bool


class RangesWaiting(Internal):
    """The worker's ranges of bulk maps (:mod:`hpcsched.core.worker.ranges`) want
    ``threads`` more threads than they have: ranges wait that no running thread will take
    (a thread takes waiting ranges one after the other, so that at most one per range is
    wanted, and no more than ``nthreads`` in all)."""

    threads: int


class RangeThreadDone(Internal):
    """A thread of the ranges ended (no range waited, or a task waited for its slot):
    its slot is free; the ranges want ``threads`` more threads (as ``RangesWaiting``)."""

    threads: int


class ExecuteSuccess(Record):
    """Task ``key`` ran and returned ``value`` (``nbytes`` in memory)."""

    key: Key
    value: Any
    nbytes: int
    typename: str = ""
    start: float = 0.0
    stop: float = 0.0
    now: float = 0.0
    stimulus_id: str = ""
    cpu: float = 0.0  # CPU seconds of the call (a command: its process's)
    memory: int = 0  # peak memory in bytes, as TaskFinished.memory


class ExecuteFailure(Internal):
    """Task ``key`` raised ``exception``."""

    key: Key
    exception: Any
    traceback: str = ""
    exception_text: str = ""
    start: float = 0.0
    stop: float = 0.0
    cpu: float = 0.0
    memory: int = 0


class GatherDepSuccess(Record):
    """Peer ``worker`` answered a fetch with ``data``."""

    worker: str
    data: dict  # key -> value
    missing: list = field(factory=list)  # asked for but not held by the peer
    # key -> text: held by the peer but could not be serialized (the peer reports it)
    errors: dict = field(factory=dict)
    now: float = 0.0
    stimulus_id: str = ""


class Secede(Internal):
    """The task ``key`` gave its thread back to the pool (``hpcsched.secede()``)."""

    key: Key
    compute_duration: float = 0.0


class Rejoin(Internal):
    """The seceded task ``key`` waits for a thread slot (``hpcsched.rejoin()``)."""

    key: Key


class ServeFailed(Internal):
    """The result of ``key`` could not be serialized for a peer or a client."""

    key: Key
    exception: Any = None
    traceback: str = ""
    exception_text: str = ""


class GatherDepFailure(Internal):
    """The peer could not be reached (or died while sending)."""

    worker: str
    keys: list
    error: str = ""
