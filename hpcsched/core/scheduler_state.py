"""The scheduler as a pure state machine: events in, ``Send`` commands out.

Rules of this file:

* No sockets, threads, MPI or clocks: every event carries ``now``.
* ``handle(event) -> list[Send]``; messages to one peer are batched by the
  server, not here.
* Task states: released, waiting, queued, no-worker, processing, memory,
  erred (and forgotten, i.e. deleted). Transitions run from a LIFO stack of
  recommendations so that work made ready by a finished task is handled first.
* Decisions are delegated to :mod:`hpcsched.core.policies` (which worker) and
  :mod:`hpcsched.core.order` (static priorities).
* :meth:`SchedulerState.validate` checks every invariant; tests call it after
  each step.

Priorities are ``(generation, -user_priority, static_priority)``: every task of
an earlier ``submit``/``map``/``compute`` call comes before those of a later
one (seed 000, "first-come-first-served, coarsely").
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
from collections.abc import Iterable
from typing import Any

from hpcsched.core import events as ev
from hpcsched.core import policies
from hpcsched.core.graph import key_split

Key = Any


class KilledWorker(RuntimeError):
    """A task was running on workers that died, ``allowed-failures`` times."""


class LostData(RuntimeError):
    """Data that cannot be recomputed (scattered) was lost with its worker."""


class TaskGroup:
    __slots__ = ("name", "n_tasks", "dep_keys", "duration_total", "n_durations",
                 "last_worker", "last_worker_tasks_left", "nbytes_total")

    def __init__(self, name: str):
        self.name = name
        self.n_tasks = 0
        self.dep_keys: set = set()  # distinct dependency keys, capped at a few
        self.duration_total = 0.0
        self.n_durations = 0
        self.last_worker: WorkerInfo | None = None
        self.last_worker_tasks_left = 0
        self.nbytes_total = 0

    @property
    def average_duration(self) -> float | None:
        return self.duration_total / self.n_durations if self.n_durations else None

    def __repr__(self) -> str:
        return f"<TaskGroup {self.name}: {self.n_tasks} tasks>"


class TaskState:
    __slots__ = (
        "key", "group", "state", "priority", "run_spec", "dependencies", "dependents",
        "waiting_on", "waiters", "who_wants", "who_has", "processing_on", "nbytes", "typename",
        "retries", "suspicious", "erred_on", "exception", "traceback", "exception_text",
        "exception_blame", "resource_restrictions", "worker_restrictions", "loose_restrictions",
        "queued_seq", "stealing", "rootish_cache",
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
        self.erred_on: list[str] = []
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

    def __repr__(self) -> str:
        return f"<TaskState {self.key!r} {self.state}>"

    def __lt__(self, other: TaskState) -> bool:
        return self.priority < other.priority


class WorkerInfo:
    __slots__ = ("address", "name", "host", "nthreads", "memory_limit", "resources",
                 "used_resources", "processing", "executing", "has_what", "nbytes", "occupancy",
                 "status", "last_seen", "metrics", "pid", "heap_version")

    def __init__(self, address: str, nthreads: int, memory_limit: int = 0, name: str = "",
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
        self.has_what: dict[TaskState, None] = {}
        self.nbytes = 0
        self.occupancy = 0.0
        self.status = "running"  # running | closing_gracefully
        self.last_seen = now
        self.metrics: dict = {}
        self.pid = pid
        self.heap_version = 0

    def __repr__(self) -> str:
        return f"<WorkerInfo {self.address} {self.status} processing={len(self.processing)}>"

    def info(self) -> dict:
        return {
            "address": self.address, "name": self.name, "host": self.host,
            "nthreads": self.nthreads, "memory_limit": self.memory_limit,
            "resources": dict(self.resources), "nbytes": self.nbytes,
            "processing": len(self.processing), "executing": len(self.executing),
            "n_keys": len(self.has_what), "occupancy": self.occupancy, "status": self.status,
            "pid": self.pid, "metrics": dict(self.metrics), "last_seen": self.last_seen,
        }


class SchedulerState:
    def __init__(
        self,
        *,
        worker_saturation: float = 1.1,
        rootish_policy: str = "queue",
        rootish_factor: float = 2,
        rootish_max_deps: int = 5,
        allowed_failures: int = 3,
        unknown_task_duration: float = 0.5,
        bandwidth: float = 100e6,
        work_stealing: bool = True,
        worker_ttl: float | None = None,
        retire_timeout: float = 120.0,
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
        self.unrunnable: dict[TaskState, None] = {}
        self._free_heap: list[tuple[float, int, int, WorkerInfo]] = []  # not-full workers
        self._seq = itertools.count()
        self._out: list[ev.Send] = []
        self._slots_opened: dict[WorkerInfo, None] = {}
        self.retiring: dict[str, dict] = {}  # address -> {"request_id", "requester", "start", "close", "sent"}
        self.scatters: dict[str, tuple[str, set]] = {}
        self.mars_assignment: dict[Key, str] = {}
        self._steal_targets: dict[Key, WorkerInfo] = {}
        self.transition_log: list[tuple] = []  # (key, start, finish) -- only when log_transitions
        self.log_transitions = False
        self._deferred_ready: list[TaskState] | None = None  # see _update_graph
        # running workers, rebuilt only when a worker joins, leaves or changes status: building
        # it per decision made every task cost O(workers)
        self._running_cache: list[WorkerInfo] | None = None

    # ================================================================ dispatch
    def handle(self, event: Any) -> list[ev.Send]:
        handler = self._handlers[type(event)]
        handler(self, event)
        self._fill_slots()
        out, self._out = self._out, []
        return out

    def handle_many(self, events: Iterable[Any]) -> list[ev.Send]:
        out: list[ev.Send] = []
        for e in events:
            out.extend(self.handle(e))
        return out

    def _send(self, to: str, msg: dict) -> None:
        self._out.append(ev.Send(to, msg))

    # ================================================================ workers
    def _add_worker(self, e: ev.AddWorker) -> None:
        if e.address in self.workers:
            return
        ws = WorkerInfo(e.address, e.nthreads, e.memory_limit, e.name, e.host, e.resources,
                        e.pid, e.now)
        self.workers[ws.address] = ws
        self._running_cache = None
        self.total_nthreads += ws.nthreads
        self._push_free(ws)
        recs: list = []
        for key, nbytes in (e.keys or {}).items():
            ts = self.tasks.get(key)
            if ts is None:
                self._send(ws.address, {"op": "free-keys", "keys": [key]})
                continue
            self._add_replica(ts, ws, nbytes)
            if ts.state != "memory":
                recs += self._to_memory_from_replica(ts)
        # rootish status depends on total threads: recompute lazily
        for ts in list(self.unrunnable):
            recs.append((ts, "waiting-ready"))
        self._transitions(recs)
        self._slots_opened[ws] = None

    def _remove_worker(self, e: ev.RemoveWorker) -> None:
        ws = self.workers.pop(e.address, None)
        if ws is None:
            return
        self.total_nthreads -= ws.nthreads
        graceful = ws.status == "closing_gracefully"
        ws.status = "closed"  # objects that still point to it (a TaskGroup's last worker) skip it
        self._running_cache = None
        self.retiring.pop(ws.address, None)
        recs: list = []
        for ts in list(ws.processing):
            was_executing = ts in ws.executing
            self._exit_processing(ts)
            ts.state = "released"
            if was_executing and not graceful:
                ts.suspicious += 1
                ts.erred_on.append(ws.address)
                if ts.suspicious >= self.allowed_failures:
                    exc = KilledWorker(
                        f"task {ts.key!r} was running on {ts.suspicious} workers that died "
                        f"({', '.join(ts.erred_on)}); it is marked as erred so that it does not "
                        f"kill the whole cluster. The last one: {e.reason or 'connection lost'}")
                    recs += self._set_erred(ts, exc, "", str(exc))
                    continue
            if self._wanted(ts):
                recs.append((ts, "waiting"))
        for ts in list(ws.has_what):
            self._remove_replica(ts, ws)
            if not ts.who_has and ts.state == "memory":
                recs += self._lose(ts, f"worker {ws.address} left ({e.reason or 'unknown reason'})")
        self._transitions(recs)

    def _lose(self, ts: TaskState, why: str) -> list:
        """``ts`` was in memory and its last copy is gone: recompute, or err if it cannot."""
        ts.state = "released"
        recs: list = []
        for client in ts.who_wants:
            self._send(client, {"op": "lost-data", "key": ts.key})
        for dts in ts.dependents:
            if dts.state in ("processing", "waiting", "queued", "no-worker"):
                dts.waiting_on.add(ts)
                if dts.state == "processing":
                    recs.append((dts, "released"))
        if ts.run_spec is None:
            if self._wanted(ts):
                exc = LostData(f"data of {ts.key!r} was scattered and is lost: {why}")
                recs += self._set_erred(ts, exc, "", str(exc))
            return recs
        if self._wanted(ts):
            recs.append((ts, "waiting"))
        return recs

    def _heartbeat(self, e: ev.Heartbeat) -> None:
        ws = self.workers.get(e.worker)
        if ws is not None:
            ws.last_seen = e.now
            ws.metrics = e.metrics
            bw = e.metrics.get("bandwidth") if isinstance(e.metrics, dict) else None
            if isinstance(bw, (int, float)) and bw > 0:
                # measured peer-to-peer transfer speed: a moving average over reports
                self.bandwidth = 0.8 * self.bandwidth + 0.2 * float(bw)

    # ================================================================ clients
    def _add_client(self, e: ev.AddClient) -> None:
        self.clients.add(e.client)

    def _remove_client(self, e: ev.RemoveClient) -> None:
        self.clients.discard(e.client)
        keys = [ts.key for ts in self.tasks.values() if e.client in ts.who_wants]
        self._client_releases(ev.ClientReleasesKeys(e.client, keys, e.now))

    def _update_graph(self, e: ev.UpdateGraph) -> None:
        self.generation += 1
        new: list[TaskState] = []
        recs: list = []
        missing: dict[TaskState, Key] = {}
        for key, spec in e.tasks.items():
            ts = self.tasks.get(key)
            if ts is not None:
                if ts.state == "erred" and ts.exception_blame is None:
                    # re-submission of a failed task runs it again
                    ts.exception = None
                    ts.traceback = ts.exception_text = ""
                    ts.state = "released"
                    ts.run_spec = spec.get("run_spec", ts.run_spec)
                    ts.suspicious = 0
                    ts.erred_on = []
                    new.append(ts)
                continue
            name = key_split(key)
            tg = self.groups.get(name)
            if tg is None:
                tg = self.groups[name] = TaskGroup(name)
            ts = self.tasks[key] = TaskState(key, spec.get("run_spec"), tg)
            tg.n_tasks += 1
            new.append(ts)
        for ts in new:
            spec = e.tasks[ts.key]
            for dk in spec.get("deps", ()):
                dts = self.tasks.get(dk)
                if dts is None:
                    missing[ts] = dk
                    continue
                ts.dependencies.add(dts)
                dts.dependents.add(ts)
                if len(ts.group.dep_keys) < 64 and dts.group is not ts.group:
                    ts.group.dep_keys.add(dk)
            ts.retries = int(e.retries.get(ts.key, 0)) if e.retries else 0
            if e.resources:
                ts.resource_restrictions = dict(e.resources)
            if e.workers:
                ts.worker_restrictions = set(e.workers)
                ts.loose_restrictions = e.allow_other_workers
        # static priorities for the new part of the graph
        static = e.static_priorities
        if static is None:
            if len(new) > 1:
                from hpcsched.core.order import order

                keys = {ts.key for ts in new}
                static = order({ts.key: [d.key for d in ts.dependencies if d.key in keys]
                                for ts in new})
            else:
                static = {}
        for i, ts in enumerate(new):
            ts.priority = (self.generation, -e.priority, static.get(ts.key, i))
        for key in e.keys:
            ts = self.tasks.get(key)
            if ts is not None:
                ts.who_wants.add(e.client)
        for ts, dk in missing.items():
            exc = KeyError(f"task {ts.key!r} depends on {dk!r}, which the scheduler does not "
                           "hold (was its future released?)")
            recs += self._set_erred(ts, exc, "", str(exc))
        if self.rootish_policy == "mars" and self.workers:
            self._mars_assign(new)
        # existing wanted keys: report their state to the new client
        for key in e.keys:
            ts = self.tasks.get(key)
            if ts is not None and ts not in missing:
                recs += self._report_or_wake(ts, e.client)
        new_wanted = sorted((ts for ts in new if ts.state == "released" and self._wanted(ts)),
                            key=lambda t: t.priority, reverse=True)
        recs += [(ts, "waiting") for ts in new_wanted]
        # tasks made ready by this graph go to workers (or the queue) in priority order, not
        # in the order the walk down from the requested keys reaches them: with queuing the
        # first ones take the free slots, with co-assignment consecutive ones share a worker
        self._deferred_ready = []
        try:
            self._transitions(recs)
        finally:
            ready, self._deferred_ready = self._deferred_ready, None
        ready.sort(key=lambda t: t.priority)
        self._transitions([(ts, "waiting-ready") for ts in ready])
        # parts of the graph no requested key needs (a dask graph is sent whole) go at once
        self._transitions([(ts, "forgotten") for ts in new
                           if ts.state == "released" and not self._wanted(ts)])

    def _update_graph_gc_paused(self, e: ev.UpdateGraph) -> None:
        """A graph arrives as many new objects and no garbage: the cyclic collector's
        full passes during the insertion (several, over a heap that grows with the graph)
        find nothing to free and cost ~15 us per task on a 100,000-task graph."""
        if len(e.tasks) < 1000 or not gc.isenabled():
            self._update_graph(e)
            return
        gc.disable()
        try:
            self._update_graph(e)
        finally:
            gc.enable()

    def _mars_assign(self, new: list[TaskState]) -> None:
        from hpcsched.core.mars import assign_initial

        deps = {ts.key: [d.key for d in ts.dependencies] for ts in new}
        running = [ws.address for ws in self.workers.values() if ws.status == "running"]
        if running:
            self.mars_assignment.update(assign_initial(deps, running))

    def _report_or_wake(self, ts: TaskState, client: str) -> list:
        if ts.state == "memory":
            self._send(client, {"op": "key-in-memory", "key": ts.key, "type": ts.typename})
        elif ts.state == "erred":
            self._report_erred(ts, [client])
        elif ts.state == "released":
            return [(ts, "waiting")]
        return []

    def _client_desires(self, e: ev.ClientDesiresKeys) -> None:
        recs: list = []
        for key in e.keys:
            ts = self.tasks.get(key)
            if ts is None:
                self._send(e.client, {"op": "cancelled-keys", "keys": [key]})
                continue
            ts.who_wants.add(e.client)
            recs += self._report_or_wake(ts, e.client)
        self._transitions(recs)

    def _client_releases(self, e: ev.ClientReleasesKeys) -> None:
        recs: list = []
        for key in e.keys:
            ts = self.tasks.get(key)
            if ts is None or e.client not in ts.who_wants:
                continue
            ts.who_wants.discard(e.client)
            if not self._wanted(ts):
                recs.append((ts, "released"))
        self._transitions(recs)

    def _cancel(self, e: ev.CancelKeys) -> None:
        recs: list = []
        cancelled = []
        for key in e.keys:
            ts = self.tasks.get(key)
            if ts is None:
                continue
            cancelled.append(key)
            clients = set(ts.who_wants)
            ts.who_wants.clear()
            for c in clients | {e.client}:
                self._send(c, {"op": "cancelled-keys", "keys": [key]})
            # dependents cannot run any more: cancel them too
            stack = list(ts.dependents)
            while stack:
                dts = stack.pop()
                if dts.who_wants:
                    for c in dts.who_wants:
                        self._send(c, {"op": "cancelled-keys", "keys": [dts.key]})
                    dts.who_wants.clear()
                    stack.extend(dts.dependents)
                if dts.state not in ("memory", "released"):
                    recs.append((dts, "released"))
            recs.append((ts, "released"))
        self._transitions(recs)

    def _scatter(self, e: ev.ScatterData) -> None:
        running = [ws for ws in self.workers.values() if ws.status == "running"]
        if e.workers:
            allowed = set(e.workers)
            running = [ws for ws in running
                       if ws.address in allowed or ws.name in allowed or ws.host in allowed]
        if not running:
            self._send(e.client, {"op": "scatter-reply", "scatter_id": e.scatter_id,
                                  "error": "no running worker to scatter to"})
            return
        per_worker: dict[WorkerInfo, dict] = {}
        if e.broadcast:
            for ws in running:
                per_worker[ws] = dict(e.data)
        else:
            running.sort(key=lambda ws: ws.nbytes)
            for i, (key, value) in enumerate(e.data.items()):
                ws = running[i % len(running)]
                per_worker.setdefault(ws, {})[key] = value
        for key in e.data:
            ts = self.tasks.get(key)
            if ts is None:
                name = key_split(key)
                tg = self.groups.get(name) or self.groups.setdefault(name, TaskGroup(name))
                ts = self.tasks[key] = TaskState(key, None, tg)
                tg.n_tasks += 1
                ts.priority = (self.generation, 0, 0)
            ts.who_wants.add(e.client)
            ts.nbytes = int(e.nbytes.get(key, 0))
        pending = {(ws.address, key) for ws, d in per_worker.items() for key in d}
        self.scatters[e.scatter_id] = (e.client, pending)
        for ws, d in per_worker.items():
            self._send(ws.address, {"op": "update-data", "data": d, "scatter_id": e.scatter_id})

    def _add_keys(self, e: ev.AddKeys) -> None:
        ws = self.workers.get(e.worker)
        if ws is None:
            return
        recs: list = []
        for key, nbytes in e.keys.items():
            ts = self.tasks.get(key)
            if ts is None or (ts.state not in ("memory", "released") and ts.run_spec is not None):
                if ts is None or ts.state in ("erred",):
                    self._send(ws.address, {"op": "free-keys", "keys": [key]})
                    continue
            self._add_replica(ts, ws, nbytes)
            if ts.state != "memory":
                recs += self._to_memory_from_replica(ts)
        if e.scatter_id in self.scatters:
            client, pending = self.scatters[e.scatter_id]
            pending.difference_update((ws.address, k) for k in e.keys)
            if not pending:
                del self.scatters[e.scatter_id]
                self._send(client, {"op": "scatter-reply", "scatter_id": e.scatter_id,
                                    "error": None})
        self._transitions(recs)
        if ws.address in self.retiring:
            self._progress_retirement(ws, e.now)
        for address in list(self.retiring):
            if address != ws.address and address in self.workers:
                self._progress_retirement(self.workers[address], e.now)

    def _to_memory_from_replica(self, ts: TaskState) -> list:
        """A copy of ``ts`` appeared (scatter, acquired replica) while it was not in memory."""
        recs: list = []
        if ts.state == "processing":
            self._exit_processing(ts)
        elif ts.state == "queued":
            self.n_queued -= 1
        elif ts.state == "no-worker":
            self.unrunnable.pop(ts, None)
        ts.state = "memory"
        recs += self._after_memory(ts)
        return recs

    def _release_worker_data(self, e: ev.ReleaseWorkerData) -> None:
        ws = self.workers.get(e.worker)
        if ws is None:
            return
        recs: list = []
        for key in e.keys:
            ts = self.tasks.get(key)
            if ts is not None and ws in ts.who_has:
                self._remove_replica(ts, ws)
                if not ts.who_has and ts.state == "memory":
                    recs += self._lose(ts, f"worker {ws.address} dropped it")
        self._transitions(recs)

    # ================================================================ task results
    def _task_started(self, e: ev.TaskStarted) -> None:
        ts = self.tasks.get(e.key)
        ws = self.workers.get(e.worker)
        if ts is not None and ws is not None and ts.processing_on is ws:
            ws.executing.add(ts)

    def _task_finished(self, e: ev.TaskFinished) -> None:
        ts = self.tasks.get(e.key)
        ws = self.workers.get(e.worker)
        if ws is None:
            return
        if ts is None or ts.state in ("released", "erred", "waiting", "no-worker", "queued"):
            # a result nobody asked for any more (released, cancelled, or recomputed elsewhere)
            if ts is None or not self._wanted(ts) or ts.state == "erred":
                self._send(ws.address, {"op": "free-keys", "keys": [e.key]})
                return
        duration = max(e.stop - e.start, 0.0)
        tg = ts.group
        tg.duration_total += duration
        tg.n_durations += 1
        ts.typename = e.typename
        if ts.state == "memory":
            self._add_replica(ts, ws, e.nbytes)
            return
        if ts.state == "processing":
            self._exit_processing(ts)
        elif ts.state == "queued":
            self.n_queued -= 1
        elif ts.state == "no-worker":
            self.unrunnable.pop(ts, None)
        elif ts.state == "waiting":
            for dts in ts.dependencies:
                dts.waiters.discard(ts)
        self._add_replica(ts, ws, e.nbytes)
        tg.nbytes_total += max(e.nbytes, 0)
        ts.state = "memory"
        self._log(ts, "processing", "memory")
        self._transitions(self._after_memory(ts))
        if ws.address in self.retiring:
            self._progress_retirement(ws, e.now)

    def _after_memory(self, ts: TaskState) -> list:
        recs: list = []
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
        for client in ts.who_wants:
            self._send(client, {"op": "key-in-memory", "key": ts.key, "type": ts.typename})
        if not self._wanted(ts):
            recs.append((ts, "released"))
        return recs

    def _task_erred(self, e: ev.TaskErred) -> None:
        ts = self.tasks.get(e.key)
        ws = self.workers.get(e.worker)
        if ts is None or ws is None or ts.state != "processing" or ts.processing_on is not ws:
            return
        self._exit_processing(ts)
        if ts.retries > 0:
            ts.retries -= 1
            ts.state = "released"
            self._transitions([(ts, "waiting")])
            return
        ts.state = "released"
        self._transitions(self._set_erred(ts, e.exception, e.traceback, e.exception_text))

    def _set_erred(self, ts: TaskState, exception: Any, traceback: str, text: str,
                   blame: TaskState | None = None) -> list:
        """Mark ``ts`` (not processing) and everything depending on it erred."""
        recs: list = []
        stack = [(ts, blame)]
        while stack:
            t, b = stack.pop()
            if t.state == "erred":
                continue
            self._leave_waiting_states(t)
            t.state = "erred"
            t.exception = exception
            t.traceback = traceback
            t.exception_text = text
            t.exception_blame = b
            for dts in t.dependencies:
                dts.waiters.discard(t)
                if not dts.waiters and not dts.who_wants and dts.state == "memory":
                    recs.append((dts, "released"))
            if t.who_wants:
                self._report_erred(t, list(t.who_wants))
            for dts in t.dependents:
                if dts.state == "processing":
                    self._exit_processing(dts, notify=True)
                    dts.state = "released"
                if dts.state != "memory":
                    stack.append((dts, b or ts))
        return recs

    def _leave_waiting_states(self, ts: TaskState) -> None:
        if ts.state == "queued":
            self.n_queued -= 1
        elif ts.state == "no-worker":
            self.unrunnable.pop(ts, None)
        elif ts.state == "processing":
            self._exit_processing(ts, notify=True)

    def _report_erred(self, ts: TaskState, clients: list[str]) -> None:
        origin = ts.exception_blame or ts
        for c in clients:
            self._send(c, {"op": "task-erred", "key": ts.key, "exception": origin.exception,
                           "traceback": origin.traceback, "exception_text": origin.exception_text,
                           "origin": origin.key})

    def _missing_data(self, e: ev.MissingData) -> None:
        ts = self.tasks.get(e.key)
        if ts is None:
            return
        errant = self.workers.get(e.errant_worker)
        recs: list = []
        if errant is not None and errant in ts.who_has:
            self._remove_replica(ts, errant)
        if ts.state == "memory" and not ts.who_has:
            recs += self._lose(ts, f"worker {e.errant_worker} did not have it")
        elif ts.state == "memory" and e.worker in self.workers:
            self._send(e.worker, {"op": "refresh-who-has",
                                  "who_has": {ts.key: [w.address for w in ts.who_has]}})
        self._transitions(recs)

    # ================================================================ transitions
    def _wanted(self, ts: TaskState) -> bool:
        return bool(ts.who_wants or ts.waiters)

    def _log(self, ts: TaskState, start: str, finish: str) -> None:
        if self.log_transitions:
            self.transition_log.append((ts.key, start, finish))

    def _transitions(self, recs: list) -> None:
        """Run recommendations, LIFO: (task, "waiting" | "waiting-ready" | "released")."""
        stack = recs[::-1] if len(recs) > 1 else list(recs)
        while stack:
            ts, finish = stack.pop()
            if ts.key not in self.tasks or self.tasks[ts.key] is not ts:
                continue
            if finish == "waiting":
                new = self._released_to_waiting(ts)
            elif finish == "waiting-ready":
                if self._deferred_ready is not None:
                    self._deferred_ready.append(ts)
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

    def _released_to_waiting(self, ts: TaskState) -> list:
        if ts.state != "released" or not self._wanted(ts):
            return []
        if ts.run_spec is None:
            exc = LostData(f"{ts.key!r} has no task to compute it (scattered data that was lost)")
            return self._set_erred(ts, exc, "", str(exc))
        self._log(ts, "released", "waiting")
        ts.state = "waiting"
        recs: list = []
        ts.waiting_on = set()
        for dts in ts.dependencies:
            dts.waiters.add(ts)
            if dts.state == "memory":
                continue
            if dts.state == "erred":
                return self._set_erred(ts, dts.exception, dts.traceback, dts.exception_text,
                                       dts.exception_blame or dts)
            ts.waiting_on.add(dts)
            if dts.state == "released":
                recs.append((dts, "waiting"))
        if not ts.waiting_on:
            recs.append((ts, "waiting-ready"))
        return recs

    def _is_rootish(self, ts: TaskState) -> bool:
        return policies.is_rootish(ts, self.total_nthreads, self.rootish_factor,
                                   self.rootish_max_deps)

    def _ready(self, ts: TaskState) -> list:
        """All dependencies are in memory: processing, queued or no-worker."""
        if ts.state == "no-worker":
            self.unrunnable.pop(ts, None)
            ts.state = "waiting"
        ws = self._decide_worker(ts)
        if ws is None:
            if self.rootish_policy == "queue" and self.workers and self._is_rootish(ts) \
                    and self._any_running():
                ts.state = "queued"
                ts.queued_seq = next(self._seq)
                heapq.heappush(self.queued, (ts.priority, ts.queued_seq, ts))
                self.n_queued += 1
                self._log(ts, "waiting", "queued")
            else:
                ts.state = "no-worker"
                self.unrunnable[ts] = None
                self._log(ts, "waiting", "no-worker")
            return []
        self._add_to_processing(ts, ws)
        return []

    def _any_running(self) -> bool:
        return bool(self._running())

    def _running(self) -> list[WorkerInfo]:
        """Running workers (cached; callers must not modify the list)."""
        r = self._running_cache
        if r is None:
            r = self._running_cache = [ws for ws in self.workers.values()
                                       if ws.status == "running"]
        return r

    def _decide_worker(self, ts: TaskState) -> WorkerInfo | None:
        if not self.workers:
            return None
        valid = policies.valid_workers(ts, self.workers.values())
        if valid is not None and not valid and ts.loose_restrictions:
            valid = None
        if valid is None and self._is_rootish(ts):
            if self.rootish_policy == "queue":
                return self._pop_free_worker()
            if self.rootish_policy == "mars":
                addr = self.mars_assignment.get(ts.key)
                ws = self.workers.get(addr) if addr else None
                if ws is not None and ws.status == "running":
                    return ws
            return policies.co_assign_worker(ts, ts.group, self._running(), self.total_nthreads,
                                             self._least_busy())
        return policies.decide_worker(ts, self._running(), valid, self.bandwidth, self.rng)

    def _least_busy(self) -> WorkerInfo | None:
        running = self._running()
        if not running:
            return None
        if len(running) > policies.SAMPLE_LIMIT:
            running = self.rng.sample(running, policies.SAMPLE_LIMIT)
        return min(running, key=lambda ws: (len(ws.processing) / ws.nthreads, ws.nbytes))

    # ---------------------------------------------------------------- free-worker heap
    def _push_free(self, ws: WorkerInfo) -> None:
        if ws.status != "running" or policies.worker_full(ws, self.worker_saturation):
            return
        ws.heap_version += 1
        heapq.heappush(self._free_heap,
                       (len(ws.processing) / ws.nthreads, next(self._seq), ws.heap_version, ws))

    def _pop_free_worker(self) -> WorkerInfo | None:
        """The least-busy running worker that is not full, or None (lazy heap)."""
        heap = self._free_heap
        while heap:
            _, _, version, ws = heap[0]
            if version != ws.heap_version or ws.address not in self.workers \
                    or self.workers[ws.address] is not ws or ws.status != "running" \
                    or policies.worker_full(ws, self.worker_saturation):
                heapq.heappop(heap)
                continue
            return ws
        return None

    def _estimate(self, ts: TaskState) -> float:
        avg = ts.group.average_duration
        return self.unknown_task_duration if avg is None else avg

    def _add_to_processing(self, ts: TaskState, ws: WorkerInfo) -> None:
        est = self._estimate(ts)
        ts.state = "processing"
        ts.processing_on = ws
        ws.processing[ts] = est
        ws.occupancy += est
        if ts.resource_restrictions:
            for r, q in ts.resource_restrictions.items():
                ws.used_resources[r] = ws.used_resources.get(r, 0) + q
        self._push_free(ws)
        self._log(ts, "waiting", "processing")
        msg = {"op": "compute-task", "key": ts.key, "run_spec": ts.run_spec,
               "priority": ts.priority, "duration": est}
        if ts.dependencies:
            msg["who_has"] = {d.key: [w.address for w in d.who_has] for d in ts.dependencies}
            msg["nbytes"] = {d.key: d.nbytes for d in ts.dependencies}
        if ts.resource_restrictions:
            msg["resource_restrictions"] = ts.resource_restrictions
        self._send(ws.address, msg)

    def _exit_processing(self, ts: TaskState, notify: bool = False) -> None:
        ws = ts.processing_on
        if ws is None:
            return
        est = ws.processing.pop(ts, 0.0)
        ws.occupancy = max(ws.occupancy - est, 0.0) if ws.processing else 0.0
        ws.executing.discard(ts)
        if ts.resource_restrictions:
            for r, q in ts.resource_restrictions.items():
                ws.used_resources[r] = ws.used_resources.get(r, 0) - q
        ts.processing_on = None
        ts.stealing = False
        if notify and ws.address in self.workers:
            self._send(ws.address, {"op": "free-keys", "keys": [ts.key]})
        if ws.address in self.workers:
            self._slots_opened[ws] = None
            self._push_free(ws)

    def _fill_slots(self) -> None:
        """Give queued root-ish tasks to workers whose slots opened, best priority first."""
        if not self._slots_opened:
            return
        opened, self._slots_opened = self._slots_opened, {}
        if self.unrunnable:
            self._transitions([(ts, "waiting-ready") for ts in list(self.unrunnable)])
        if not self.n_queued:
            return
        for ws in opened:
            if ws.address not in self.workers or ws.status != "running":
                continue
            while self.n_queued and not policies.worker_full(ws, self.worker_saturation):
                ts = self._pop_queued()
                if ts is None:
                    break
                self._add_to_processing(ts, ws)

    def _pop_queued(self) -> TaskState | None:
        while self.queued:
            _, seq, ts = heapq.heappop(self.queued)
            if ts.state == "queued" and ts.queued_seq == seq and self.tasks.get(ts.key) is ts:
                self.n_queued -= 1
                return ts
        return None

    def _to_released(self, ts: TaskState) -> list:
        start = ts.state
        if start == "released":
            return [] if self._wanted(ts) else [(ts, "forgotten")]
        recs: list = []
        if start == "processing":
            self._exit_processing(ts, notify=True)
        elif start == "queued":
            self.n_queued -= 1
        elif start == "no-worker":
            self.unrunnable.pop(ts, None)
        elif start == "memory":
            for ws in list(ts.who_has):
                self._send(ws.address, {"op": "free-keys", "keys": [ts.key]})
                self._remove_replica(ts, ws)
            for dts in ts.dependents:
                if dts.state in ("waiting", "processing", "queued", "no-worker"):
                    dts.waiting_on.add(ts)
                    if dts.state != "waiting":
                        recs.append((dts, "released"))
        elif start == "erred":
            ts.exception = None
            ts.traceback = ts.exception_text = ""
            ts.exception_blame = None
        if start in ("waiting", "processing", "queued", "no-worker"):
            for dts in ts.dependencies:
                dts.waiters.discard(ts)
                if not self._wanted(dts) and dts.state in ("memory", "erred", "waiting",
                                                           "queued", "no-worker", "processing"):
                    recs.append((dts, "released"))
            ts.waiting_on.clear()
        self._log(ts, start, "released")
        ts.state = "released"
        if self._wanted(ts):
            recs.append((ts, "waiting"))
        else:
            recs.append((ts, "forgotten"))
        return recs

    def _forget(self, ts: TaskState) -> list:
        if ts.state != "released" or self._wanted(ts):
            return []
        if ts.dependents:
            # a dependent, even a released one, may need us recomputed: forgetting us would
            # leave it with a dangling dependency (it would later run without its input)
            return []
        recs: list = []
        for dts in ts.dependencies:
            dts.dependents.discard(ts)
            dts.waiters.discard(ts)
            if dts.state == "released" and not self._wanted(dts):
                recs.append((dts, "forgotten"))
            elif dts.state == "erred" and not self._wanted(dts) and \
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
        self._log(ts, "released", "forgotten")
        return recs

    # ---------------------------------------------------------------- replicas
    def _add_replica(self, ts: TaskState, ws: WorkerInfo, nbytes: int) -> None:
        if nbytes >= 0:
            ts.nbytes = nbytes
        if ws not in ts.who_has:
            ts.who_has.add(ws)
            ws.has_what[ts] = None
            ws.nbytes += max(ts.nbytes, 0)

    def _remove_replica(self, ts: TaskState, ws: WorkerInfo) -> None:
        if ws in ts.who_has:
            ts.who_has.discard(ws)
            ws.has_what.pop(ts, None)
            ws.nbytes -= max(ts.nbytes, 0)

    # ================================================================ stealing
    def _steal_response(self, e: ev.StealResponse) -> None:
        ts = self.tasks.get(e.key)
        victim = self.workers.get(e.worker)
        if ts is None or victim is None or not ts.stealing:
            return
        thief = self._steal_targets.pop(ts.key, None)
        ts.stealing = False
        if ts.state != "processing" or ts.processing_on is not victim:
            return
        if e.state in ("released", "waiting", "fetch", "flight", "ready", "missing"):
            # the victim dropped it: run it on the thief (if still around)
            self._exit_processing(ts)
            if thief is not None and thief.address in self.workers and thief.status == "running":
                self._add_to_processing(ts, thief)
            else:
                ts.state = "waiting"
                self._transitions([(ts, "waiting-ready")])

    def _tick(self, e: ev.Tick) -> None:
        if self.worker_ttl:
            for ws in list(self.workers.values()):
                if e.now - ws.last_seen > self.worker_ttl:
                    self._remove_worker(ev.RemoveWorker(
                        ws.address, f"no heartbeat for {e.now - ws.last_seen:.0f}s", e.now))
        for address in list(self.retiring):
            ws = self.workers.get(address)
            if ws is not None:
                self._progress_retirement(ws, e.now)
        if self.work_stealing and len(self.workers) > 1:
            for ts, victim, thief in policies.plan_steals(self.workers.values(), self.bandwidth):
                ts.stealing = True
                self._steal_targets[ts.key] = thief
                self._send(victim.address, {"op": "steal-request", "key": ts.key})

    # ================================================================ retirement
    def _retire_workers(self, e: ev.RetireWorkers) -> None:
        for address in e.workers:
            ws = self.workers.get(address)
            if ws is None:
                continue
            ws.status = "closing_gracefully"
            self._running_cache = None
            self.retiring[address] = {"request_id": e.request_id, "requester": e.requester,
                                      "start": e.now, "close": e.close, "sent": set(),
                                      "workers": list(e.workers)}
        # tasks not yet started on retiring workers go elsewhere
        recs: list = []
        for address in e.workers:
            ws = self.workers.get(address)
            if ws is None:
                continue
            for ts in list(ws.processing):
                if ts not in ws.executing:
                    self._exit_processing(ts, notify=True)
                    ts.state = "waiting"
                    recs.append((ts, "waiting-ready"))
        self._transitions(recs)
        pending = self._pending_retirements(e.request_id)
        for address in e.workers:
            ws = self.workers.get(address)
            if ws is not None:
                self._progress_retirement(ws, e.now)
        if not pending or not any(a in self.workers for a in e.workers):
            self._finish_request(e.request_id, e.requester, e.workers)

    def _pending_retirements(self, request_id: str) -> list[str]:
        return [a for a, r in self.retiring.items() if r["request_id"] == request_id]

    def _progress_retirement(self, ws: WorkerInfo, now: float) -> None:
        r = self.retiring.get(ws.address)
        if r is None:
            return
        survivors = [w for w in self.workers.values() if w.status == "running"]
        unique = [ts for ts in ws.has_what if len(ts.who_has) == 1]
        timed_out = now - r["start"] > self.retire_timeout
        if unique and not survivors and not timed_out:
            # nowhere to put the data: give up retiring this one (it keeps the results)
            ws.status = "running"
            self._running_cache = None
            del self.retiring[ws.address]
            self._push_free(ws)
            self._slots_opened[ws] = None
            self._send(r["requester"], {"op": "retire-workers-reply", "request_id": r["request_id"],
                                        "retired": [], "kept": [ws.address],
                                        "reason": "unique data and no other worker to take it"})
            return
        if unique and not timed_out:
            for ts in unique:
                if ts.key in r["sent"]:
                    continue
                target = max(survivors, key=lambda w: (w.memory_limit or 2**62) - w.nbytes)
                r["sent"].add(ts.key)
                self._send(target.address, {"op": "acquire-replicas",
                                            "who_has": {ts.key: [ws.address]},
                                            "nbytes": {ts.key: ts.nbytes}})
            return
        if ws.processing and not timed_out:
            return
        # done: close it
        del self.retiring[ws.address]
        if r["close"]:
            self._send(ws.address, {"op": "close", "reason": "retired"})
        self._remove_worker(ev.RemoveWorker(ws.address, "retired", now))
        if not self._pending_retirements(r["request_id"]):
            self._finish_request(r["request_id"], r["requester"], r["workers"])

    def _finish_request(self, request_id: str, requester: str, workers: list[str]) -> None:
        retired = [a for a in workers if a not in self.workers]
        kept = [a for a in workers if a in self.workers]
        self._send(requester, {"op": "retire-workers-reply", "request_id": request_id,
                               "retired": retired, "kept": kept, "reason": ""})

    # ================================================================ queries
    def who_has(self, keys: Iterable[Key]) -> dict[Key, list[str]]:
        out = {}
        for k in keys:
            ts = self.tasks.get(k)
            out[k] = [ws.address for ws in ts.who_has] if ts is not None else []
        return out

    def idle_workers(self) -> list[WorkerInfo]:
        return [ws for ws in self.workers.values() if not ws.processing]

    def task_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ts in self.tasks.values():
            counts[ts.state] = counts.get(ts.state, 0) + 1
        return counts

    # ================================================================ invariants
    def validate(self) -> None:
        """Check every invariant; raises AssertionError naming the broken one."""
        total = 0
        for addr, ws in self.workers.items():
            assert ws.address == addr, (ws, addr)
            total += ws.nthreads
            for ts in ws.processing:
                assert ts.processing_on is ws and ts.state == "processing", (ts, ws)
                assert self.tasks.get(ts.key) is ts, ts
            assert ws.executing <= set(ws.processing), ws
            occ = sum(ws.processing.values())
            assert abs(ws.occupancy - occ) < 1e-6 * max(1, occ) + 1e-9, (ws, ws.occupancy, occ)
            for ts in ws.has_what:
                assert ws in ts.who_has, (ts, ws)
            nbytes = sum(max(ts.nbytes, 0) for ts in ws.has_what)
            assert ws.nbytes == nbytes, (ws, ws.nbytes, nbytes)
        assert total == self.total_nthreads, (total, self.total_nthreads)
        if self._running_cache is not None:
            assert self._running_cache == [ws for ws in self.workers.values()
                                           if ws.status == "running"], "stale running workers"
        n_queued = 0
        for key, ts in self.tasks.items():
            assert ts.key == key
            for ws in ts.who_has:
                assert self.workers.get(ws.address) is ws, (ts, ws)
                assert ts in ws.has_what, (ts, ws)
            for dts in ts.dependencies:
                assert ts in dts.dependents, (ts, dts)
                assert self.tasks.get(dts.key) is dts, (ts, dts)
            for dts in ts.dependents:
                assert ts in dts.dependencies, (ts, dts)
            for dts in ts.waiters:
                assert ts in dts.dependencies, (ts, dts)
            s = ts.state
            if s == "memory":
                assert ts.who_has, ts
                assert not ts.waiting_on, ts
            else:
                assert not ts.who_has, (ts, ts.who_has)
            if s == "processing":
                assert ts.processing_on is not None and ts in ts.processing_on.processing, ts
                assert self.workers.get(ts.processing_on.address) is ts.processing_on, ts
                assert all(d.state == "memory" for d in ts.dependencies), ts
            else:
                assert ts.processing_on is None, ts
            if s == "waiting":
                assert ts.waiting_on, ts
                for dts in ts.waiting_on:
                    assert dts.state != "memory", (ts, dts)
                    assert dts in ts.dependencies
                for dts in ts.dependencies:
                    assert ts in dts.waiters, (ts, dts)
            if s == "queued":
                n_queued += 1
                assert not ts.waiting_on, ts
            if s == "no-worker":
                assert ts in self.unrunnable, ts
            else:
                assert ts not in self.unrunnable, ts
            if s == "erred":
                assert ts.exception is not None or ts.exception_blame is not None, ts
            if s in ("waiting", "processing", "queued", "no-worker"):
                assert self._wanted(ts), ts
            if s == "released":
                # nobody wants it and nothing could need it recomputed: it leaked
                assert self._wanted(ts) or ts.dependents, ("leaked", ts)
        assert n_queued == self.n_queued, (n_queued, self.n_queued)


SchedulerState._handlers = {
    ev.AddWorker: SchedulerState._add_worker,
    ev.RemoveWorker: SchedulerState._remove_worker,
    ev.AddClient: SchedulerState._add_client,
    ev.RemoveClient: SchedulerState._remove_client,
    ev.UpdateGraph: SchedulerState._update_graph_gc_paused,
    ev.ClientDesiresKeys: SchedulerState._client_desires,
    ev.ClientReleasesKeys: SchedulerState._client_releases,
    ev.CancelKeys: SchedulerState._cancel,
    ev.ScatterData: SchedulerState._scatter,
    ev.AddKeys: SchedulerState._add_keys,
    ev.ReleaseWorkerData: SchedulerState._release_worker_data,
    ev.TaskStarted: SchedulerState._task_started,
    ev.TaskFinished: SchedulerState._task_finished,
    ev.TaskErred: SchedulerState._task_erred,
    ev.MissingData: SchedulerState._missing_data,
    ev.StealResponse: SchedulerState._steal_response,
    ev.Heartbeat: SchedulerState._heartbeat,
    ev.RetireWorkers: SchedulerState._retire_workers,
    ev.Tick: SchedulerState._tick,
}
