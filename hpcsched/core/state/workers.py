"""Scheduler state, what workers tell: they join and leave, start, finish and fail tasks.

:class:`WorkerEvents` registers workers with the :class:`~.registry.WorkerRegistry`
and changes tasks through the :class:`~.tasks.TaskGraph`'s methods (transitions,
replicas); a worker that leaves ends what :class:`~.maintenance.Maintenance` had in
flight with it. Same rules as the state: events in, ``Send`` commands out, no clock.
"""

from __future__ import annotations

from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.messages import FreeKeys, HeartbeatInterval, RefreshWhoHas
from hpcsched.core.state import events as ev
from hpcsched.core.state.liveness import heartbeat_interval
from hpcsched.core.state.maintenance import Maintenance
from hpcsched.core.state.model import KilledWorker, Outbox, Rec, TaskState, WorkerInfo
from hpcsched.core.state.placement import Placement
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.settings import SchedulerSettings
from hpcsched.core.state.tasks import TaskGraph


class WorkerEvents:
    """The handlers of what workers do and say: join, leave, run, finish, err."""

    handlers = Handlers("scheduler state (workers)")

    def __init__(self, graph: TaskGraph, registry: WorkerRegistry, placement: Placement,
                 maintenance: Maintenance, out: Outbox, settings: SchedulerSettings):
        self.graph = graph
        self.registry = registry
        self.placement = placement
        self.maintenance = maintenance
        self.out = out
        self.allowed_failures = settings.allowed_failures
        self.base_interval = settings.heartbeat_interval
        self.worker_ttl = settings.worker_ttl
        self._interval = (-1, 0.0)  # (number of workers, their heartbeat interval)
        # (worker, key of a failed gang) whose part it may still be running, blocked in a
        # collective that MPI cannot interrupt: that thread is lost to the worker
        # (WorkerRegistry.block_slot) until it says that part ended
        self.blocked: dict[tuple[str, object], None] = {}

    def heartbeat_interval(self) -> float:
        """Seconds between each worker's heartbeats in this cluster (:mod:`.liveness`)."""
        n, interval = self._interval
        if n != len(self.registry.workers):
            n = len(self.registry.workers)
            interval = heartbeat_interval(n, self.base_interval, self.worker_ttl)
            self._interval = (n, interval)
        return interval

    @handlers.on(ev.AddWorker)
    def add_worker(self, e: ev.AddWorker) -> None:
        """A worker joined (with the data it already holds)."""
        graph, placement = self.graph, self.placement
        if e.address in self.registry.workers:
            return
        ws = WorkerInfo(e.address, e.nthreads, e.memory_limit, e.name, e.host, e.resources,
                        e.pid, e.now)
        ws.end = e.lifetime_end
        ws.gpus = tuple(e.gpus)
        ws.resources_only = e.resources_only
        ws.job = e.job
        self.registry.add(ws)
        if e.paused:
            self.registry.set_status(ws, "paused")
        before = self._interval[1]
        # the server tells it (registered)
        ws.heartbeat_interval = interval = self.heartbeat_interval()
        if interval > before > 0:
            # the cluster outgrew its interval: the others are told now, not with the answer
            # to their next heartbeat, or a registration storm is followed by a storm of
            # heartbeats at the short intervals of a small cluster. The interval doubles,
            # so this costs each registration a constant on average
            for other in self.registry.workers.values():
                if other.heartbeat_interval < interval:
                    other.heartbeat_interval = interval
                    self.out.send(other.address, HeartbeatInterval(interval))
        placement.push_free(ws)
        recs: list[Rec] = []
        for key, nbytes in (e.keys or {}).items():
            ts = graph.promote(key)
            if ts is None:
                self.out.send(ws.address, FreeKeys([key]))
                continue
            graph.add_replica(ts, ws, nbytes)
            if ts.state != "memory":
                recs += graph.to_memory(ts)
        # a worker that registers again goes on with the tasks it is running: they are
        # its, where they are ready to run (else they run where the scheduler decides)
        for key in e.running:
            ts = graph.promote(key)
            if ts is not None and ts.state in ("queued", "no-worker") and not ts.waiting_on:
                graph.add_to_processing(ts, ws)
        graph.transitions(recs)
        # tasks no worker could take may run here (and whether a task is root-ish depends
        # on the total of threads): placed again
        graph.retry_no_worker()
        placement.open_slots(ws, push=False)  # pushed above, before the transitions
        if self.out.recorder is not None:
            self.out.recorder.worker_added(ws, e.now)

    @handlers.on(ev.RemoveWorker)
    def remove_worker(self, e: ev.RemoveWorker, elements_unfinished: int = 0,
                      spared: set[TaskState] | frozenset = frozenset()) -> None:
        """A worker left: its tasks run elsewhere, data only it held is recomputed.
        ``elements_unfinished``: elements of bulk maps it held unfinished (they count its
        death themselves: :meth:`.bulk.reports.Reports.worker_left`); ``spared``: tasks its ranges
        ran, which count it as those elements do (none is blamed)."""
        graph = self.graph
        ws = self.registry.workers.get(e.address)
        if ws is None:
            return
        graceful = ws.status == "closing_gracefully"
        for key in ws.blocked:
            self.blocked.pop((ws.address, key), None)
        self.registry.remove(ws, e.stimulus_id or self.out.stimulus_id)
        self.placement.worker_left(ws)
        self.graph.comms.worker_left(ws.address)
        if self.out.recorder is not None:
            self.out.recorder.worker_removed(ws.address, e.reason, e.now)
        self.maintenance.worker_left(ws.address)
        recs: list[Rec] = []
        # blame the tasks the worker said it started; if none did, every task it held that
        # never says so (as dask does). A suspect says when it starts, but its message may
        # not get out before it kills the worker: then the first given to it (a thread
        # free starts a task when it arrives; those given together go in priority order,
        # as the worker runs them) were running -- unless elements of a range still were
        # (they count it). Blaming every suspect held would blame, at each death, the
        # innocent ones queued behind the culprit.
        suspects = set(ws.executing) - spared
        if not suspects:
            suspects = {ts for ts in ws.processing if not ts.suspicious and ts not in spared}
            if not elements_unfinished:
                quiet = [ts for ts in ws.processing if ts.suspicious]  # in the order given
                suspects.update(quiet[:ws.nthreads])
        for ts in list(ws.processing):
            # a wide task of which it held a slot: its first worker, if alive, drops it
            graph.transition(ts, "released", notify=ts.processing_on is not ws)
            if ts in suspects and not graceful:
                ts.suspicious += 1
                ts.erred_on += (ws.address,)
                if ts.suspicious >= self.allowed_failures:
                    exc = KilledWorker(
                        f"task {ts.key!r} was running on {ts.suspicious} workers that died "
                        f"({', '.join(ts.erred_on)}); it is marked as erred so that it does not "
                        f"kill the whole cluster. The last one: {e.reason or 'connection lost'}")
                    recs += graph.set_erred(ts, exc, "", str(exc))
                    continue
            if graph.wanted(ts):
                recs.append((ts, "waiting"))
        why = f"worker {ws.address} left ({e.reason or 'unknown reason'})"
        for ts in list(ws.has_what):
            recs += graph.drop_replica(ts, ws, why)
        graph.transitions(recs)

    @handlers.on(ev.Heartbeat)
    def heartbeat(self, e: ev.Heartbeat) -> None:
        """A worker is alive: note when, and its metrics; tell it its new interval if the
        cluster's size changed it (constant time: heartbeats come from every worker)."""
        ws = self.registry.workers.get(e.worker)
        if ws is not None:
            if self.out.recorder is not None:
                self.out.recorder.heartbeat(e, ws)
            self.registry.heard_from(ws, e.now)
            ws.metrics = e.metrics
            self.registry.note_bandwidth(e.metrics)
            interval = self.heartbeat_interval()
            if interval != ws.heartbeat_interval:
                ws.heartbeat_interval = interval
                self.out.send(ws.address, HeartbeatInterval(interval))

    @handlers.on(ev.TaskStarted)
    def task_started(self, e: ev.TaskStarted) -> None:
        """A worker started running a task (it is blamed if the worker dies now); a wide
        task runs on every worker of its lease from now on."""
        ts = self.graph.tasks.get(e.key)
        ws = self.registry.workers.get(e.worker)
        if ts is not None and ws is not None and ts.processing_on is ws:
            ws.executing.add(ts)
            if ts.width > 1:
                for member in self.graph.leases[ts]:
                    member.executing.add(ts)

    @handlers.on(ev.LongRunning)
    def long_running(self, e: ev.LongRunning) -> None:
        """The task seceded (``hpcsched.secede()``, ``worker_client()``): it waits on other
        tasks, so its slot opens for queued work, as dask.distributed's scheduler does;
        it stays processing there (and is never stolen: it has started). An element of a
        bulk map that secedes becomes a task of its own here."""
        ts = self.graph.promote(e.key)
        ws = self.registry.workers.get(e.worker)
        if ts is None or ws is None or ts.state != "processing" or ts.processing_on is not ws \
                or ts in ws.long_running:
            return
        ws.long_running.add(ts)
        ws.executing.add(ts)
        est = ws.processing[ts]
        ws.processing[ts] = 0.0  # no longer counts towards the worker's occupancy
        ws.occupancy = max(ws.occupancy - est, 0.0)
        self.placement.open_slots(ws)

    @handlers.on(ev.TaskFinished)
    def task_finished(self, e: ev.TaskFinished) -> None:
        """A worker holds a task's result: the task is in memory."""
        graph = self.graph
        ts = graph.tasks.get(e.key)
        ws = self.registry.workers.get(e.worker)
        if ws is None:
            return
        if self.blocked:  # a worker left running a failed gang's part (rare: not per task)
            self._member_ended(ws, e)
        if ts is not None and ts.width > 1 and (ts.state != "processing"
                                                or ts.processing_on is not ws):
            # another member's part ended: the task's result is its first member's
            if ts.state == "processing" and ws in graph.leases[ts]:
                graph.members_done.setdefault(ts, set()).add(ws)
            return
        if self.out.recorder is not None:  # a gang: one task on each of its members
            self.out.recorder.task_finished(
                e, ts, ws, graph.leases.get(ts, ()) if ts is not None and ts.width > 1 else ())
        if ts is None or ts.state in ("released", "erred", "waiting", "no-worker", "queued"):
            # a result nobody asked for any more (released, cancelled, or recomputed elsewhere)
            if ts is None or not graph.wanted(ts) or ts.state == "erred":
                self.out.send(ws.address, FreeKeys([e.key]))
                return
        tg = ts.group
        kept = getattr(ts.run_spec, "checkpoint", None)
        if kept is None or not kept.load:
            # a result read from its checkpoint says nothing of how long the task runs: the
            # group's measure (placement, adaptive, running "very short" tasks inline on a
            # worker's loop) stays that of the runs
            tg.duration_total += max(e.stop - e.start, 0.0)
            tg.n_durations += 1
        ts.typename = e.typename
        if ts.state == "memory":
            graph.add_replica(ts, ws, e.nbytes)
            return
        if ts.state == "waiting":
            # its result arrived without its dependencies (a worker already held it): those
            # only it needed are not needed any more
            for dts in ts.dependencies:
                dts.waiters.discard(ts)
                if not dts.waiters and not dts.who_wants and dts.state in (
                        "processing", "waiting", "queued", "no-worker"):
                    graph.transitions([(dts, "released")])
        graph.add_replica(ts, ws, e.nbytes)
        tg.nbytes_total += max(e.nbytes, 0)
        tg.n_nbytes += 1
        graph.transitions(graph.to_memory(ts))
        if ws.address in self.maintenance.retiring:
            self.maintenance.progress_retirement(ws, e.now)

    @handlers.on(ev.TaskErred)
    def task_erred(self, e: ev.TaskErred) -> None:
        """A task raised: retry it if it may, else it errs (an element of a bulk map that
        raised becomes a task of its own here)."""
        graph = self.graph
        ts = graph.promote(e.key)
        ws = self.registry.workers.get(e.worker)
        if ws is not None and self.blocked:
            self._member_ended(ws, e)
        if ts is None or ws is None or ts.state != "processing" or (
                ts.processing_on is not ws and ws not in graph.leases.get(ts, ())):
            return
        if self.out.recorder is not None:
            self.out.recorder.task_erred(e, ts, ws, graph.leases.get(ts, ()) if ts.width > 1
                                         else ())
        # any member of a gang that raises fails it: the others may wait forever in a
        # collective for it, and the thread of each is lost until it says its part ended
        blocked = [m for m in graph.leases[ts] if m is not ws
                   and m not in graph.members_done.get(ts, ())] if ts.width > 1 else []
        graph.transition(ts, "released", notify=ts.width > 1)
        for m in blocked:
            self.blocked[(m.address, ts.key)] = None
            self.registry.block_slot(m, ts.key)
            self.placement.push_free(m)
        if ts.retries > 0:
            ts.retries -= 1
            graph.transitions([(ts, "waiting")])
            return
        graph.transitions(graph.set_erred(ts, e.exception, e.traceback, e.exception_text))

    def _member_ended(self, ws: WorkerInfo, e: ev.TaskFinished | ev.TaskErred) -> None:
        """``ws`` ended its part of a failed gang it was left running: its thread takes
        work again."""
        if self.blocked.pop((ws.address, e.key), self) is None \
                and self.registry.unblock_slot(ws, e.key):
            self.placement.open_slots(ws)
            self.graph.retry_no_worker()

    @handlers.on(ev.ResultErred)
    def result_erred(self, e: ev.ResultErred) -> None:
        """The result of ``ts`` exists but cannot leave its worker (it failed to serialize for
        a client or a peer): err it and its dependents with that exception rather than let
        the clients and dependents wait for data that can never arrive, or recompute a
        result that would fail the same way."""
        graph = self.graph
        ts = graph.promote(e.key)
        ws = self.registry.workers.get(e.worker)
        if ts is None or ws is None or ts.state != "memory" or ws not in ts.who_has:
            return
        for holder in list(ts.who_has):
            self.out.send(holder.address, FreeKeys([ts.key]))
            graph.remove_replica(ts, holder)
        graph.transitions(graph.set_erred(ts, e.exception, e.traceback, e.exception_text))

    @handlers.on(ev.MissingData)
    def missing_data(self, e: ev.MissingData) -> None:
        """A worker did not find ``key`` on ``errant_worker``: forget that replica."""
        graph, workers = self.graph, self.registry.workers
        ts = graph.promote(e.key)
        if ts is None:
            return
        errant = workers.get(e.errant_worker)
        recs: list[Rec] = []
        if errant is not None and errant in ts.who_has:
            graph.remove_replica(ts, errant)
        if ts.state == "memory" and not ts.who_has:
            recs += graph.lose(ts, f"worker {e.errant_worker} did not have it")
        elif ts.state == "memory" and e.worker in workers:
            self.out.send(e.worker, RefreshWhoHas({ts.key: [w.address for w in ts.who_has]}))
        graph.transitions(recs)
