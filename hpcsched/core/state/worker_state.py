"""The worker as a pure state machine: events in, commands out.

Rules of this file: no sockets, threads or clocks (events carry ``now``); the
server runs ``Execute`` commands in its thread pool, ``GatherDep`` commands as
peer transfers, and sends ``Send(to="scheduler")`` messages batched.

Task states: released, waiting (for dependencies), fetch (to be fetched),
flight (being fetched), missing (no known holder), ready, executing,
long-running (seceded: runs without holding a thread slot), rejoining (seceded
and waiting for a slot again), memory, error. Ready tasks sit in a heap by
scheduler priority, so the dependents of a task that just finished run next
(depth-first, LIFO in effect).

Secede and rejoin follow dask.distributed ("Launch Tasks from Tasks"): a task
that waits on tasks it submitted gives its slot back (``Secede``), so that at
most ``nthreads`` tasks *hold slots* while any number may be running; the
scheduler is told (``long-running``) so that it sends more work. ``Rejoin``
queues the task for the next free slot, ahead of ready tasks (it has started);
``Resume`` tells the server it may go on.

Ranges of bulk maps (run by the server, :mod:`hpcsched.core.worker.ranges`) share the
``nthreads`` slots with tasks: the server says how many more threads its waiting ranges
want (``RangesWaiting``), a free slot that no ready task takes starts one
(``RunRanges``), and the slot is free again when that thread ends (``RangeThreadDone``).
So a one-thread worker never runs an element beside a task, and the scheduler can blame
the right one when the worker dies.

Data fetched only to feed local tasks is dropped as soon as no local task
needs it; results computed here (and replicas the scheduler asked for) stay
until the scheduler says ``free-keys``.

Memory: ``data`` is the mapping results are stored in, a dict or the server's
spill buffer (:mod:`hpcsched.core.worker.spill`: one with a ``store(key, value,
nbytes)`` method is given each result's size, measured once). ``PauseWorker``
(from the server's memory monitor) pauses the worker as dask's does: no task
starts and no dependency is fetched until it is resumed; tasks already running
go on; the scheduler is told (``worker-status-change``) so that it sends no new
work meanwhile.

Devices: a resource may be made of devices with ids (``devices={"GPU": ["0", "1"]}``,
the GPUs the worker found). A task restricted to ``k`` of it (a whole number) is given
``k`` distinct free ids as it starts (``Execute.devices``), the lowest first, and gives
them back when its thread ends, as it gives back the count; a fraction of a device
(``{"GPU": 0.5}``) is counted, and names no device.
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Callable, MutableMapping
from typing import Any

from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.state import events as ev
from hpcsched.core.state.events import SHORT_TASK, InvalidTransition

Key = Any

RUNNING = frozenset({"executing", "long-running", "rejoining"})  # a thread runs the task
NEEDS_DEPENDENCIES = RUNNING | {"waiting", "ready"}
_HELD = frozenset({"waiting", "fetch", "flight", "missing", "ready", "memory"}) | RUNNING

#: finish -> the states a task may reach it from (staying in a state is always allowed;
#: leaving "error", the task is forgotten at once)
LEGAL_TRANSITIONS: dict[str, frozenset[str]] = {
    # released, dropped, or taken back from a transfer or a run: from anything held
    "released": _HELD,
    "waiting": frozenset({"released"}),
    "ready": frozenset({"released", "waiting"}),
    "fetch": frozenset({"released", "missing"}),
    "flight": frozenset({"fetch"}),
    # no holder known, or the holder cannot send it
    "missing": frozenset({"released", "flight"}),
    "executing": frozenset({"ready", "rejoining"}),
    "long-running": frozenset({"executing"}),
    "rejoining": frozenset({"long-running"}),
    # computed, fetched, or given (scattered data replaces whatever the key was doing)
    "memory": _HELD | {"released"},
    "error": RUNNING,
}


class WTask:
    __slots__ = ("key", "state", "priority", "run_spec", "dependencies", "dependents",
                 "waiting_for_data", "who_has", "nbytes", "resource_restrictions", "duration",
                 "coming_from", "release_after", "keep", "report_replica", "seq", "gang",
                 "devices", "lease")

    def __init__(self, key: Key):
        self.key = key
        self.state = "released"
        self.priority: tuple = ()
        self.run_spec: Any = None
        self.dependencies: set[WTask] = set()
        self.dependents: set[WTask] = set()
        self.waiting_for_data: set[WTask] = set()
        self.who_has: set[str] = set()
        self.nbytes = -1
        self.resource_restrictions: dict | None = None
        self.duration = 0.0
        self.coming_from: str | None = None
        self.release_after = False  # released while executing / in flight
        self.keep = False  # computed here or asked for: kept until the scheduler frees it
        self.report_replica = False  # acquire-replicas: tell the scheduler once it is here
        self.seq = 0
        self.gang: tuple = ()  # a task holding many slots: every member's address
        self.devices: dict | None = None  # resource -> ids of the devices it holds, running
        self.lease: ev.GangLease | None = None  # and what its members share

    def __repr__(self) -> str:
        return f"<WTask {self.key!r} {self.state}>"


class WorkerState:
    """One worker's tasks: :meth:`handle` takes an event and returns the commands it causes
    (``Send`` records to the scheduler, ``Execute``, ``GatherDep``, ``Resume``)."""

    handlers = Handlers("worker state")

    def __init__(self, address: str, nthreads: int, resources: dict | None = None,
                 transfer_incoming_count_limit: int = 4,
                 transfer_message_bytes: int = 50_000_000, data: MutableMapping | None = None,
                 devices: dict | None = None):
        self.address = address
        self.nthreads = max(int(nthreads), 1)
        self.total_resources = dict(resources or {})
        self.available_resources = dict(self.total_resources)
        #: resource -> the ids of its devices (their order is the worker's); and the free ones
        self.devices = {r: tuple(ids) for r, ids in (devices or {}).items()}
        self.free_devices = {r: list(ids) for r, ids in self.devices.items()}
        for r, ids in self.devices.items():
            if len(ids) < self.total_resources.get(r, 0):
                raise ValueError(f"resource {r}={self.total_resources[r]:g} but only "
                                 f"{len(ids)} devices: {', '.join(ids)}")
        self.transfer_limit = transfer_incoming_count_limit
        self.transfer_message_bytes = transfer_message_bytes
        self.tasks: dict[Key, WTask] = {}
        self.data: MutableMapping = {} if data is None else data
        self._store = getattr(self.data, "store", None)  # a spill buffer takes our nbytes
        self.status = "running"  # running | paused
        self.ready: list[tuple[tuple, int, WTask]] = []
        self.constrained: list[tuple[tuple, int, WTask]] = []  # ready, needing resources
        self.executing: set[WTask] = set()  # tasks holding a thread slot
        self.range_threads = 0  # slots held by threads running ranges of bulk maps
        self.ranges_wanted = 0  # more range threads the server wants (RangesWaiting)
        self.long_running: set[WTask] = set()  # seceded tasks (also while rejoining)
        self.rejoining: list[WTask] = []  # seceded tasks waiting for a slot, first come first
        self.in_flight_workers: dict[str, set[WTask]] = {}
        self.fetch_queue: list[tuple[tuple, int, WTask]] = []
        self.busy_workers: set[str] = set()
        self._seq = itertools.count()
        self._out: list = []
        self.closing = False
        # (key, start, finish) of each state change, while someone watches them
        self.transitions: list | None = None
        self.on_transitions: Callable[[list, str], None] | None = None
        self._stimuli = itertools.count(1)  # names events that came without a stimulus_id
        self._table = self.handlers.bind(self)

    # ================================================================ dispatch
    def handle(self, event: Any) -> list:
        self._table[type(event)](event)
        self._ensure_communicating()
        self._ensure_computing()
        out, self._out = self._out, []
        if self.transitions and self.on_transitions is not None:
            changes, self.transitions = self.transitions, []
            self.on_transitions(changes, event.stimulus_id or self._name(event))
        return out

    def watch_transitions(self, callback: Callable[[list, str], None] | None) -> None:
        """Have ``callback(changes, stimulus_id)`` called after each event that changed task
        states, with the ``(key, start, finish)`` of each change in order (``finish`` is
        "forgotten" when the task is dropped) and the event's ``stimulus_id``; ``None``
        stops it. Off (the default), a change costs one test; on, the state is consistent
        when the callback runs."""
        self.on_transitions = callback
        self.transitions = [] if callback is not None else None

    def _name(self, event: Any) -> str:
        """A ``stimulus_id`` for an event the server made without one (a task's result, a
        transfer): named only when someone watches, so that the per-task path pays nothing
        for it. As distributed's, e.g. ``execute-success-12``. The event itself is left as
        it is (a frozen record cannot take it)."""
        kind = _KINDS.get(type(event))
        if kind is None:
            kind = _KINDS[type(event)] = re.sub(r"(?<!^)(?=[A-Z])", "-",
                                                type(event).__name__).lower()
        return f"{kind}-{next(self._stimuli)}"

    def _set_state(self, ts: WTask, finish: str) -> None:
        """Move ``ts`` to ``finish``: the one place a task's state changes here. A move
        :data:`LEGAL_TRANSITIONS` does not allow raises :class:`InvalidTransition`."""
        start = ts.state
        if start != finish:
            if start not in LEGAL_TRANSITIONS[finish]:
                raise InvalidTransition(f"worker {self.address}: {ts.key!r}: {start} -> {finish}")
            if self.transitions is not None:
                self.transitions.append((ts.key, start, finish))
            ts.state = finish

    def _forget(self, ts: WTask) -> None:
        if self.tasks.pop(ts.key, None) is ts and self.transitions is not None:
            self.transitions.append((ts.key, ts.state, "forgotten"))

    def _to_scheduler(self, record: Any) -> None:
        self._out.append(ev.Send("scheduler", record))

    def _ensure_task(self, key: Key) -> WTask:
        ts = self.tasks.get(key)
        if ts is None:
            ts = self.tasks[key] = WTask(key)
            if key in self.data:  # an element of a bulk map held here: a task from now on
                self._set_state(ts, "memory")
                ts.keep = True
        return ts

    # ================================================================ scheduler events
    @handlers.on(ev.ComputeTask)
    def _compute_task(self, e: ev.ComputeTask) -> None:
        ts = self._ensure_task(e.key)
        if ts.state == "memory":
            ts.keep = True
            self._to_scheduler(ev.TaskFinished(self.address, ts.key, ts.nbytes,
                                               type(self.data.get(ts.key)).__name__))
            return
        if ts.state in NEEDS_DEPENDENCIES:
            ts.release_after = False
            return
        if ts.state in ("fetch", "flight", "missing"):
            # we were fetching it as someone's dependency; computing it is what we're asked now
            if ts.state == "flight":
                ts.release_after = True  # drop the transfer's copy
            self._set_state(ts, "released")
        ts.run_spec = e.run_spec
        ts.priority = tuple(e.priority)
        ts.duration = e.duration
        ts.keep = True
        ts.release_after = False
        ts.resource_restrictions = e.resource_restrictions
        ts.gang = tuple(e.gang)
        ts.lease = ev.GangLease(e.comm, tuple(e.free_comms), tuple(e.hosts)) if e.gang else None
        ts.waiting_for_data = set()
        for dep_key, holders in (e.who_has or {}).items():
            dts = self._ensure_task(dep_key)
            ts.dependencies.add(dts)
            dts.dependents.add(ts)
            if dts.state == "memory":
                continue
            ts.waiting_for_data.add(dts)
            dts.who_has.update(h for h in holders if h != self.address)
            if e.nbytes and dep_key in e.nbytes:
                dts.nbytes = e.nbytes[dep_key]
            if dts.priority == () or ts.priority < dts.priority:
                dts.priority = ts.priority
            if dts.state == "released":
                self._to_fetch(dts)
        if ts.waiting_for_data:
            self._set_state(ts, "waiting")
        else:
            self._to_ready(ts)

    def _to_fetch(self, ts: WTask) -> None:
        if ts.who_has:
            self._set_state(ts, "fetch")
            ts.seq = next(self._seq)
            heapq.heappush(self.fetch_queue, (ts.priority, ts.seq, ts))
        else:
            self._set_state(ts, "missing")

    def _to_ready(self, ts: WTask) -> None:
        self._set_state(ts, "ready")
        ts.seq = next(self._seq)
        heap = self.constrained if ts.resource_restrictions else self.ready
        heapq.heappush(heap, (ts.priority, ts.seq, ts))

    @handlers.on(ev.FreeKeys)
    def _free_keys(self, e: ev.FreeKeys) -> None:
        elements = []  # of bulk maps: their results are held without a task
        running = []  # tasks a thread runs here: one may stop early (Interrupt)
        for key in e.keys:
            ts = self.tasks.get(key)
            if ts is None:
                elements.append(key)
                continue
            if ts.state in RUNNING:
                running.append(key)
            ts.keep = False
            ts.report_replica = False
            self._release(ts)
        if running or elements:
            # the elements too: one of a range not started yet will not run (RangeRunner);
            # a task held in memory, the common case, makes no command at all
            self._out.append(ev.Interrupt(running + elements))
        if elements:
            discard = getattr(self.data, "discard_many", None)  # a spill buffer: one lock
            if discard is not None:
                discard(elements)
            else:
                for key in elements:
                    self.data.pop(key, None)

    def _release(self, ts: WTask) -> None:
        """Forget ``ts`` unless a local task still needs it as a dependency."""
        if ts.state in RUNNING or ts.state == "flight":
            ts.release_after = True
            return
        if ts.state in ("memory", "fetch", "missing") and self._needed(ts):
            return  # still feeds a local task
        if ts.state in ("ready", "waiting"):
            for dts in list(ts.dependencies):
                dts.dependents.discard(ts)
                if not dts.keep and not self._needed(dts):
                    self._release(dts)
            ts.dependencies.clear()
            ts.waiting_for_data.clear()
        self.data.pop(ts.key, None)
        self._set_state(ts, "released")
        ts.release_after = False
        if not ts.dependents:
            self._forget(ts)

    def _needed(self, ts: WTask) -> bool:
        return any(d.state in NEEDS_DEPENDENCIES for d in ts.dependents)

    @handlers.on(ev.StealRequest)
    def _steal_request(self, e: ev.StealRequest) -> None:
        ts = self.tasks.get(e.key)
        state = ts.state if ts is not None else "released"
        if ts is not None and state in ("waiting", "ready"):
            ts.keep = False
            self._release(ts)
            state = "released"
        self._to_scheduler(ev.StealResponse(self.address, e.key, state))

    @handlers.on(ev.AcquireReplicas)
    def _acquire_replicas(self, e: ev.AcquireReplicas) -> None:
        for key, holders in e.who_has.items():
            ts = self._ensure_task(key)
            ts.keep = True
            if ts.state == "memory":
                self._to_scheduler(ev.AddKeys(self.address, {key: ts.nbytes}))
                continue
            ts.report_replica = True
            ts.who_has.update(h for h in holders if h != self.address)
            if key in e.nbytes:
                ts.nbytes = e.nbytes[key]
            if ts.state in ("released", "missing"):
                if ts.priority == ():
                    ts.priority = (float("inf"),)
                self._to_fetch(ts)

    @handlers.on(ev.RefreshWhoHas)
    def _refresh_who_has(self, e: ev.RefreshWhoHas) -> None:
        for key, holders in e.who_has.items():
            ts = self.tasks.get(key)
            if ts is None:
                continue
            ts.who_has = {h for h in holders if h != self.address}
            if ts.state == "missing":
                self._to_fetch(ts)

    @handlers.on(ev.UpdateData)
    def _update_data(self, e: ev.UpdateData) -> None:
        report = {}
        for key, value in e.data.items():
            ts = self._ensure_task(key)
            nbytes = _sizeof(value)
            self._put(ts, value, nbytes)
            ts.keep = True
            report[key] = nbytes
        self._to_scheduler(ev.AddKeys(self.address, report, e.scatter_id))

    # ================================================================ results
    def _put(self, ts: WTask, value: Any, nbytes: int) -> None:
        if self._store is None:
            self.data[ts.key] = value
        else:
            self._store(ts.key, value, nbytes)
        ts.nbytes = nbytes
        self._set_state(ts, "memory")
        for dts in ts.dependents:
            if ts in dts.waiting_for_data:
                dts.waiting_for_data.discard(ts)
                if not dts.waiting_for_data and dts.state == "waiting":
                    self._to_ready(dts)

    def _done_with_dependencies(self, ts: WTask) -> None:
        for dts in ts.dependencies:
            dts.dependents.discard(ts)
            if not dts.keep and not self._needed(dts):
                self._release(dts)
        ts.dependencies.clear()

    @handlers.on(ev.ExecuteSuccess)
    def _execute_success(self, e: ev.ExecuteSuccess) -> None:
        ts = self.tasks.get(e.key)
        if ts is None or ts.state not in RUNNING:
            return
        self._finish_executing(ts)
        if ts.release_after:
            self._done_with_dependencies(ts)
            self._set_state(ts, "released")
            ts.release_after = False
            ts.keep = False
            self._gang_part_ended(ts, e)
            if not ts.dependents:
                self._forget(ts)
            return
        if ts.gang and ts.gang[0] != self.address:
            # a gang's other member: the task's result is its first member's; this one's
            # value is dropped, never held under the key (a dependent here must fetch it)
            self._done_with_dependencies(ts)
            self._set_state(ts, "released")
            ts.keep = False
            self._gang_part_ended(ts, e)
            if not ts.dependents:
                self._forget(ts)
            return
        self._put(ts, e.value, e.nbytes)
        self._done_with_dependencies(ts)
        self._to_scheduler(ev.TaskFinished(self.address, ts.key, e.nbytes, e.typename,
                                           e.start, e.stop, e.cpu, e.memory))

    @handlers.on(ev.ExecuteFailure)
    def _execute_failure(self, e: ev.ExecuteFailure) -> None:
        ts = self.tasks.get(e.key)
        if ts is None or ts.state not in RUNNING:
            return
        self._finish_executing(ts)
        self._done_with_dependencies(ts)
        if ts.release_after:
            self._set_state(ts, "released")
            self._gang_part_ended(ts, e)
            self._forget(ts)
            return
        self._set_state(ts, "error")
        ts.keep = False
        self._to_scheduler(ev.TaskErred(self.address, ts.key, e.exception, e.traceback,
                                        e.exception_text, e.start, e.stop, e.cpu, e.memory))
        self._forget(ts)

    def _gang_part_ended(self, ts: WTask, e: ev.ExecuteSuccess | ev.ExecuteFailure) -> None:
        """This worker's part of a gang ended without a result to hold (another member's
        is the task's, or the task was freed while it ran): the scheduler hears it, as a
        member of a failed gang is given no work until then."""
        if ts.gang:
            self._to_scheduler(ev.TaskFinished(self.address, ts.key, 0, "NoneType",
                                               e.start, e.stop))

    def _finish_executing(self, ts: WTask) -> None:
        self.executing.discard(ts)
        self.long_running.discard(ts)
        if ts.state == "rejoining":
            self.rejoining.remove(ts)
        if ts.resource_restrictions:
            for r, q in ts.resource_restrictions.items():
                self.available_resources[r] = self.available_resources.get(r, 0) + q
        if ts.devices:
            for r, ids in ts.devices.items():
                order = self.devices[r]
                self.free_devices[r] = sorted([*self.free_devices[r], *ids], key=order.index)
            ts.devices = None

    def _take_devices(self, ts: WTask) -> dict | None:
        """The devices ``ts`` is given as it starts: for each of its resources made of
        devices, as many free ids as it asks for (a whole number), the lowest first."""
        out = None
        for r, q in (ts.resource_restrictions or {}).items():
            free = self.free_devices.get(r)
            if free is None or q != int(q) or q < 1:
                continue
            n = int(q)
            out = out or {}
            out[r], self.free_devices[r] = tuple(free[:n]), free[n:]
        return out

    @handlers.on(ev.GatherDepSuccess)
    def _gather_dep_success(self, e: ev.GatherDepSuccess) -> None:
        tasks = self.in_flight_workers.pop(e.worker, set())
        self.busy_workers.discard(e.worker)
        replicas = {}
        for ts in tasks:
            if ts.state in NEEDS_DEPENDENCIES:
                continue  # compute-task arrived while in flight: our own run will produce it
            if ts.key in e.errors:
                self._unobtainable(ts, e.worker)
            elif ts.key in e.data:
                value = e.data[ts.key]
                if ts.release_after or ts.state != "flight":
                    ts.release_after = False
                    if ts.state == "flight":
                        self._set_state(ts, "released")
                    if not ts.keep and not self._needed(ts):
                        self._release(ts)
                        continue
                nbytes = ts.nbytes if ts.nbytes >= 0 else _sizeof(value)
                self._put(ts, value, nbytes)
                if ts.report_replica:
                    ts.report_replica = False
                    replicas[ts.key] = nbytes
            else:
                self._peer_lacks(ts, e.worker)
        if replicas:
            self._to_scheduler(ev.AddKeys(self.address, replicas))

    def _unobtainable(self, ts: WTask, worker: str) -> None:
        """``worker`` holds ``ts`` but cannot serialize it; it tells the scheduler, which errs
        ``ts`` and our tasks needing it (their ``free-keys`` follow). Not "missing": that
        would have the scheduler recompute a result that fails the same way."""
        ts.who_has.discard(worker)
        ts.release_after = False
        self._set_state(ts, "missing")
        if not ts.keep and not self._needed(ts):
            self._release(ts)

    def _peer_lacks(self, ts: WTask, worker: str) -> None:
        ts.who_has.discard(worker)
        if ts.release_after:
            ts.release_after = False
            self._set_state(ts, "released")
            if not ts.keep and not self._needed(ts):
                self._release(ts)
                return
        if ts.state not in ("flight", "released", "fetch", "missing"):
            return
        self._to_scheduler(ev.MissingData(self.address, ts.key, worker))
        self._set_state(ts, "released")
        self._to_fetch(ts)

    @handlers.on(ev.GatherDepFailure)
    def _gather_dep_failure(self, e: ev.GatherDepFailure) -> None:
        tasks = self.in_flight_workers.pop(e.worker, set())
        self.busy_workers.discard(e.worker)
        # the peer is gone: forget it as a holder of anything
        for ts in self.tasks.values():
            ts.who_has.discard(e.worker)
        for ts in tasks:
            ts.who_has.add(e.worker)  # so that _peer_lacks reports it
            self._peer_lacks(ts, e.worker)

    # ================================================================ secede / rejoin
    @handlers.on(ev.Secede)
    def _secede(self, e: ev.Secede) -> None:
        ts = self.tasks.get(e.key)
        if ts is None or ts.state != "executing":
            return
        self.executing.discard(ts)
        self.long_running.add(ts)
        self._set_state(ts, "long-running")
        self._to_scheduler(ev.LongRunning(self.address, ts.key, e.compute_duration))

    @handlers.on(ev.Rejoin)
    def _rejoin(self, e: ev.Rejoin) -> None:
        ts = self.tasks.get(e.key)
        if ts is None or ts.state != "long-running":
            # not seceded (or released meanwhile): nothing to wait for
            self._out.append(ev.Resume(e.key))
            return
        self._set_state(ts, "rejoining")
        self.rejoining.append(ts)

    @handlers.on(ev.ServeFailed)
    def _serve_failed(self, e: ev.ServeFailed) -> None:
        ts = self.tasks.get(e.key)
        if ts is None or ts.state != "memory":
            return
        self._to_scheduler(ev.ResultErred(self.address, ts.key, e.exception, e.traceback,
                                          e.exception_text))

    @handlers.on(ev.PauseWorker)
    def _pause(self, e: ev.PauseWorker) -> None:
        status = "paused" if e.paused else "running"
        if status != self.status:
            self.status = status
            self._to_scheduler(ev.WorkerStatusChange(self.address, status))

    @handlers.on(ev.RangesWaiting)
    def _ranges_waiting(self, e: ev.RangesWaiting) -> None:
        self.ranges_wanted = e.threads

    @handlers.on(ev.RangeThreadDone)
    def _range_thread_done(self, e: ev.RangeThreadDone) -> None:
        self.range_threads -= 1
        self.ranges_wanted = e.threads

    # ================================================================ progress
    def _ensure_computing(self) -> None:
        # seceded tasks that rejoin have started already: they take free slots first
        while self.rejoining and len(self.executing) + self.range_threads < self.nthreads:
            ts = self.rejoining.pop(0)
            self.long_running.discard(ts)
            self.executing.add(ts)
            self._set_state(ts, "executing")
            self._out.append(ev.Resume(ts.key))
        # tasks with resource restrictions wait in their own heap, so that one waiting for a
        # busy resource does not keep free threads from running unrestricted tasks
        while len(self.executing) + self.range_threads < self.nthreads and not self.closing \
                and self.status == "running":
            head = self._head(self.ready)
            chead = self._head(self.constrained)
            if chead is not None and not all(
                    self.available_resources.get(r, 0) >= q
                    for r, q in chead[2].resource_restrictions.items()):
                chead = None  # wait for resources; highest priority first among them
            if head is None and chead is None:
                break
            if chead is not None and (head is None or chead[:2] < head[:2]):
                _, _, ts = heapq.heappop(self.constrained)
                for r, q in (ts.resource_restrictions or {}).items():  # in this heap: a dict
                    self.available_resources[r] = self.available_resources.get(r, 0) - q
                ts.devices = self._take_devices(ts) if self.free_devices else None
            else:
                _, _, ts = heapq.heappop(self.ready)
            self._set_state(ts, "executing")
            self.executing.add(ts)
            announced = ts.duration >= SHORT_TASK
            if announced:
                # lets the scheduler blame exactly this task if the worker dies now; for
                # tasks known to be short, one message fewer per task matters more
                self._to_scheduler(ev.TaskStarted(self.address, ts.key))
            self._out.append(ev.Execute(ts.key, ts.run_spec, announced, ts.gang,
                                        ts.devices, ts.lease))
        # ready tasks go first: a thread of ranges gives its slot up between two ranges
        # when a task waits, and its ranges wait for the next free slot
        while self.ranges_wanted > 0 and len(self.executing) + self.range_threads \
                < self.nthreads and not self.closing and self.status == "running":
            self.ranges_wanted -= 1
            self.range_threads += 1
            self._out.append(ev.RunRanges())

    def _head(self, heap: list) -> tuple | None:
        """The first live entry of a ready heap (stale entries are dropped)."""
        while heap:
            _, seq, ts = heap[0]
            if ts.state == "ready" and ts.seq == seq and self.tasks.get(ts.key) is ts:
                return heap[0]
            heapq.heappop(heap)
        return None

    def _ensure_communicating(self) -> None:
        if self.status != "running":
            return  # paused: fetched data would only add to the memory that paused us
        deferred = []
        while self.fetch_queue and len(self.in_flight_workers) < self.transfer_limit:
            _, seq, ts = heapq.heappop(self.fetch_queue)
            if ts.state != "fetch" or ts.seq != seq or self.tasks.get(ts.key) is not ts:
                continue
            holders = [w for w in ts.who_has if w not in self.in_flight_workers]
            if not holders:
                deferred.append((ts.priority, seq, ts))
                continue
            worker = min(holders)  # deterministic; peers are symmetric here
            batch = {ts}
            total = max(ts.nbytes, 0)
            # more keys from the same peer in one message
            for _, _, other in self.fetch_queue:
                if total >= self.transfer_message_bytes:
                    break
                if other.state == "fetch" and worker in other.who_has and other not in batch:
                    batch.add(other)
                    total += max(other.nbytes, 0)
            for t in batch:
                self._set_state(t, "flight")
                t.coming_from = worker
            self.in_flight_workers[worker] = batch
            self._out.append(ev.GatherDep(worker, [t.key for t in batch]))
        for item in deferred:
            heapq.heappush(self.fetch_queue, item)

    # ================================================================ invariants
    def validate(self) -> None:
        for key, ts in self.tasks.items():
            assert ts.key == key
            if ts.state == "memory":
                assert key in self.data, ts
            else:
                assert key not in self.data, ts
            if ts.state == "executing":
                assert ts in self.executing, ts
            if ts.state in ("long-running", "rejoining"):
                assert ts in self.long_running and ts not in self.executing, ts
            assert (ts in self.rejoining) == (ts.state == "rejoining"), ts
            if ts.state == "waiting":
                assert ts.waiting_for_data, ts
                for dts in ts.waiting_for_data:
                    assert dts.state != "memory", (ts, dts)
            if ts.state == "flight":
                assert ts.coming_from in self.in_flight_workers, ts
        for ts in self.executing:
            assert ts.state == "executing", ts
        for ts in self.long_running:
            assert ts.state in ("long-running", "rejoining"), ts
        assert len(self.executing) + self.range_threads <= self.nthreads
        # each device is free or held by one running task
        for r, ids in self.devices.items():
            held = [i for ts in self.executing | self.long_running if ts.devices
                    for i in ts.devices.get(r, ())]
            assert sorted(held + self.free_devices[r]) == sorted(ids), (r, held)
        for w, tasks in self.in_flight_workers.items():
            for ts in tasks:
                assert ts.coming_from == w


_KINDS: dict[type, str] = {}  # event class -> its stimulus ids' prefix


def _sizeof(value: Any) -> int:
    from hpcsched.core.protocol.serialize import sizeof

    return sizeof(value)

