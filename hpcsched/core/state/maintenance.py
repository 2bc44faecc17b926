"""Scheduler state, continued: data moved in and out, stealing, retirement, periodic work.

:class:`Maintenance` is handed the
:class:`~hpcsched.core.state.scheduler_state.SchedulerState` and changes it through
its methods (same rules: events in, ``Send`` commands out, no clock). Kept
apart because these move work or data between workers without computing
anything:

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

from typing import TYPE_CHECKING, Any

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
from hpcsched.core.state.graph import key_split
from hpcsched.core.state.model import (
    Rebalance,
    Retirement,
    Scatter,
    TaskGroup,
    TaskState,
    WorkerInfo,
)

if TYPE_CHECKING:
    from hpcsched.core.state.scheduler_state import Rec, SchedulerState

Key = Any


class Maintenance:
    """The handlers that move data or work between workers; they change the state handed
    to them."""

    def __init__(self, state: SchedulerState):
        self.s = state
        self.rebalances: dict[str, Rebalance] = {}  # by request id

    def scatter(self, e: ev.ScatterData) -> None:
        """Place a client's scattered data on workers (``update-data``)."""
        s = self.s
        running = [ws for ws in s.workers.values() if ws.status == "running"]
        if e.workers:
            allowed = set(e.workers)
            running = [ws for ws in running
                       if ws.address in allowed or ws.name in allowed or ws.host in allowed]
        if not running:
            s.send(e.client, ScatterReply(e.scatter_id, "no running worker to scatter to"))
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
            ts = s.tasks.get(key)
            if ts is None:
                name = key_split(key)
                tg = s.groups.get(name) or s.groups.setdefault(name, TaskGroup(name))
                ts = s.tasks[key] = TaskState(key, None, tg)
                tg.n_tasks += 1
                ts.priority = (s.generation, 0, 0)
            ts.who_wants.add(e.client)
            ts.nbytes = int(e.nbytes.get(key, 0))
        pending = {(ws.address, key) for ws, d in per_worker.items() for key in d}
        s.scatters[e.scatter_id] = Scatter(e.client, pending)
        for ws, d in per_worker.items():
            s.send(ws.address, UpdateData(d, e.scatter_id))

    def add_keys(self, e: ev.AddKeys) -> None:
        """A worker holds new replicas (scattered, replicated, rebalanced data)."""
        s = self.s
        ws = s.workers.get(e.worker)
        if ws is None:
            return
        recs: list[Rec] = []
        for key, nbytes in e.keys.items():
            ts = s.tasks.get(key)
            if ts is None or (ts.state not in ("memory", "released") and ts.run_spec is not None):
                if ts is None or ts.state in ("erred",):
                    s.send(ws.address, FreeKeys([key]))
                    continue
            s.add_replica(ts, ws, nbytes)
            if ts.state != "memory":
                recs += s.to_memory(ts)
        scatter = s.scatters.get(e.scatter_id) if e.scatter_id is not None else None
        if scatter is not None and e.scatter_id is not None:
            scatter.pending.difference_update((ws.address, k) for k in e.keys)
            if not scatter.pending:
                del s.scatters[e.scatter_id]
                s.send(scatter.client, ScatterReply(e.scatter_id))
        s.transitions(recs)
        if self.rebalances:
            self._rebalance_arrived(ws, e.keys)
        if ws.address in s.retiring:
            self.progress_retirement(ws, e.now)
        for address in list(s.retiring):
            if address != ws.address and address in s.workers:
                self.progress_retirement(s.workers[address], e.now)

    def release_worker_data(self, e: ev.ReleaseWorkerData) -> None:
        """A worker dropped its copy of ``keys``."""
        s = self.s
        ws = s.workers.get(e.worker)
        if ws is None:
            return
        recs: list[Rec] = []
        for key in e.keys:
            ts = s.tasks.get(key)
            if ts is not None and ws in ts.who_has:
                recs += s.drop_replica(ts, ws, f"worker {ws.address} dropped it")
        s.transitions(recs)

    # ================================================================ stealing
    def steal_response(self, e: ev.StealResponse) -> None:
        """A victim answered a steal request: move the task if it gave it up."""
        s = self.s
        ts = s.tasks.get(e.key)
        victim = s.workers.get(e.worker)
        if ts is None or victim is None or not ts.stealing:
            return
        thief = s.steal_targets.pop(ts.key, None)
        ts.stealing = False
        if ts.state != "processing" or ts.processing_on is not victim:
            return
        if e.state in ("released", "waiting", "fetch", "flight", "ready", "missing"):
            # the victim dropped it: run it on the thief (if still around)
            s.transition(ts, "waiting")
            if thief is not None and thief.address in s.workers and thief.status == "running":
                s.add_to_processing(ts, thief)
            else:
                s.transitions([(ts, "waiting-ready")])

    def tick(self, e: ev.Tick) -> None:
        """Drop workers past their heartbeat TTL, advance retirements, steal work."""
        s = self.s
        if s.worker_ttl:
            for ws in list(s.workers.values()):
                if e.now - ws.last_seen > s.worker_ttl:
                    s.worker_events.remove_worker(ev.RemoveWorker(
                        ws.address, f"no heartbeat for {e.now - ws.last_seen:.0f}s", now=e.now,
                        stimulus_id=e.stimulus_id))
        for address in list(s.retiring):
            retiring = s.workers.get(address)
            if retiring is not None:
                self.progress_retirement(retiring, e.now)
        for r in list(self.rebalances.values()):
            if e.now - r.start > s.retire_timeout:  # a copy never arrived: both are kept
                self._finish_rebalance(r)
        if s.work_stealing and len(s.workers) > 1:
            for ts, victim, thief in policies.plan_steals(s.workers.values(), s.bandwidth):
                ts.stealing = True
                s.steal_targets[ts.key] = thief
                s.send(victim.address, StealRequest(ts.key))

    # ================================================================ paused workers
    def worker_status_change(self, e: ev.WorkerStatusChange) -> None:
        """A worker paused (memory past its pause fraction) or runs again. Paused, it is no
        candidate for new tasks (it is not "running"); what it holds already waits there
        (or is stolen). Resumed, its slots count as opened: queued tasks flow to it."""
        s = self.s
        ws = s.workers.get(e.worker)
        if ws is None or e.status not in ("running", "paused") or ws.status == e.status \
                or ws.status not in ("running", "paused"):  # retiring: it stays so
            return
        ws.status = e.status
        s.running_cache = None
        if e.status == "running":
            s.placement.open_slots(ws)

    # ================================================================ retirement
    def retire_workers(self, e: ev.RetireWorkers) -> None:
        """Start retiring ``workers``: their unique data moves first, then they close."""
        s = self.s
        if s.recorder is not None and e.workers:
            s.recorder.event("retire-workers", list(e.workers), e.now)
        for address in e.workers:
            ws = s.workers.get(address)
            if ws is None:
                continue
            ws.status = "closing_gracefully"
            s.running_cache = None
            s.retiring[address] = Retirement(e.request_id, e.requester, e.now, e.close,
                                             list(e.workers))
        # tasks not yet started on retiring workers go elsewhere
        recs: list[Rec] = []
        for address in e.workers:
            ws = s.workers.get(address)
            if ws is None:
                continue
            for ts in list(ws.processing):
                if ts not in ws.executing:
                    s.transition(ts, "waiting", notify=True)
                    recs.append((ts, "waiting-ready"))
        s.transitions(recs)
        pending = self._pending_retirements(e.request_id)
        for address in e.workers:
            ws = s.workers.get(address)
            if ws is not None:
                self.progress_retirement(ws, e.now)
        if not pending or not any(a in s.workers for a in e.workers):
            self._finish_request(e.request_id, e.requester, e.workers)

    def _pending_retirements(self, request_id: str) -> list[str]:
        return [a for a, r in self.s.retiring.items() if r.request_id == request_id]

    def progress_retirement(self, ws: WorkerInfo, now: float) -> None:
        """Move ``ws``'s remaining unique data, or close it once it holds none."""
        s = self.s
        r = s.retiring.get(ws.address)
        if r is None:
            return
        survivors = [w for w in s.workers.values() if w.status == "running"]
        unique = [ts for ts in ws.has_what if len(ts.who_has) == 1]
        timed_out = now - r.start > s.retire_timeout
        if unique and not survivors and not timed_out:
            # nowhere to put the data: give up retiring this one (it keeps the results)
            ws.status = "running"
            s.running_cache = None
            del s.retiring[ws.address]
            s.placement.open_slots(ws)
            s.send(r.requester, RetireWorkersReply(
                r.request_id, [], [ws.address], "unique data and no other worker to take it"))
            return
        if unique and not timed_out:
            for ts in unique:
                if ts.key in r.sent:
                    continue
                target = max(survivors, key=lambda w: (w.memory_limit or 2**62) - w.nbytes)
                r.sent.add(ts.key)
                s.send(target.address, AcquireReplicas({ts.key: [ws.address]},
                                                         {ts.key: ts.nbytes}))
            return
        if ws.processing and not timed_out:
            return
        # done: close it
        del s.retiring[ws.address]
        if r.close:
            s.send(ws.address, Close("retired"))
        s.worker_events.remove_worker(ev.RemoveWorker(ws.address, "retired", now=now,
                                                      stimulus_id=s.stimulus_id))
        if not self._pending_retirements(r.request_id):
            self._finish_request(r.request_id, r.requester, r.workers)

    def _finish_request(self, request_id: str, requester: str, workers: list[str]) -> None:
        s = self.s
        retired = [a for a in workers if a not in s.workers]
        kept = [a for a in workers if a in s.workers]
        s.send(requester, RetireWorkersReply(request_id, retired, kept))

    # ================================================================ rebalance
    def rebalance(self, e: ev.RebalanceKeys) -> None:
        """Move keys from workers holding more bytes than the mean of ``e.workers`` (all
        running workers if None) to those holding less, as ``distributed.Client.rebalance``
        (https://distributed.dask.org/en/stable/api.html#distributed.Client.rebalance);
        only ``e.keys`` move if given. Greedy: each sender's largest keys go to the
        recipient holding least while that narrows the gap. The bytes counted are those
        the scheduler knows of (results' sizes), not the workers' process memory."""
        s = self.s
        pool = [ws for ws in s.workers.values() if ws.status == "running"
                and (e.workers is None or ws.address in e.workers or ws.name in e.workers)]
        wanted = None if e.keys is None else {k for k in e.keys if k in s.tasks}
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
            order.nbytes[key] = s.tasks[key].nbytes
        for address, order in orders.items():
            s.send(address, order)

    def _rebalance_arrived(self, ws: WorkerInfo, keys: dict) -> None:
        """``ws`` holds ``keys`` now: the senders of those it was given drop their copy."""
        s = self.s
        for r in list(self.rebalances.values()):
            for key in keys:
                sender = r.moves.pop((key, ws.address), None)
                ts = s.tasks.get(key)
                holder = s.workers.get(sender) if sender is not None else None
                if ts is None or holder is None or ws not in ts.who_has \
                        or holder not in ts.who_has or _needed_on(ts, holder):
                    continue
                s.remove_replica(ts, holder)
                s.send(holder.address, FreeKeys([key]))
            if not r.moves:
                self._finish_rebalance(r)

    def worker_left(self, address: str) -> None:
        """Moves to or from a worker that left will not happen (the other copy stays)."""
        for r in list(self.rebalances.values()):
            for move, sender in list(r.moves.items()):
                if sender == address or move[1] == address:
                    del r.moves[move]
            if not r.moves:
                self._finish_rebalance(r)

    def _finish_rebalance(self, r: Rebalance) -> None:
        self.rebalances.pop(r.request_id, None)
        self.s.send(r.requester, ControlReply(r.request_id, "OK"))


def _needed_on(ts: TaskState, ws: WorkerInfo) -> bool:
    """A task of ``ws`` still to run needs ``ts`` there: its copy must stay."""
    return any(d.processing_on is ws for d in ts.dependents)


def resolve_workers(s: SchedulerState, addresses: list | None, names: list | None,
                    n: int | None = None) -> list[str]:
    """The workers to retire: by address, by name, and ``n`` more (idle ones with the
    least data first)."""
    out: list[str] = []
    if addresses:
        out += [a for a in addresses if a in s.workers]
    if names:
        wanted = set(map(str, names))
        out += [ws.address for ws in s.workers.values() if str(ws.name) in wanted]
    if n:
        cands = sorted((ws for ws in s.workers.values() if ws.address not in out),
                       key=lambda ws: (len(ws.processing), ws.nbytes))
        out += [ws.address for ws in cands[:n]]
    return out
