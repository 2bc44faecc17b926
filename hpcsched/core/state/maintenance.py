"""Scheduler state, continued: data moved in and out, stealing, retirement, periodic work.

:class:`Maintenance` owns what is in flight between workers -- scatters, steals,
retirements, rebalances -- and changes tasks through the task graph's methods
(:class:`~.tasks.TaskGraph`), workers through the registry's
(:class:`~.registry.WorkerRegistry`); same rules as the state: events in, ``Send``
commands out, no clock. Kept apart because these move work or data between workers
without computing anything:

* scatter and replicas: ``update-data`` out, ``add-keys`` back;
* work stealing (``steal-request`` / ``steal-response``, planned each tick by
  :func:`hpcsched.core.state.policies.plan_steals`);
* graceful retirement: unique results are copied to survivors with most free
  memory (``acquire-replicas``), then the worker is sent ``close``;
* rebalance (``Client.rebalance``): keys move from workers holding more bytes
  than the mean to those holding less; a sender drops its copy only once the
  recipient reported holding it (``add-keys``), so no key is ever lost;
* the tick: heartbeat timeouts (``worker_ttl``), retirement and rebalance
  timeouts, steals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcsched.core.graph.dsk import key_split
from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.messages import (
    AcquireReplicas,
    Close,
    ControlReply,
    FreeKeys,
    RetireWorkersReply,
    ScatterReply,
    StealRequest,
    UpdateData,
)
from hpcsched.core.state import events as ev
from hpcsched.core.state import policies
from hpcsched.core.state.model import (
    NoValidWorkerError,
    Outbox,
    Rebalance,
    Rec,
    Retirement,
    Scatter,
    TaskState,
    WorkerInfo,
)
from hpcsched.core.state.placement import Placement
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.settings import SchedulerSettings
from hpcsched.core.state.tasks import TaskGraph

Key = Any


class Maintenance:
    """The handlers that move data or work between workers, and what they have in flight.
    ``remove_worker`` removes a worker (a retired one, one past its heartbeat TTL): the
    handler of :class:`~hpcsched.core.state.events.RemoveWorker`."""

    handlers = Handlers("scheduler state (maintenance)")

    def __init__(self, graph: TaskGraph, registry: WorkerRegistry, placement: Placement,
                 out: Outbox, remove_worker: Callable[[ev.RemoveWorker], None],
                 settings: SchedulerSettings, *,
                 elements_on: Callable[[WorkerInfo], int] = lambda ws: 0):
        self.graph = graph
        self.registry = registry
        self.placement = placement
        self.out = out
        self.remove_worker = remove_worker
        self.work_stealing = settings.work_stealing
        self.worker_ttl = settings.worker_ttl
        self.retire_timeout = settings.retire_timeout
        self.no_workers_timeout = settings.no_workers_timeout
        self.unrunnable_since: dict[TaskState, float] = {}  # no-worker tasks, seen since
        self.elements_on = elements_on  # elements of bulk maps a worker runs (a retirement waits)
        self.retiring: dict[str, Retirement] = {}  # by worker address
        self.scatters: dict[str, Scatter] = {}  # by scatter id
        self.rebalances: dict[str, Rebalance] = {}  # by request id
        self.steal_targets = graph.steal_targets  # key -> thief, of the tasks being stolen

    @handlers.on(ev.ScatterData)
    def scatter(self, e: ev.ScatterData) -> None:
        """Place a client's scattered data on workers (``update-data``)."""
        graph = self.graph
        running = list(self.registry.running())
        if e.workers:
            allowed = set(e.workers)
            running = [ws for ws in running
                       if ws.address in allowed or ws.name in allowed or ws.host in allowed]
        if not running:
            self.out.send(e.client, ScatterReply(e.scatter_id, "no running worker to scatter to"))
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
            ts = graph.promote(key)
            if ts is None:
                ts = graph.new_task(key, None, key_split(key))
                ts.priority = (graph.generation, 0, 0)
            ts.who_wants.add(e.client)
            graph.set_nbytes(ts, int(e.nbytes.get(key, 0)))
        pending = {(ws.address, key) for ws, d in per_worker.items() for key in d}
        self.scatters[e.scatter_id] = Scatter(e.client, pending)
        for ws, d in per_worker.items():
            self.out.send(ws.address, UpdateData(d, e.scatter_id))

    @handlers.on(ev.AddKeys)
    def add_keys(self, e: ev.AddKeys) -> None:
        """A worker holds new replicas (scattered, replicated, rebalanced data)."""
        graph, workers = self.graph, self.registry.workers
        ws = workers.get(e.worker)
        if ws is None:
            return
        recs: list[Rec] = []
        for key, nbytes in e.keys.items():
            ts = graph.promote(key)
            if ts is None or (ts.state not in ("memory", "released") and ts.run_spec is not None):
                if ts is None or ts.state in ("erred",):
                    self.out.send(ws.address, FreeKeys([key]))
                    continue
            graph.add_replica(ts, ws, nbytes)
            if ts.state != "memory":
                recs += graph.to_memory(ts)
        scatter = self.scatters.get(e.scatter_id) if e.scatter_id is not None else None
        if scatter is not None and e.scatter_id is not None:
            scatter.pending.difference_update((ws.address, k) for k in e.keys)
            if not scatter.pending:
                del self.scatters[e.scatter_id]
                self.out.send(scatter.client, ScatterReply(e.scatter_id))
        graph.transitions(recs)
        if self.rebalances:
            self._rebalance_arrived(ws, e.keys)
        if ws.address in self.retiring:
            self.progress_retirement(ws, e.now)
        for address in list(self.retiring):
            if address != ws.address and address in workers:
                self.progress_retirement(workers[address], e.now)

    @handlers.on(ev.ReleaseWorkerData)
    def release_worker_data(self, e: ev.ReleaseWorkerData) -> None:
        """A worker dropped its copy of ``keys``."""
        graph = self.graph
        ws = self.registry.workers.get(e.worker)
        if ws is None:
            return
        recs: list[Rec] = []
        for key in e.keys:
            ts = graph.promote(key)
            if ts is not None and ws in ts.who_has:
                recs += graph.drop_replica(ts, ws, f"worker {ws.address} dropped it")
        graph.transitions(recs)

    # ================================================================ stealing
    @handlers.on(ev.StealResponse)
    def steal_response(self, e: ev.StealResponse) -> None:
        """A victim answered a steal request: move the task if it gave it up."""
        graph, workers = self.graph, self.registry.workers
        ts = graph.tasks.get(e.key)
        victim = workers.get(e.worker)
        if ts is None or victim is None or not ts.stealing:
            return
        thief = self.steal_targets.pop(ts.key, None)
        ts.stealing = False
        if ts.state != "processing" or ts.processing_on is not victim:
            return
        if e.state in ("released", "waiting", "fetch", "flight", "ready", "missing"):
            # the victim dropped it: run it on the thief (if still around)
            graph.transition(ts, "waiting")
            if thief is not None and thief.address in workers and thief.status == "running":
                graph.add_to_processing(ts, thief)
            else:
                graph.transitions([(ts, "processing")])

    @handlers.on(ev.Tick)
    def tick(self, e: ev.Tick) -> None:
        """Drop workers past their heartbeat TTL, advance retirements, steal work."""
        workers = self.registry.workers
        if self.worker_ttl:
            for ws in self.registry.silent_since(e.now - self.worker_ttl):
                self.remove_worker(ev.RemoveWorker(
                    ws.address, f"no heartbeat for {e.now - ws.last_seen:.0f}s", now=e.now,
                    stimulus_id=e.stimulus_id))
        for address in list(self.retiring):
            retiring = workers.get(address)
            if retiring is not None:
                self.progress_retirement(retiring, e.now)
        for r in list(self.rebalances.values()):
            if e.now - r.start > self.retire_timeout:  # a copy never arrived: both are kept
                self._finish_rebalance(r)
        if self.work_stealing and len(workers) > 1 and self.placement.backlogged:
            self.steal()
        if self.no_workers_timeout is not None:
            self.fail_unrunnable(e.now, self.no_workers_timeout)

    def fail_unrunnable(self, now: float, timeout: float) -> None:
        """Tasks no worker could run (no-worker) for ``timeout`` s fail with
        :class:`NoValidWorkerError` rather than wait for good: in a cluster that does not
        grow (MPI mode) a task restricted to ``workers=7`` of four ranks would. Costs the
        no-worker tasks, never the workers."""
        since = {ts: self.unrunnable_since.get(ts, now) for ts in self.placement.unrunnable}
        self.unrunnable_since = since
        recs: list = []
        for ts in [ts for ts, t in since.items() if now - t > timeout]:
            asked = []
            if ts.worker_restrictions:
                asked.append(f"workers={sorted(map(str, ts.worker_restrictions))}")
            if ts.resource_restrictions:
                asked.append(f"resources={dict(ts.resource_restrictions)}")
            exc = NoValidWorkerError(
                f"no worker could run task {ts.key!r} ({', '.join(asked) or 'no workers'}) "
                f"for {timeout:g} s (scheduler.no-workers-timeout); the cluster has "
                f"{len(self.registry.workers)} worker(s)")
            del since[ts]
            recs += self.graph.set_erred(ts, exc, "", str(exc))
        if recs:
            self.graph.transitions(recs)

    def steal(self) -> None:
        """Plan a round of stealing (``steal-request`` to the victims): the backlogged
        workers and at most :data:`~.policies.STEAL_MOVES` idle ones are read, never the
        whole cluster."""
        thieves = self.placement.idle_workers(policies.STEAL_MOVES)
        if thieves and self._backlogs():
            placement = self.placement
            for ts, victim, thief in policies.plan_steals(
                    placement.backlogged, thieves, self.registry.bandwidth):
                if thief.end is not None and not placement.lifetime_allows(
                        thief, placement.expected_seconds(ts), ts.group.name):
                    continue  # it leaves before the task would end: it stays where it is
                ts.stealing = True
                self.steal_targets[ts.key] = thief
                self.out.send(victim.address, StealRequest(ts.key))

    def _backlogs(self) -> bool:
        """Whether a worker holds more tasks than threads (those that do not any more are
        dropped from the backlogged ones)."""
        backlogged = self.placement.backlogged
        if backlogged:
            workers = self.registry.workers
            backlogged -= {ws for ws in backlogged if workers.get(ws.address) is not ws
                           or len(ws.processing) <= ws.nthreads}
        return bool(backlogged)

    # ================================================================ paused workers
    @handlers.on(ev.WorkerStatusChange)
    def worker_status_change(self, e: ev.WorkerStatusChange) -> None:
        """A worker paused (memory past its pause fraction) or runs again. Paused, it is no
        candidate for new tasks (it is not "running"); what it holds already waits there
        (or is stolen). Resumed, its slots count as opened: queued tasks flow to it."""
        ws = self.registry.workers.get(e.worker)
        if ws is None or e.status not in ("running", "paused") or ws.status == e.status \
                or ws.status not in ("running", "paused"):  # retiring: it stays so
            return
        self.registry.set_status(ws, e.status)
        if e.status == "running":
            self.placement.open_slots(ws)
            # tasks that found no running worker (all were paused) may run here now
            self.graph.retry_no_worker()

    # ================================================================ retirement
    @handlers.on(ev.RetireWorkers)
    def retire_workers(self, e: ev.RetireWorkers) -> None:
        """Start retiring ``workers``: their unique data moves first, then they close."""
        graph, workers = self.graph, self.registry.workers
        if self.out.recorder is not None and e.workers:
            self.out.recorder.event("retire-workers", list(e.workers), e.now)
        for address in e.workers:
            ws = workers.get(address)
            if ws is None:
                continue
            self.registry.set_status(ws, "closing_gracefully")
            self.retiring[address] = Retirement(e.request_id, e.requester, e.now, e.close,
                                                list(e.workers))
        # tasks not yet started on retiring workers go elsewhere
        recs: list[Rec] = []
        for address in e.workers:
            ws = workers.get(address)
            if ws is None:
                continue
            for ts in list(ws.processing):
                if ts not in ws.executing:
                    graph.transition(ts, "waiting", notify=True)
                    recs.append((ts, "processing"))
        graph.transitions(recs)
        pending = self._pending_retirements(e.request_id)
        for address in e.workers:
            ws = workers.get(address)
            if ws is not None:
                self.progress_retirement(ws, e.now)
        if not pending or not any(a in workers for a in e.workers):
            self._finish_request(e.request_id, e.requester, e.workers)

    def _pending_retirements(self, request_id: str) -> list[str]:
        return [a for a, r in self.retiring.items() if r.request_id == request_id]

    def progress_retirement(self, ws: WorkerInfo, now: float) -> None:
        """Move ``ws``'s remaining unique data, or close it once it holds none."""
        r = self.retiring.get(ws.address)
        if r is None:
            return
        survivors = [w for w in self.registry.workers.values() if w.status == "running"]
        unique = [ts for ts in ws.has_what if len(ts.who_has) == 1]
        timed_out = now - r.start > self.retire_timeout
        if unique and not survivors and not timed_out:
            # nowhere to put the data: give up retiring this one (it keeps the results)
            self.registry.set_status(ws, "running")
            del self.retiring[ws.address]
            self.placement.open_slots(ws)
            self.out.send(r.requester, RetireWorkersReply(
                r.request_id, [], [ws.address], "unique data and no other worker to take it"))
            return
        if unique and not timed_out:
            for ts in unique:
                if ts.key in r.sent:
                    continue
                target = max(survivors, key=lambda w: (w.memory_limit or 2**62) - w.nbytes)
                r.sent.add(ts.key)
                self.out.send(target.address, AcquireReplicas({ts.key: [ws.address]},
                                                              {ts.key: ts.nbytes}))
            return
        if (ws.processing or self.elements_on(ws)) and not timed_out:
            return
        # done: close it
        del self.retiring[ws.address]
        if r.close:
            self.out.send(ws.address, Close("retired"))
        self.remove_worker(ev.RemoveWorker(ws.address, "retired", now=now,
                                           stimulus_id=self.out.stimulus_id))
        if not self._pending_retirements(r.request_id):
            self._finish_request(r.request_id, r.requester, r.workers)

    def _finish_request(self, request_id: str, requester: str, workers: list[str]) -> None:
        known = self.registry.workers
        retired = [a for a in workers if a not in known]
        kept = [a for a in workers if a in known]
        self.out.send(requester, RetireWorkersReply(request_id, retired, kept))

    def worker_left(self, address: str) -> None:
        """The worker at ``address`` left: it retires no more, and moves of rebalances to
        or from it will not happen (the other copy stays)."""
        self.retiring.pop(address, None)
        for r in list(self.rebalances.values()):
            for move, sender in list(r.moves.items()):
                if sender == address or move[1] == address:
                    del r.moves[move]
            if not r.moves:
                self._finish_rebalance(r)

    # ================================================================ rebalance
    def rebalance_pool(self, e: ev.RebalanceKeys) -> list[WorkerInfo]:
        """The workers a rebalance spreads data over."""
        return [ws for ws in self.registry.workers.values() if ws.status == "running"
                and (e.workers is None or ws.address in e.workers or ws.name in e.workers)]

    @handlers.on(ev.RebalanceKeys)
    def rebalance(self, e: ev.RebalanceKeys) -> None:
        """Move keys from workers holding more bytes than the mean of ``e.workers`` (all
        running workers if None) to those holding less, as ``distributed.Client.rebalance``
        (https://distributed.dask.org/en/stable/api.html#distributed.Client.rebalance);
        only ``e.keys`` move if given. Greedy: each sender's largest keys go to the
        recipient holding least while that narrows the gap. The bytes counted are those
        the scheduler knows of (results' sizes), not the workers' process memory."""
        tasks = self.graph.tasks
        pool = self.rebalance_pool(e)
        wanted = None if e.keys is None else {
            k for k in e.keys if self.graph.promote(k) is not None}
        r = Rebalance(e.request_id, e.requester, e.now)
        if len(pool) > 1:
            load = {ws: ws.nbytes for ws in pool}
            mean = sum(load.values()) / len(pool)
            for sender in sorted(pool, key=lambda w: -load[w]):
                if load[sender] <= mean:
                    break
                keys = sorted((ts for ts in sender.has_what if ts.state == "memory"
                               and ts.nbytes > 0 and (wanted is None or ts.key in wanted)
                               and not _needed_on(ts, sender)),
                              key=lambda ts: -ts.nbytes)
                for ts in keys:
                    if load[sender] <= mean:
                        break
                    takers = [w for w in pool if w not in ts.who_has and load[w] < mean
                              and (ts.key, w.address) not in r.moves]
                    if not takers:
                        continue
                    to = min(takers, key=lambda w: (load[w], w.address))
                    if load[to] + ts.nbytes >= load[sender]:
                        continue  # moving it would not narrow the gap
                    r.moves[(ts.key, to.address)] = sender.address
                    load[sender] -= ts.nbytes
                    load[to] += ts.nbytes
        if not r.moves:
            self._finish_rebalance(r)
            return
        self.rebalances[r.request_id] = r
        orders: dict[str, AcquireReplicas] = {}
        for (key, to), sender in r.moves.items():
            order = orders.get(to)
            if order is None:
                order = orders[to] = AcquireReplicas({}, {})
            order.who_has[key] = [sender]
            order.nbytes[key] = tasks[key].nbytes
        for address, order in orders.items():
            self.out.send(address, order)

    def _rebalance_arrived(self, ws: WorkerInfo, keys: dict) -> None:
        """``ws`` holds ``keys`` now: the senders of those it was given drop their copy."""
        graph, workers = self.graph, self.registry.workers
        for r in list(self.rebalances.values()):
            for key in keys:
                sender = r.moves.pop((key, ws.address), None)
                ts = graph.tasks.get(key)
                holder = workers.get(sender) if sender is not None else None
                if ts is None or holder is None or ws not in ts.who_has \
                        or holder not in ts.who_has or _needed_on(ts, holder):
                    continue
                graph.remove_replica(ts, holder)
                self.out.send(holder.address, FreeKeys([key]))
            if not r.moves:
                self._finish_rebalance(r)

    def _finish_rebalance(self, r: Rebalance) -> None:
        self.rebalances.pop(r.request_id, None)
        self.out.send(r.requester, ControlReply(r.request_id, "OK"))


def _needed_on(ts: TaskState, ws: WorkerInfo) -> bool:
    """A task of ``ws`` still to run needs ``ts`` there: its copy must stay."""
    return any(d.processing_on is ws for d in ts.dependents)
