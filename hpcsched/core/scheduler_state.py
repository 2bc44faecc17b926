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
* This file holds workers joining and leaving, task results and the
  transitions; client requests live in :mod:`.scheduler_clients`, data
  movement, stealing and retirement in :mod:`.scheduler_maintenance`, the
  records in :mod:`.scheduler_model`, queries and ``validate`` in
  :mod:`.scheduler_validate` (mixins of one class).

Priorities are ``(generation, -user_priority, static_priority)``: every task of
an earlier ``submit``/``map``/``compute`` call comes before those of a later
one (seed 000, "first-come-first-served, coarsely").
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Iterable
from typing import Any

from hpcsched.core import events as ev
from hpcsched.core import policies
from hpcsched.core.scheduler_clients import ClientsMixin
from hpcsched.core.scheduler_maintenance import MaintenanceMixin
from hpcsched.core.scheduler_model import (  # noqa: F401 - re-exported
    FIRE_AND_FORGET,
    KilledWorker,
    LostData,
    TaskGroup,
    TaskState,
    WorkerInfo,
)
from hpcsched.core.scheduler_validate import ValidationMixin

Key = Any


class SchedulerState(ClientsMixin, MaintenanceMixin, ValidationMixin):
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
        # what happened, for the dashboard and reports (hpcsched.diagnostics.recorder):
        # called from a few handlers, never read back here
        self.recorder: Any = None

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
        if self.recorder is not None:
            self.recorder.worker_added(ws, e.now)

    def _remove_worker(self, e: ev.RemoveWorker) -> None:
        ws = self.workers.pop(e.address, None)
        if ws is None:
            return
        self.total_nthreads -= ws.nthreads
        graceful = ws.status == "closing_gracefully"
        ws.status = "closed"  # objects that still point to it (a TaskGroup's last worker) skip it
        if self.recorder is not None:
            self.recorder.worker_removed(ws.address, e.reason, e.now)
        self._running_cache = None
        self.retiring.pop(ws.address, None)
        recs: list = []
        # blame the tasks the worker said it started; if its "task-started" messages did
        # not get out before it died, every task it held (as dask does)
        suspects = set(ws.executing) or set(ws.processing)
        for ts in list(ws.processing):
            was_executing = ts in suspects
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
            if self.recorder is not None:
                self.recorder.heartbeat(e, ws)
            ws.last_seen = e.now
            ws.metrics = e.metrics
            bw = e.metrics.get("bandwidth") if isinstance(e.metrics, dict) else None
            if isinstance(bw, (int, float)) and bw > 0:
                # measured peer-to-peer transfer speed: a moving average over reports
                self.bandwidth = 0.8 * self.bandwidth + 0.2 * float(bw)

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

    # ================================================================ task results
    def _task_started(self, e: ev.TaskStarted) -> None:
        ts = self.tasks.get(e.key)
        ws = self.workers.get(e.worker)
        if ts is not None and ws is not None and ts.processing_on is ws:
            ws.executing.add(ts)

    def _long_running(self, e: ev.LongRunning) -> None:
        """The task seceded (``hpcsched.secede()``, ``worker_client()``): it waits on other
        tasks, so its slot opens for queued work, as dask.distributed's scheduler does;
        it stays processing there (and is never stolen: it has started)."""
        ts = self.tasks.get(e.key)
        ws = self.workers.get(e.worker)
        if ts is None or ws is None or ts.state != "processing" or ts.processing_on is not ws \
                or ts in ws.long_running:
            return
        ws.long_running.add(ts)
        ws.executing.add(ts)
        est = ws.processing[ts]
        ws.processing[ts] = 0.0  # no longer counts towards the worker's occupancy
        ws.occupancy = max(ws.occupancy - est, 0.0)
        self._slots_opened[ws] = None
        self._push_free(ws)

    def _task_finished(self, e: ev.TaskFinished) -> None:
        ts = self.tasks.get(e.key)
        ws = self.workers.get(e.worker)
        if ws is None:
            return
        if self.recorder is not None:
            self.recorder.task_finished(e, ts, ws)
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
            # its result arrived without its dependencies (a worker already held it): those
            # only it needed are not needed any more
            for dts in ts.dependencies:
                dts.waiters.discard(ts)
                if not dts.waiters and not dts.who_wants and dts.state in (
                        "processing", "waiting", "queued", "no-worker"):
                    self._transitions([(dts, "released")])
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
        ts.who_wants.discard(FIRE_AND_FORGET)
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
        if self.recorder is not None:
            self.recorder.task_erred(e, ts, ws)
        self._exit_processing(ts)
        if ts.retries > 0:
            ts.retries -= 1
            ts.state = "released"
            self._transitions([(ts, "waiting")])
            return
        ts.state = "released"
        self._transitions(self._set_erred(ts, e.exception, e.traceback, e.exception_text))

    def _result_erred(self, e: ev.ResultErred) -> None:
        """The result of ``ts`` exists but cannot leave its worker (it failed to serialize for
        a client or a peer): err it and its dependents with that exception rather than let
        the clients and dependents wait for data that can never arrive, or recompute a
        result that would fail the same way."""
        ts = self.tasks.get(e.key)
        ws = self.workers.get(e.worker)
        if ts is None or ws is None or ts.state != "memory" or ws not in ts.who_has:
            return
        for holder in list(ts.who_has):
            self._send(holder.address, {"op": "free-keys", "keys": [ts.key]})
            self._remove_replica(ts, holder)
        ts.state = "released"
        self._log(ts, "memory", "erred")
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
                # a dependency only this task needed is not needed any more, whether it is
                # in memory or still to be computed
                if not dts.waiters and not dts.who_wants and dts.state in (
                        "memory", "processing", "waiting", "queued", "no-worker"):
                    recs.append((dts, "released"))
            t.who_wants.discard(FIRE_AND_FORGET)
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
        return min(running, key=lambda ws: (policies.busy_slots(ws) / ws.nthreads, ws.nbytes))

    # ---------------------------------------------------------------- free-worker heap
    def _push_free(self, ws: WorkerInfo) -> None:
        if ws.status != "running" or policies.worker_full(ws, self.worker_saturation):
            return
        ws.heap_version += 1
        heapq.heappush(self._free_heap, (policies.busy_slots(ws) / ws.nthreads, next(self._seq),
                                         ws.heap_version, ws))

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
        ws.long_running.discard(ts)
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

    def _remove_replica(self, ts: TaskState, ws: WorkerInfo) -> None:
        if ws in ts.who_has:
            ts.who_has.discard(ws)
            ws.has_what.pop(ts, None)
            ws.nbytes -= max(ts.nbytes, 0)

