"""The scheduler as a pure state machine: events in, ``Send`` commands out.

Rules of this file:

* No sockets, threads, MPI or clocks: every event carries ``now``.
* ``handle(event) -> list[Send]``; messages to one peer are batched by the
  server, not here.
* Task states: released, waiting, queued, no-worker, processing, memory,
  erred (and forgotten, i.e. deleted). Every change of state goes through
  :meth:`SchedulerState.transition`, which checks it against
  :data:`~hpcsched.core.state.model.ALLOWED_TRANSITIONS`, leaves the old
  state's bookkeeping (a worker's slot, the queue, the unrunnable set) and
  appends ``(key, start, finish, stimulus_id, now)`` to ``transition_log``:
  the ``stimulus_id`` of the event being handled, so that each change can be
  traced to its cause, as in distributed's scheduler
  (https://distributed.dask.org/en/stable/scheduling-state.html).
* Recommendations run from a LIFO stack (:meth:`SchedulerState.transitions`)
  so that work made ready by a finished task is handled first.
* Decisions are delegated to :mod:`hpcsched.core.state.policies` (which worker, through
  :class:`~.placement.Placement`, which also runs the queue of root-ish
  tasks) and :mod:`hpcsched.core.state.order` (static priorities).
* :meth:`SchedulerState.validate` checks every invariant; tests call it after
  each step.

This object holds the state (tasks, workers, clients, the outbox, the log)
and the task transitions. The handlers of events are components that are
handed this object: :class:`~.workers.WorkerEvents` (workers join,
leave, report results), :class:`~.clients.ClientRequests` (graphs,
wanted and released keys), :class:`~.maintenance.Maintenance`
(scatter, replicas, stealing, retirement, rebalance, the tick); the records
are in :mod:`.model`, the invariant check in :mod:`.validate`.

Priorities are ``(generation, -user_priority, static_priority)``: every task of
an earlier ``submit``/``map``/``compute`` call comes before those of a later
one ("first-come-first-served, coarsely", as distributed's priorities).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from hpcsched.core.protocol.messages import (
    ComputeTask,
    FreeKeys,
    KeyInMemory,
    TaskErredReport,
)
from hpcsched.core.protocol.messages import LostData as LostDataReport
from hpcsched.core.state import events as ev
from hpcsched.core.state.blocks import RootBlocks
from hpcsched.core.state.clients import ClientRequests
from hpcsched.core.state.maintenance import Maintenance
from hpcsched.core.state.model import (  # noqa: F401 - re-exported
    ALLOWED_TRANSITIONS,
    FIRE_AND_FORGET,
    InvalidTransition,
    KilledWorker,
    LostData,
    Retirement,
    Scatter,
    TaskGroup,
    TaskState,
    WorkerInfo,
)
from hpcsched.core.state.placement import Placement
from hpcsched.core.state.validate import validate
from hpcsched.core.state.workers import WorkerEvents
from hpcsched.core.units import parse_bytes

Key = Any
#: a recommendation: (task, "waiting" | "waiting-ready" | "released" | "forgotten")
Rec = tuple[TaskState, str]
#: one entry of ``transition_log``: (key, start, finish, stimulus_id, now)
Transition = tuple[Key, str, str, str, float]

_LEAVE = frozenset({"processing", "queued", "no-worker"})


class SchedulerState:
    """The scheduler's state and its task transitions (see the module's docstring)."""

    def __init__(
        self,
        *,
        worker_saturation: float = 1.1,
        rootish_policy: str = "queue",
        rootish_factor: float = 2,
        rootish_max_deps: int = 5,
        queue_block_size: int = 4,
        queue_block_bytes: int | str = 2**20,
        allowed_failures: int = 3,
        unknown_task_duration: float = 0.5,
        bandwidth: float = 100e6,
        work_stealing: bool = True,
        worker_ttl: float | None = None,
        retire_timeout: float = 120.0,
        transition_log_length: int = 1000,
        seed: int = 0,
    ):
        if rootish_policy not in ("queue", "co-assign", "mars"):
            raise ValueError(f"scheduler.rootish-policy must be queue, co-assign or mars, "
                             f"not {rootish_policy!r}")
        self.worker_saturation = float(worker_saturation)
        if math.isinf(self.worker_saturation) and rootish_policy == "queue":
            rootish_policy = "co-assign"
        self.rootish_policy = rootish_policy
        self.rootish_factor = rootish_factor
        self.rootish_max_deps = rootish_max_deps
        self.allowed_failures = allowed_failures
        self.unknown_task_duration = unknown_task_duration
        self.bandwidth = bandwidth
        self.work_stealing = work_stealing
        self.worker_ttl = worker_ttl
        self.retire_timeout = retire_timeout
        self.rng = random.Random(seed)

        self.tasks: dict[Key, TaskState] = {}
        self.groups: dict[str, TaskGroup] = {}
        self.workers: dict[str, WorkerInfo] = {}
        self.clients: set[str] = set()
        self.total_nthreads = 0
        self.generation = 0
        self.queued: list[tuple[tuple, int, TaskState]] = []  # heap, lazily cleaned
        self.n_queued = 0
        self.blocks = RootBlocks(queue_block_size, parse_bytes(queue_block_bytes))
        self.unrunnable: dict[TaskState, None] = {}
        self.free_heap: list[tuple[float, int, int, WorkerInfo]] = []  # not-full workers
        self.seq = itertools.count()
        self.out: list[ev.Send] = []  # the outbox of the event being handled
        self.slots_opened: dict[WorkerInfo, None] = {}
        self.retiring: dict[str, Retirement] = {}  # by worker address
        self.scatters: dict[str, Scatter] = {}  # by scatter id
        self.mars_assignment: dict[Key, str] = {}
        self.steal_targets: dict[Key, WorkerInfo] = {}
        # the newest transitions, bounded as distributed's (its ``low-level-log-length``
        # defaults to 1000): a long log keeps objects alive that every full garbage
        # collection then scans
        self.transition_log: deque[Transition] = deque(maxlen=transition_log_length)
        # every transition also goes here while a list is set (the server sets one while
        # scheduler plugins want ``transition`` calls, and empties it after each event)
        self.transition_listener: list[Transition] | None = None
        self.stimulus_id = ""  # of the event being handled
        # address -> stimulus id of the event that removed the worker, for the server's
        # remove_worker hooks (it pops each entry; bounded for a state run without a server)
        self.removed_by: dict[str, str] = {}
        self.now = 0.0  # of the event being handled
        self.deferred_ready: list[TaskState] | None = None  # see ClientRequests.update_graph
        # running workers, rebuilt only when a worker joins, leaves or changes status: building
        # it per decision made every task cost O(workers)
        self.running_cache: list[WorkerInfo] | None = None
        # what happened, for the dashboard and reports (hpcsched.diagnostics.recorder):
        # called from a few handlers, never read back here
        self.recorder: Any = None

        self.placement = Placement(self)
        self.worker_events = WorkerEvents(self)
        self.client_requests = ClientRequests(self)
        self.maintenance = Maintenance(self)
        w, c, m = self.worker_events, self.client_requests, self.maintenance
        self.handlers: dict[type, Callable[[Any], None]] = {
            ev.AddWorker: w.add_worker,
            ev.RemoveWorker: w.remove_worker,
            ev.Heartbeat: w.heartbeat,
            ev.TaskStarted: w.task_started,
            ev.TaskFinished: w.task_finished,
            ev.TaskErred: w.task_erred,
            ev.LongRunning: w.long_running,
            ev.ResultErred: w.result_erred,
            ev.MissingData: w.missing_data,
            ev.AddClient: c.add_client,
            ev.RemoveClient: c.remove_client,
            ev.UpdateGraph: c.update_graph_gc_paused,
            ev.ClientDesiresKeys: c.client_desires,
            ev.ClientReleasesKeys: c.client_releases,
            ev.CancelKeys: c.cancel,
            ev.RetryKeys: c.retry,
            ev.ScatterData: m.scatter,
            ev.AddKeys: m.add_keys,
            ev.ReleaseWorkerData: m.release_worker_data,
            ev.StealResponse: m.steal_response,
            ev.WorkerStatusChange: m.worker_status_change,
            ev.RetireWorkers: m.retire_workers,
            ev.RebalanceKeys: m.rebalance,
            ev.Tick: m.tick,
        }

    # ================================================================ dispatch
    def handle(self, event: Any) -> list[ev.Send]:
        """Apply ``event``; return the messages to send."""
        self.stimulus_id = event.stimulus_id
        self.now = event.now
        self.handlers[type(event)](event)
        self.placement.fill_slots()
        out, self.out = self.out, []
        return out

    def send(self, to: str, msg: Any) -> None:
        """Emit a message (a protocol record) for peer ``to``."""
        self.out.append(ev.Send(to, msg))

    def validate(self) -> None:
        """Check every invariant; raises AssertionError naming the broken one."""
        validate(self)

    # ================================================================ queries
    def who_has(self, keys: Iterable[Key]) -> dict[Key, list[str]]:
        """The addresses of the workers holding each of ``keys``."""
        out = {}
        for k in keys:
            ts = self.tasks.get(k)
            out[k] = [ws.address for ws in ts.who_has] if ts is not None else []
        return out

    def task_counts(self) -> dict[str, int]:
        """How many tasks are in each state."""
        counts: dict[str, int] = {}
        for ts in self.tasks.values():
            counts[ts.state] = counts.get(ts.state, 0) + 1
        return counts

    def wanted(self, ts: TaskState) -> bool:
        """Whether a client, or a task still to run, wants ``ts``'s result."""
        return bool(ts.who_wants or ts.waiters)

    def running(self) -> list[WorkerInfo]:
        """Running workers (cached; callers must not modify the list)."""
        r = self.running_cache
        if r is None:
            r = self.running_cache = [ws for ws in self.workers.values()
                                      if ws.status == "running"]
        return r

    # ================================================================ transitions
    def transition(self, ts: TaskState, finish: str, stimulus_id: str | None = None,
                   notify: bool = False) -> None:
        """Move ``ts`` to ``finish``: the one place a task's state changes. Leaving
        processing, queued or no-worker undoes what entering them did (``notify``: tell
        the worker that was computing it to drop it); the change is logged with the
        stimulus id of the event being handled unless another is given."""
        start = ts.state
        if (start, finish) not in ALLOWED_TRANSITIONS:
            raise InvalidTransition(f"{ts.key!r}: {start} -> {finish}")
        if start in _LEAVE:
            if start == "processing":
                self.exit_processing(ts, notify)
            elif start == "queued":
                self.n_queued -= 1
                ts.block = None
                if not self.n_queued:
                    self.blocks.clear()
            else:
                self.unrunnable.pop(ts, None)
        ts.state = finish
        entry = (ts.key, start, finish, stimulus_id or self.stimulus_id, self.now)
        self.transition_log.append(entry)
        if self.transition_listener is not None:
            self.transition_listener.append(entry)

    def transitions(self, recs: list[Rec]) -> None:
        """Run recommendations, LIFO: (task, "waiting" | "waiting-ready" | "released" |
        "forgotten")."""
        stack = recs[::-1] if len(recs) > 1 else list(recs)
        while stack:
            ts, finish = stack.pop()
            if self.tasks.get(ts.key) is not ts:
                continue
            if finish == "waiting":
                new = self._released_to_waiting(ts)
            elif finish == "waiting-ready":
                if self.deferred_ready is not None:
                    self.deferred_ready.append(ts)
                    continue
                new = self._ready(ts) if ts.state in ("waiting", "no-worker") and \
                    not ts.waiting_on else []
            elif finish == "released":
                new = self._to_released(ts)
            elif finish == "forgotten":
                new = self._forget(ts)
            else:  # pragma: no cover - programming error
                raise ValueError(f"bad recommendation {finish!r} for {ts!r}")
            if new:
                stack.extend(reversed(new))

    def _released_to_waiting(self, ts: TaskState) -> list[Rec]:
        if ts.state != "released" or not self.wanted(ts):
            return []
        if ts.run_spec is None:
            exc = LostData(f"{ts.key!r} has no task to compute it (scattered data that was lost)")
            return self.set_erred(ts, exc, "", str(exc))
        self.transition(ts, "waiting")
        recs: list[Rec] = []
        ts.waiting_on = set()
        for dts in ts.dependencies:
            dts.waiters.add(ts)
            if dts.state == "memory":
                continue
            if dts.state == "erred":
                # the best-priority failed dependency is blamed, the same one every time
                dts = min((d for d in ts.dependencies if d.state == "erred"),
                          key=lambda d: d.priority)
                return self.set_erred(ts, dts.exception, dts.traceback, dts.exception_text,
                                      dts.exception_blame or dts)
            ts.waiting_on.add(dts)
            if dts.state == "released":
                recs.append((dts, "waiting"))
        if not ts.waiting_on:
            recs.append((ts, "waiting-ready"))
        return recs

    def _ready(self, ts: TaskState) -> list[Rec]:
        """All dependencies are in memory: processing, queued or no-worker."""
        ws = self.placement.decide_worker(ts)
        if ws is not None:
            self.add_to_processing(ts, ws)
        elif self.rootish_policy == "queue" and self.workers and self.placement.is_rootish(ts) \
                and self.running():
            self.placement.enqueue(ts)
        elif ts.state != "no-worker":
            self.transition(ts, "no-worker")
            self.unrunnable[ts] = None
        return []

    def _to_released(self, ts: TaskState) -> list[Rec]:
        start = ts.state
        if start == "released":
            return [] if self.wanted(ts) else [(ts, "forgotten")]
        recs: list[Rec] = []
        if start == "memory":
            for ws in list(ts.who_has):
                self.send(ws.address, FreeKeys([ts.key]))
                self.remove_replica(ts, ws)
            for dts in ts.dependents:
                if dts.state in ("waiting", "processing", "queued", "no-worker"):
                    dts.waiting_on.add(ts)
                    if dts.state != "waiting":
                        recs.append((dts, "released"))
        elif start == "erred":
            ts.exception = None
            ts.traceback = ts.exception_text = ""
            ts.exception_blame = None
        else:  # waiting, processing, queued, no-worker
            for dts in ts.dependencies:
                dts.waiters.discard(ts)
                if not self.wanted(dts) and dts.state in ("memory", "erred", "waiting",
                                                          "queued", "no-worker", "processing"):
                    recs.append((dts, "released"))
            ts.waiting_on.clear()
        self.transition(ts, "released", notify=True)
        recs.append((ts, "waiting") if self.wanted(ts) else (ts, "forgotten"))
        return recs

    def _forget(self, ts: TaskState) -> list[Rec]:
        if ts.state != "released" or self.wanted(ts):
            return []
        if ts.dependents:
            # a dependent, even a released one, may need us recomputed: forgetting us would
            # leave it with a dangling dependency (it would later run without its input)
            return []
        recs: list[Rec] = []
        for dts in ts.dependencies:
            dts.dependents.discard(ts)
            dts.waiters.discard(ts)
            if dts.state == "released" and not self.wanted(dts):
                recs.append((dts, "forgotten"))
            elif dts.state == "erred" and not self.wanted(dts) and \
                    all(d.state == "released" for d in dts.dependents):
                # the last task that could report this failure is gone: forget the failed
                # dependency too, or a later graph with its key would inherit the old error
                recs.append((dts, "released"))
        for dts in ts.dependents:
            dts.dependencies.discard(ts)
        ts.dependents.clear()
        del self.tasks[ts.key]
        ts.group.n_tasks -= 1
        if ts.group.n_tasks <= 0:
            self.groups.pop(ts.group.name, None)
        self.mars_assignment.pop(ts.key, None)
        self.transition(ts, "forgotten")
        return recs

    def to_memory(self, ts: TaskState) -> list[Rec]:
        """A copy of ``ts`` exists (a result, a scattered or acquired replica): memory."""
        self.transition(ts, "memory")
        recs: list[Rec] = []
        ts.waiting_on.clear()
        for dts in ts.dependents:
            dts.waiting_on.discard(ts)
            if dts.state == "waiting" and not dts.waiting_on:
                recs.append((dts, "waiting-ready"))
        if len(recs) > 1:
            recs.sort(key=lambda r: r[0].priority)  # several made ready: best priority first
        for dts in ts.dependencies:
            dts.waiters.discard(ts)
            if not dts.waiters and not dts.who_wants and dts.state in ("memory", "erred"):
                recs.append((dts, "released"))
        ts.who_wants.discard(FIRE_AND_FORGET)
        for client in ts.who_wants:
            self.send(client, KeyInMemory(ts.key, ts.typename))
        if not self.wanted(ts):
            recs.append((ts, "released"))
        return recs

    def lose(self, ts: TaskState, why: str) -> list[Rec]:
        """``ts`` was in memory and its last copy is gone: recompute, or err if it cannot."""
        self.transition(ts, "released")
        recs: list[Rec] = []
        for client in ts.who_wants:
            self.send(client, LostDataReport(ts.key))
        for dts in ts.dependents:
            if dts.state in ("processing", "waiting", "queued", "no-worker"):
                dts.waiting_on.add(ts)
                if dts.state != "waiting":  # it was ready: it waits for ts again
                    recs.append((dts, "released"))
        if ts.run_spec is None:
            if self.wanted(ts):
                exc = LostData(f"data of {ts.key!r} was scattered and is lost: {why}")
                recs += self.set_erred(ts, exc, "", str(exc))
            return recs
        if self.wanted(ts):
            recs.append((ts, "waiting"))
        return recs

    def set_erred(self, ts: TaskState, exception: Any, traceback: str, text: str,
                  blame: TaskState | None = None) -> list[Rec]:
        """Mark ``ts`` and everything depending on it erred."""
        recs: list[Rec] = []
        stack = [(ts, blame)]
        while stack:
            t, b = stack.pop()
            if t.state == "erred":
                continue
            self.transition(t, "erred", notify=True)
            t.exception = exception
            t.traceback = traceback
            t.exception_text = text
            t.exception_blame = b
            for dts in t.dependencies:
                dts.waiters.discard(t)
                # a dependency only this task needed is not needed any more, whether it is
                # in memory or still to be computed
                if not dts.waiters and not dts.who_wants and dts.state in (
                        "memory", "processing", "waiting", "queued", "no-worker"):
                    recs.append((dts, "released"))
            t.who_wants.discard(FIRE_AND_FORGET)
            if t.who_wants:
                self.report_erred(t, list(t.who_wants))
            for dts in t.dependents:
                if dts.state != "memory":
                    stack.append((dts, b or ts))
        # a dependency that erred itself on the way stays erred, whichever of its
        # dependents the walk (over sets) reached first
        return [r for r in recs if r[0].state != "erred"]

    def report_erred(self, ts: TaskState, clients: list[str]) -> None:
        """Tell ``clients`` that ``ts`` erred (itself or through a dependency)."""
        # the failure itself is ts's copy: its origin may have been released since
        origin = ts.exception_blame or ts
        for c in clients:
            self.send(c, TaskErredReport(ts.key, ts.exception, ts.traceback,
                                         ts.exception_text, origin.key))

    # ================================================================ processing
    def add_to_processing(self, ts: TaskState, ws: WorkerInfo) -> None:
        """Give ``ts`` to ``ws`` (a ``compute-task`` carrying where its dependencies are)."""
        avg = ts.group.average_duration
        est = self.unknown_task_duration if avg is None else avg
        self.transition(ts, "processing")
        ts.processing_on = ws
        ws.processing[ts] = est
        ws.occupancy += est
        if ts.resource_restrictions:
            for r, q in ts.resource_restrictions.items():
                ws.used_resources[r] = ws.used_resources.get(r, 0) + q
        self.placement.push_free(ws)
        deps = ts.dependencies
        self.send(ws.address, ComputeTask(
            ts.key, ts.run_spec, ts.priority,
            {d.key: [w.address for w in d.who_has] for d in deps} if deps else {},
            {d.key: d.nbytes for d in deps} if deps else {},
            ts.resource_restrictions or None, est))

    def exit_processing(self, ts: TaskState, notify: bool = False) -> None:
        """Undo :meth:`add_to_processing` (called by :meth:`transition` only)."""
        ws = ts.processing_on
        if ws is None:
            return
        est = ws.processing.pop(ts, 0.0)
        ws.occupancy = max(ws.occupancy - est, 0.0) if ws.processing else 0.0
        ws.executing.discard(ts)
        ws.long_running.discard(ts)
        if ts.resource_restrictions:
            for r, q in ts.resource_restrictions.items():
                ws.used_resources[r] = ws.used_resources.get(r, 0) - q
        ts.processing_on = None
        ts.stealing = False
        if ws.address in self.workers:
            if notify:
                self.send(ws.address, FreeKeys([ts.key]))
            self.placement.open_slots(ws)

    # ================================================================ replicas
    def add_replica(self, ts: TaskState, ws: WorkerInfo, nbytes: int) -> None:
        """``ws`` holds a copy of ``ts``'s result."""
        if nbytes >= 0 and nbytes != ts.nbytes:
            # a new size (a result reported again): the workers holding it account the change
            delta = nbytes - max(ts.nbytes, 0)
            for holder in ts.who_has:
                holder.nbytes += delta
            ts.nbytes = nbytes
        if ws not in ts.who_has:
            ts.who_has.add(ws)
            ws.has_what[ts] = None
            ws.nbytes += max(ts.nbytes, 0)

    def drop_replica(self, ts: TaskState, ws: WorkerInfo, why: str) -> list[Rec]:
        """``ws`` no longer holds ``ts``'s result; if that was the last copy of a result in
        memory, it is lost (:meth:`lose`, saying ``why``)."""
        self.remove_replica(ts, ws)
        if not ts.who_has and ts.state == "memory":
            return self.lose(ts, why)
        return []

    def remove_replica(self, ts: TaskState, ws: WorkerInfo) -> None:
        """``ws`` no longer holds ``ts``'s result."""
        if ws in ts.who_has:
            ts.who_has.discard(ws)
            ws.has_what.pop(ts, None)
            ws.nbytes -= max(ts.nbytes, 0)
