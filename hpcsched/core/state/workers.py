"""Scheduler state, what workers tell: they join and leave, start, finish and fail tasks.

:class:`WorkerEvents` is handed the :class:`~hpcsched.core.state.scheduler_state.SchedulerState`
and changes it only through the state's methods (``transition``, ``transitions``,
replicas); same rules as the state: events in, ``Send`` commands out, no clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcsched.core.protocol.messages import FreeKeys, RefreshWhoHas
from hpcsched.core.state import events as ev
from hpcsched.core.state.model import KilledWorker, WorkerInfo

if TYPE_CHECKING:
    from hpcsched.core.state.scheduler_state import Rec, SchedulerState


class WorkerEvents:
    """The handlers of what workers do and say: join, leave, run, finish, err."""

    def __init__(self, state: SchedulerState):
        self.s = state

    def add_worker(self, e: ev.AddWorker) -> None:
        """A worker joined (with the data it already holds)."""
        s = self.s
        if e.address in s.workers:
            return
        ws = WorkerInfo(e.address, e.nthreads, e.memory_limit, e.name, e.host, e.resources,
                        e.pid, e.now)
        s.workers[ws.address] = ws
        s.running_cache = None
        s.total_nthreads += ws.nthreads
        s.placement.push_free(ws)
        recs: list[Rec] = []
        for key, nbytes in (e.keys or {}).items():
            ts = s.tasks.get(key)
            if ts is None:
                s.send(ws.address, FreeKeys([key]))
                continue
            s.add_replica(ts, ws, nbytes)
            if ts.state != "memory":
                recs += s.to_memory(ts)
        # rootish status depends on total threads: recompute lazily
        for ts in list(s.unrunnable):
            recs.append((ts, "waiting-ready"))
        s.transitions(recs)
        s.slots_opened[ws] = None
        if s.recorder is not None:
            s.recorder.worker_added(ws, e.now)

    def remove_worker(self, e: ev.RemoveWorker) -> None:
        """A worker left: its tasks run elsewhere, data only it held is recomputed."""
        s = self.s
        ws = s.workers.pop(e.address, None)
        if ws is None:
            return
        s.total_nthreads -= ws.nthreads
        s.removed_by[ws.address] = e.stimulus_id or s.stimulus_id
        if len(s.removed_by) > 1000:
            del s.removed_by[next(iter(s.removed_by))]
        graceful = ws.status == "closing_gracefully"
        ws.status = "closed"  # objects that still point to it (a TaskGroup's last worker) skip it
        if s.recorder is not None:
            s.recorder.worker_removed(ws.address, e.reason, e.now)
        s.running_cache = None
        s.retiring.pop(ws.address, None)
        s.maintenance.worker_left(ws.address)
        recs: list[Rec] = []
        # blame the tasks the worker said it started; if its "task-started" messages did
        # not get out before it died, every task it held (as dask does)
        suspects = set(ws.executing) or set(ws.processing)
        for ts in list(ws.processing):
            s.transition(ts, "released")
            if ts in suspects and not graceful:
                ts.suspicious += 1
                ts.erred_on.append(ws.address)
                if ts.suspicious >= s.allowed_failures:
                    exc = KilledWorker(
                        f"task {ts.key!r} was running on {ts.suspicious} workers that died "
                        f"({', '.join(ts.erred_on)}); it is marked as erred so that it does not "
                        f"kill the whole cluster. The last one: {e.reason or 'connection lost'}")
                    recs += s.set_erred(ts, exc, "", str(exc))
                    continue
            if s.wanted(ts):
                recs.append((ts, "waiting"))
        why = f"worker {ws.address} left ({e.reason or 'unknown reason'})"
        for ts in list(ws.has_what):
            recs += s.drop_replica(ts, ws, why)
        s.transitions(recs)

    def heartbeat(self, e: ev.Heartbeat) -> None:
        """A worker is alive: note when, and its metrics."""
        s = self.s
        ws = s.workers.get(e.worker)
        if ws is not None:
            if s.recorder is not None:
                s.recorder.heartbeat(e, ws)
            ws.last_seen = e.now
            ws.metrics = e.metrics
            bw = e.metrics.get("bandwidth") if isinstance(e.metrics, dict) else None
            if isinstance(bw, (int, float)) and bw > 0:
                # measured peer-to-peer transfer speed: a moving average over reports
                s.bandwidth = 0.8 * s.bandwidth + 0.2 * float(bw)

    def task_started(self, e: ev.TaskStarted) -> None:
        """A worker started running a task (it is blamed if the worker dies now)."""
        ts = self.s.tasks.get(e.key)
        ws = self.s.workers.get(e.worker)
        if ts is not None and ws is not None and ts.processing_on is ws:
            ws.executing.add(ts)

    def long_running(self, e: ev.LongRunning) -> None:
        """The task seceded (``hpcsched.secede()``, ``worker_client()``): it waits on other
        tasks, so its slot opens for queued work, as dask.distributed's scheduler does;
        it stays processing there (and is never stolen: it has started)."""
        ts = self.s.tasks.get(e.key)
        ws = self.s.workers.get(e.worker)
        if ts is None or ws is None or ts.state != "processing" or ts.processing_on is not ws \
                or ts in ws.long_running:
            return
        ws.long_running.add(ts)
        ws.executing.add(ts)
        est = ws.processing[ts]
        ws.processing[ts] = 0.0  # no longer counts towards the worker's occupancy
        ws.occupancy = max(ws.occupancy - est, 0.0)
        self.s.placement.open_slots(ws)

    def task_finished(self, e: ev.TaskFinished) -> None:
        """A worker holds a task's result: the task is in memory."""
        s = self.s
        ts = s.tasks.get(e.key)
        ws = s.workers.get(e.worker)
        if ws is None:
            return
        if s.recorder is not None:
            s.recorder.task_finished(e, ts, ws)
        if ts is None or ts.state in ("released", "erred", "waiting", "no-worker", "queued"):
            # a result nobody asked for any more (released, cancelled, or recomputed elsewhere)
            if ts is None or not s.wanted(ts) or ts.state == "erred":
                s.send(ws.address, FreeKeys([e.key]))
                return
        tg = ts.group
        tg.duration_total += max(e.stop - e.start, 0.0)
        tg.n_durations += 1
        ts.typename = e.typename
        if ts.state == "memory":
            s.add_replica(ts, ws, e.nbytes)
            return
        if ts.state == "waiting":
            # its result arrived without its dependencies (a worker already held it): those
            # only it needed are not needed any more
            for dts in ts.dependencies:
                dts.waiters.discard(ts)
                if not dts.waiters and not dts.who_wants and dts.state in (
                        "processing", "waiting", "queued", "no-worker"):
                    s.transitions([(dts, "released")])
        s.add_replica(ts, ws, e.nbytes)
        tg.nbytes_total += max(e.nbytes, 0)
        tg.n_nbytes += 1
        s.transitions(s.to_memory(ts))
        if ws.address in s.retiring:
            s.maintenance.progress_retirement(ws, e.now)

    def task_erred(self, e: ev.TaskErred) -> None:
        """A task raised: retry it if it may, else it errs."""
        s = self.s
        ts = s.tasks.get(e.key)
        ws = s.workers.get(e.worker)
        if ts is None or ws is None or ts.state != "processing" or ts.processing_on is not ws:
            return
        if s.recorder is not None:
            s.recorder.task_erred(e, ts, ws)
        s.transition(ts, "released")
        if ts.retries > 0:
            ts.retries -= 1
            s.transitions([(ts, "waiting")])
            return
        s.transitions(s.set_erred(ts, e.exception, e.traceback, e.exception_text))

    def result_erred(self, e: ev.ResultErred) -> None:
        """The result of ``ts`` exists but cannot leave its worker (it failed to serialize for
        a client or a peer): err it and its dependents with that exception rather than let
        the clients and dependents wait for data that can never arrive, or recompute a
        result that would fail the same way."""
        s = self.s
        ts = s.tasks.get(e.key)
        ws = s.workers.get(e.worker)
        if ts is None or ws is None or ts.state != "memory" or ws not in ts.who_has:
            return
        for holder in list(ts.who_has):
            s.send(holder.address, FreeKeys([ts.key]))
            s.remove_replica(ts, holder)
        s.transitions(s.set_erred(ts, e.exception, e.traceback, e.exception_text))

    def missing_data(self, e: ev.MissingData) -> None:
        """A worker did not find ``key`` on ``errant_worker``: forget that replica."""
        s = self.s
        ts = s.tasks.get(e.key)
        if ts is None:
            return
        errant = s.workers.get(e.errant_worker)
        recs: list[Rec] = []
        if errant is not None and errant in ts.who_has:
            s.remove_replica(ts, errant)
        if ts.state == "memory" and not ts.who_has:
            recs += s.lose(ts, f"worker {e.errant_worker} did not have it")
        elif ts.state == "memory" and e.worker in s.workers:
            s.send(e.worker, RefreshWhoHas({ts.key: [w.address for w in ts.who_has]}))
        s.transitions(recs)