SchedulerState._handlers = {
    ev.AddWorker: SchedulerState._add_worker,
    ev.RemoveWorker: SchedulerState._remove_worker,
    ev.AddClient: SchedulerState._add_client,
    ev.RemoveClient: SchedulerState._remove_client,
    ev.UpdateGraph: SchedulerState._update_graph_gc_paused,
    ev.ClientDesiresKeys: SchedulerState._client_desires,
    ev.ClientReleasesKeys: SchedulerState._client_releases,
    ev.CancelKeys: SchedulerState._cancel,
    ev.RetryKeys: SchedulerState._retry,
    ev.ScatterData: SchedulerState._scatter,
    ev.AddKeys: SchedulerState._add_keys,
    ev.ReleaseWorkerData: SchedulerState._release_worker_data,
    ev.TaskStarted: SchedulerState._task_started,
    ev.TaskFinished: SchedulerState._task_finished,
    ev.TaskErred: SchedulerState._task_erred,
    ev.LongRunning: SchedulerState._long_running,
    ev.ResultErred: SchedulerState._result_erred,
    ev.MissingData: SchedulerState._missing_data,
    ev.StealResponse: SchedulerState._steal_response,
    ev.Heartbeat: SchedulerState._heartbeat,
    ev.WorkerStatusChange: SchedulerState._worker_status_change,
    ev.RetireWorkers: SchedulerState._retire_workers,
    ev.Tick: SchedulerState._tick,
}
