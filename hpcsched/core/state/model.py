"""What the scheduler knows: tasks, task groups, workers (plain records, no behaviour),
and the outbox its components share.

:class:`TaskState` and :class:`WorkerInfo` link to each other (``who_has`` /
``has_what``, ``processing_on`` / ``processing``); the components of
:class:`~hpcsched.core.state.scheduler_state.SchedulerState` change them (the task
graph, :mod:`.tasks`, the links), and its ``validate()`` checks that the links agree.
This module is the bottom of the scheduler state: it imports no other component.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpcsched.core.state.events import Send

Key = Any


#: who wants a key passed to ``fire_and_forget``: nobody to report to; released once done
FIRE_AND_FORGET = "fire-and-forget"

class Outbox:
    """What the event being handled sends, and the event's ``stimulus_id`` and ``now``: the
    one object every component of the scheduler state shares (the state fills it in
    before each event and empties it after)."""

    __slots__ = ("messages", "stimulus_id", "now", "recorder")

    def __init__(self) -> None:
        self.messages: list[Send] = []
        self.stimulus_id = ""
        self.now = 0.0
        # what happened, for the dashboard and reports (hpcsched.diagnostics.recorder):
        # called from a few handlers, never read back here
        self.recorder: Any = None

    def send(self, to: str, msg: Any) -> None:
        """Emit a message (a protocol record) for peer ``to``."""
        self.messages.append(Send(to, msg))


class KilledWorker(RuntimeError):
    """A task was running on workers that died, ``allowed-failures`` times."""


class NoValidWorkerError(RuntimeError):
    """No worker could run a task for ``scheduler.no-workers-timeout`` (dask's name)."""


class LostData(RuntimeError):
    """Data that cannot be recomputed (scattered) was lost with its worker."""


#: every (start, finish) a task may go through; ``forgotten`` is the task deleted
ALLOWED_TRANSITIONS: frozenset[tuple[str, str]] = frozenset({
    ("released", "waiting"), ("released", "memory"), ("released", "erred"),
    ("released", "forgotten"),
    ("waiting", "processing"), ("waiting", "queued"), ("waiting", "no-worker"),
    ("waiting", "memory"), ("waiting", "released"), ("waiting", "erred"),
    ("queued", "processing"), ("queued", "memory"), ("queued", "released"), ("queued", "erred"),
    ("no-worker", "processing"), ("no-worker", "queued"), ("no-worker", "memory"),
    ("no-worker", "released"), ("no-worker", "erred"),
    # processing -> waiting: taken back from a worker (stolen, or its worker retires)
    ("processing", "memory"), ("processing", "released"), ("processing", "erred"),
    ("processing", "waiting"),
    ("memory", "released"), ("memory", "erred"),
    # erred -> memory: scattered data that was lost is scattered again
    ("erred", "released"), ("erred", "memory"),
})


#: a recommendation of the task graph: (task, the state it should go to)
Rec = tuple["TaskState", str]


@dataclass(slots=True)
class Retirement:
    """A worker retiring gracefully: its unique results are copied away, then it closes."""

    request_id: str
    requester: str  # who gets the retire-workers-reply
    start: float
    close: bool  # send it ``close`` once done (else it stays up, unused)
    workers: list[str]  # every worker of the same request (the reply lists them all)
    sent: set = field(default_factory=set)  # keys whose copy was asked of a survivor


@dataclass(slots=True)
class Scatter:
    """A client's scatter in flight: answered once every (worker, key) copy is stored."""

    client: str
    pending: set  # {(worker address, key)}


@dataclass(slots=True)
class Rebalance:
    """``Client.rebalance`` in flight: each move copies a key to its recipient first; the
    sender's copy is dropped only once the recipient reports holding it (``add-keys``)."""

    request_id: str
    requester: str
    start: float
    moves: dict = field(default_factory=dict)  # (key, recipient address) -> sender address


class TaskGroup:
    """The tasks sharing a key prefix (``inc-1``, ``inc-2``, ...): their durations and placement."""

    __slots__ = ("name", "n_tasks", "dep_keys", "duration_total", "n_durations",
                 "last_worker", "last_worker_tasks_left", "nbytes_total", "n_nbytes")

    def __init__(self, name: str):
        self.name = name
        self.n_tasks = 0
        self.dep_keys: set = set()  # distinct dependency keys, capped at a few
        self.duration_total = 0.0
        self.n_durations = 0
        self.last_worker: WorkerInfo | None = None
        self.last_worker_tasks_left = 0
        self.nbytes_total = 0
        self.n_nbytes = 0  # results counted in nbytes_total

    @property
    def average_duration(self) -> float | None:
        """Mean seconds of the group's finished tasks (None before the first)."""
        return self.duration_total / self.n_durations if self.n_durations else None

    @property
    def average_nbytes(self) -> float | None:
        """Mean bytes of the group's results so far (None before the first)."""
        return self.nbytes_total / self.n_nbytes if self.n_nbytes else None

    def __repr__(self) -> str:
        return f"<TaskGroup {self.name}: {self.n_tasks} tasks>"


class TaskState:
    """The scheduler's view of one task."""

    __slots__ = (
        "key", "group", "state", "priority", "run_spec", "dependencies", "dependents",
        "waiting_on", "waiters", "who_wants", "who_has", "processing_on", "nbytes", "typename",
        "retries", "suspicious", "erred_on", "exception", "traceback", "exception_text",
        "exception_blame", "resource_restrictions", "worker_restrictions", "loose_restrictions",
        "queued_seq", "stealing", "rootish_cache", "block", "width", "per_node", "duration",
    )

    def __init__(self, key: Key, run_spec: Any, group: TaskGroup):
        self.key = key
        self.group = group
        self.state = "released"
        self.priority: tuple = ()
        self.run_spec = run_spec
        self.dependencies: set[TaskState] = set()
        self.dependents: set[TaskState] = set()
        self.waiting_on: set[TaskState] = set()
        self.waiters: set[TaskState] = set()
        self.who_wants: set[str] = set()
        self.who_has: set[WorkerInfo] = set()
        self.processing_on: WorkerInfo | None = None
        self.nbytes = -1
        self.typename = ""
        self.retries = 0
        self.suspicious = 0
        self.erred_on: tuple[str, ...] = ()  # a list would cost every task its 56 bytes
        self.exception: Any = None
        self.traceback = ""
        self.exception_text = ""
        self.exception_blame: TaskState | None = None
        self.resource_restrictions: dict | None = None
        self.worker_restrictions: set | None = None
        self.loose_restrictions = False
        self.queued_seq = 0
        self.stealing = False
        self.rootish_cache: bool | None = None
        self.block: Any = None  # its RootBlock while queued (hpcsched.core.state.blocks)
        # the worker slots it holds while it runs, one on each of ``width`` workers (a gang:
        # the workers are in TaskGraph.leases, processing_on the first of them)
        self.width = 1
        self.per_node = 0  # of those, at most this many on one host (0: packed)
        # seconds it is expected to run, as its submitter said (else its group's measure)
        self.duration: float | None = None

    def __repr__(self) -> str:
        return f"<TaskState {self.key!r} {self.state}>"

    def __lt__(self, other: TaskState) -> bool:
        return self.priority < other.priority


class WorkerInfo:
    """The scheduler's view of one worker."""

    __slots__ = ("address", "name", "host", "nthreads", "memory_limit", "resources",
                 "used_resources", "processing", "executing", "has_what", "nbytes", "occupancy",
                 "n_elements", "element_nbytes", "reserved",
                 "status", "last_seen", "metrics", "pid", "heap_version", "long_running",
                 "root_block", "heartbeat_interval", "end", "gpus", "blocked",
                 "resources_only", "job")

    def __init__(self, address: str, nthreads: int, memory_limit: int = 0, name: str | int = "",
                 host: str = "", resources: dict | None = None, pid: int = 0, now: float = 0.0):
        self.address = address
        self.name = name or address
        self.host = host
        self.nthreads = max(int(nthreads), 1)
        self.memory_limit = int(memory_limit or 0)
        self.resources = dict(resources or {})
        self.used_resources = {r: 0 for r in self.resources}
        self.processing: dict[TaskState, float] = {}  # task -> estimated duration
        self.executing: set[TaskState] = set()
        # processing tasks that seceded from the worker's thread pool: they occupy no slot
        self.long_running: set[TaskState] = set()
        self.has_what: dict[TaskState, None] = {}
        self.nbytes = 0  # bytes of the results held: tasks' and bulk maps' elements'
        # results of bulk maps' elements held (not in has_what: :mod:`.bulk`), and their bytes
        self.n_elements = 0
        self.element_nbytes = 0
        # the wide task its slots are kept free for (Placement.decide_gang): no other work
        # starts here meanwhile
        self.reserved: TaskState | None = None
        self.occupancy = 0.0
        self.status = "running"  # running | paused | blocked | closing_gracefully
        # failed gangs whose part still holds a thread here, perhaps forever (blocked in a
        # collective MPI cannot interrupt) -> whether that thread is counted off
        # ``nthreads`` (its last thread is not: the worker is "blocked" instead)
        self.blocked: dict[Any, bool] = {}
        self.last_seen = now
        self.heartbeat_interval = 0.0  # the interval the worker was told (liveness.py)
        self.metrics: dict = {}
        self.pid = pid
        self.heap_version = 0
        self.root_block: Any = None  # the RootBlock it takes queued tasks from
        #: when it will leave (its lifetime, its job's walltime; the events' clock), or None
        self.end: float | None = None
        self.gpus: tuple[str, ...] = ()  # the ids of the GPUs behind its GPU resource
        #: kept for tasks that ask for one of its resources (a GPU job's workers): the
        #: paths that place unrestricted work (WorkerRegistry.running(), the free heap,
        #: thieves, bulk ranges) pass it by
        self.resources_only = False
        self.job: str | None = None  # the batch job it runs in: a gang's slots share one

    def __repr__(self) -> str:
        return f"<WorkerInfo {self.address} {self.status} processing={len(self.processing)}>"

    def info(self) -> dict:
        """A plain description of the worker (``scheduler_info()['workers']``); ``id`` is
        its name, as dask.distributed's worker identity has it."""
        return {
            "address": self.address, "name": self.name, "id": self.name, "host": self.host,
            "nthreads": self.nthreads, "memory_limit": self.memory_limit,
            "resources": dict(self.resources), "nbytes": self.nbytes,
            "processing": len(self.processing), "executing": len(self.executing),
            "long_running": len(self.long_running),
            "n_keys": len(self.has_what) + self.n_elements, "occupancy": self.occupancy,
            "status": self.status, "blocked": len(self.blocked),
            "pid": self.pid, "metrics": dict(self.metrics), "last_seen": self.last_seen,
            "lifetime_end": self.end, "gpus": list(self.gpus),
            "resources_only": self.resources_only, "job": self.job,
        }
