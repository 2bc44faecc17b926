"""Scheduler state, continued: data moved in and out, stealing, retirement, periodic work.

A mixin of :class:`~hpcsched.core.scheduler_state.SchedulerState` (same rules:
events in, ``Send`` commands out, no clock). Kept apart because these move
work or data between workers without computing anything:

* scatter and replicas: ``update-data`` out, ``add-keys`` back;
* work stealing (``steal-request`` / ``steal-response``, planned each tick by
  :func:`hpcsched.core.policies.plan_steals`);
* graceful retirement: unique results are copied to survivors with most free
  memory (``acquire-replicas``), then the worker is sent ``close``;
* the tick: heartbeat timeouts (``worker_ttl``), retirement progress, steals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcsched.core import events as ev
from hpcsched.core import policies
from hpcsched.core.graph import key_split
from hpcsched.core.scheduler_model import TaskGroup, TaskState, WorkerInfo

if TYPE_CHECKING:
    from hpcsched.core.scheduler_state import SchedulerState  # noqa: F401

Key = Any


class MaintenanceMixin:
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

    # ================================================================ paused workers
    def _worker_status_change(self, e: ev.WorkerStatusChange) -> None:
        """A worker paused (memory past its pause fraction) or runs again. Paused, it is no
        candidate for new tasks (it is not "running"); what it holds already waits there
        (or is stolen). Resumed, its slots count as opened: queued tasks flow to it."""
        ws = self.workers.get(e.worker)
        if ws is None or e.status not in ("running", "paused") or ws.status == e.status \
                or ws.status not in ("running", "paused"):  # retiring: it stays so
            return
        ws.status = e.status
        self._running_cache = None
        if e.status == "running":
            self._push_free(ws)
            self._slots_opened[ws] = None

    # ================================================================ retirement
    def _retire_workers(self, e: ev.RetireWorkers) -> None:
        if self.recorder is not None and e.workers:
            self.recorder.event("retire-workers", list(e.workers), e.now)
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
