"""The scheduler's task graph: tasks, task groups, and every change of a task's state.

:class:`TaskGraph` owns the tasks (``{key: TaskState}``), their groups, the
generation of the newest graph, and the transitions:

* :meth:`TaskGraph.transition` is the one place a task's state changes. It checks
  the move against :data:`~.model.ALLOWED_TRANSITIONS`, undoes what the old state
  entered (a worker's slot, the queue, the no-worker set) and appends
  ``(key, start, finish, stimulus_id, now)`` to ``transition_log``: the
  ``stimulus_id`` of the event being handled, so that each change can be traced
  to its cause, as in distributed's scheduler
  (https://distributed.dask.org/en/stable/scheduling-state.html).
* :meth:`TaskGraph.transitions` runs recommendations ``(task, finish)`` from a LIFO
  stack, so that work made ready by a finished task is handled first. Each is
  looked up by the task's current state in a ``(start, finish) -> method`` table
  (declared with ``@_on(start, finish)`` at each method); a pair the table lacks
  is a recommendation that no longer applies (the task moved on meanwhile) and is
  dropped. A method returns the recommendations its move causes.

Recommendations go to ``waiting``, ``processing`` (the task is ready: a worker, the
queue or no-worker, as :class:`~.placement.Placement` decides), ``released`` and
``forgotten``. Where a ready task goes is the placement's decision; which workers
exist is the :class:`~.registry.WorkerRegistry`'s; what is sent goes to the shared
:class:`~.model.Outbox`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable
from operator import attrgetter
from typing import Any

from hpcsched.core.protocol.messages import ComputeTask, FreeKeys, KeyInMemory, TaskErredReport
from hpcsched.core.protocol.messages import LostData as LostDataReport
from hpcsched.core.state.events import SHORT_TASK, InvalidTransition
from hpcsched.core.state.model import (
    ALLOWED_TRANSITIONS,
    FIRE_AND_FORGET,
    LostData,
    Outbox,
    Rec,
    TaskGroup,
    TaskState,
    WorkerInfo,
)
from hpcsched.core.state.placement import Placement
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.settings import SchedulerSettings

Key = Any
#: one entry of ``transition_log``: (key, start, finish, stimulus_id, now)
Transition = tuple[Key, str, str, str, float]

_LEAVE = frozenset({"processing", "queued", "no-worker"})
_PENDING = ("waiting", "processing", "queued", "no-worker")
_HELD_OR_PENDING = frozenset({"memory", *_PENDING})
_RELEASABLE = frozenset({"memory", "erred", *_PENDING})

#: (start, finish) -> the method that moves a task recommended to ``finish`` from ``start``
_TRANSITIONS: dict[tuple[str, str], Callable[..., list[Rec]]] = {}


_priority = attrgetter("priority")


def by_priority(tasks: set[TaskState]) -> Iterable[TaskState]:
    """``tasks`` in priority order: where a walk's recommendations would otherwise follow
    a set's order, which changes with the objects' addresses from run to run, and a
    replay under the same seed must decide the same way."""
    return sorted(tasks, key=_priority) if len(tasks) > 1 else tasks


def _on(*pairs: tuple[str, str]) -> Callable[[Callable[..., list[Rec]]],
                                            Callable[..., list[Rec]]]:
    """Decorator: the method handles the recommendations ``pairs`` of (start, finish)."""

    def register(fn: Callable[..., list[Rec]]) -> Callable[..., list[Rec]]:
        for pair in pairs:
            assert pair not in _TRANSITIONS, pair
            _TRANSITIONS[pair] = fn
        return fn

    return register


class TaskGraph:
    """The tasks and their transitions (see the module's docstring)."""

    def __init__(self, registry: WorkerRegistry, placement: Placement, out: Outbox,
                 settings: SchedulerSettings):
        self.registry = registry
        self.placement = placement
        self.out = out
        self.unknown_task_duration = settings.unknown_task_duration
        # key -> TaskState: a plain dict, whose lookups never create a task; an element of
        # a bulk map becomes one only through :meth:`promote`
        self.tasks: dict[Key, TaskState] = {}
        # key -> the element ``key`` made a task, or None (set by the owner of the bulk maps)
        self.promote_element: Callable[[Key], TaskState | None] | None = None
        self.groups: dict[str, TaskGroup] = {}
        self.generation = 0  # of the newest graph: the first part of its tasks' priorities
        # the newest transitions, bounded as distributed's (its ``low-level-log-length``
        # defaults to 1000): a long log keeps objects alive that every full garbage
        # collection then scans
        self.transition_log: deque[Transition] = deque(maxlen=settings.transition_log_length)
        # every transition also goes here while a list is set (the server sets one while
        # scheduler plugins want ``transition`` calls, and empties it after each event)
        self.transition_listener: list[Transition] | None = None
        # while set, tasks recommended to "processing" wait here (see transitions)
        self.deferred_ready: list[TaskState] | None = None
        # wide task -> the workers whose slots it holds while it runs, the first running it
        # (its ``processing_on``); a one-slot task is never here
        self.leases: dict[TaskState, tuple[WorkerInfo, ...]] = {}
        # wide task -> the members other than the first that said their part finished
        # (their value is dropped: the task's result is the first member's)
        self.members_done: dict[TaskState, set[WorkerInfo]] = {}
        # wide task -> the communicator its members use (made once per member set)
        self.comms = GangComms(settings.gang_comms_per_worker)
        self.comm_of: dict[TaskState, int] = {}
        # tasks of queued bulk-map elements: they wait until their range goes to a worker
        # (Promotions.resolve, bulk/promotion.py), never placed here
        self.held: set[TaskState] = set()
        # the thief planned for each task being stolen (Maintenance.steal): one entry per
        # task whose ``stealing`` is set, dropped when it leaves processing however it does
        # (finished by its victim first, the victim gone), not only on a steal-response
        self.steal_targets: dict[Key, WorkerInfo] = {}
        self._table = {pair: fn.__get__(self) for pair, fn in _TRANSITIONS.items()}

    # ================================================================ tasks
    def new_task(self, key: Key, run_spec: Any, group_name: str) -> TaskState:
        """A new task ``key`` of the group ``group_name`` (released)."""
        tg = self.groups.get(group_name)
        if tg is None:
            tg = self.groups[group_name] = TaskGroup(group_name)
        ts = self.tasks[key] = TaskState(key, run_spec, tg)
        tg.n_tasks += 1
        return ts

    def promote(self, key: Key) -> TaskState | None:
        """The task ``key``; an element of a bulk map (:mod:`.bulk`) is made one. The one
        way an element becomes a task, called by the handlers that must treat it as one:
        it failed, is a dependency of a new task, is wanted by a client (a future passed
        on, a dataset), cancelled, retried, seceded, or its result is lost, moved or
        reported by a worker that registers again. A lookup in :attr:`tasks` never does
        it: views (``who_has``, ``has_what``, metrics) ask the maps beside the tasks."""
        ts = self.tasks.get(key)
        if ts is None and self.promote_element is not None:
            ts = self.promote_element(key)
        return ts

    def new_generation(self) -> int:
        """A graph arrives: its tasks come after every task of the earlier ones."""
        self.generation += 1
        return self.generation

    @staticmethod
    def wanted(ts: TaskState) -> bool:
        """Whether a client, or a task still to run, wants ``ts``'s result."""
        return bool(ts.who_wants or ts.waiters)

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
                self._exit_processing(ts, notify)
            elif start == "queued":
                self.placement.leave_queue(ts)
            else:
                self.placement.leave_unrunnable(ts)
        ts.state = finish
        out = self.out
        entry = (ts.key, start, finish, stimulus_id or out.stimulus_id, out.now)
        self.transition_log.append(entry)
        if self.transition_listener is not None:
            self.transition_listener.append(entry)

    def transitions(self, recs: list[Rec]) -> None:
        """Run recommendations, LIFO: (task, "waiting" | "processing" | "released" |
        "forgotten"), each by the method of the table for (its state, the finish). The
        tasks they make ready are placed last, in priority order rather than in the order
        the walk reached them (which follows sets, and a replay under the same seed must
        decide the same way): with queuing the first ones take the free slots, with
        co-assignment consecutive ones share a worker."""
        if self.deferred_ready is not None:  # inside a walk: its end places them
            self._run(recs)
            return
        if not recs:
            return
        ready: list[TaskState] = []
        self.deferred_ready = ready
        try:
            self._run(recs)
        finally:
            self.deferred_ready = None
        if len(ready) > 1:
            ready.sort(key=_priority)
            self._run([(ts, "processing") for ts in ready])
        elif ready:  # one, the common case of an event
            self._run([(ready[0], "processing")])

    def retry_no_worker(self) -> None:
        """Slots opened, or a worker joined or resumed: the no-worker tasks may run now.
        Each narrow one is tried again; wide ones only while the best one waiting starts
        (the others wait behind it), so the cost is in the tasks that may start."""
        placement = self.placement
        if placement.unrunnable:
            self.transitions([(ts, "processing") for ts in list(placement.unrunnable)])
        tried = None
        while placement.gangs and (ts := placement.next_gang()) is not None \
                and ts is not tried:  # (no wide task waiting: no call, the common case)
            tried = ts
            self.transitions([(ts, "processing")])

    def _run(self, recs: list[Rec]) -> None:
        """:meth:`transitions`' walk: ready tasks go to :attr:`deferred_ready` while it is set."""
        stack = recs[::-1] if len(recs) > 1 else list(recs)
        table = self._table
        tasks = self.tasks
        deferred = self.deferred_ready
        while stack:
            ts, finish = stack.pop()
            if tasks.get(ts.key) is not ts:
                continue
            if finish == "processing" and deferred is not None:
                deferred.append(ts)
                continue
            fn = table.get((ts.state, finish))
            if fn is None:
                if finish not in _FINISHES:  # pragma: no cover - programming error
                    raise ValueError(f"bad recommendation {finish!r} for {ts!r}")
                continue  # it moved on since it was recommended
            new = fn(ts)
            if new:
                stack.extend(reversed(new))

    @_on(("released", "waiting"))
    def _released_waiting(self, ts: TaskState) -> list[Rec]:
        if not self.wanted(ts):
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
        if not ts.waiting_on and ts not in self.held:
            recs.append((ts, "processing"))
        return recs

    @_on(("waiting", "processing"), ("no-worker", "processing"))
    def _ready(self, ts: TaskState) -> list[Rec]:
        """All dependencies are in memory: processing, queued or no-worker."""
        if ts.waiting_on or ts in self.held:
            return []
        placement = self.placement
        if ts.width > 1:
            members = placement.decide_gang(ts)
            if members is not None:
                self.add_to_processing(ts, members[0], members=members)
            elif ts.state != "no-worker":
                self.transition(ts, "no-worker")
                placement.add_unrunnable(ts)
            return []
        if placement.reserving is not None and placement.holds_back(ts.priority):
            if ts.state == "no-worker":
                placement.leave_unrunnable(ts)
            else:
                self.transition(ts, "no-worker")
            placement.hold_back(ts)
            return []
        ws = placement.decide_worker(ts)
        if ws is not None:
            self.add_to_processing(ts, ws)
        elif placement.should_queue(ts):
            self.transition(ts, "queued")
            placement.enqueue(ts)
        elif ts.state != "no-worker":
            self.transition(ts, "no-worker")
            placement.add_unrunnable(ts)
        return []

    @_on(("released", "released"))
    def _released_released(self, ts: TaskState) -> list[Rec]:
        return [] if self.wanted(ts) else [(ts, "forgotten")]

    @_on(("memory", "released"))
    def _memory_released(self, ts: TaskState) -> list[Rec]:
        recs: list[Rec] = []
        for ws in list(ts.who_has):
            self.out.send(ws.address, FreeKeys([ts.key]))
            self.remove_replica(ts, ws)
        dependents = ts.dependents  # by_priority() inline: each result released comes here
        for dts in sorted(dependents, key=_priority) if len(dependents) > 1 else dependents:
            if dts.state in _PENDING:
                dts.waiting_on.add(ts)
                if dts.state != "waiting":
                    recs.append((dts, "released"))
        return self._released(ts, recs)

    @_on(("erred", "released"))
    def _erred_released(self, ts: TaskState) -> list[Rec]:
        ts.exception = None
        ts.traceback = ts.exception_text = ""
        ts.exception_blame = None
        return self._released(ts, [])

    @_on(*((start, "released") for start in _PENDING))
    def _pending_released(self, ts: TaskState) -> list[Rec]:
        recs: list[Rec] = []
        for dts in ts.dependencies:
            dts.waiters.discard(ts)
            if not self.wanted(dts) and dts.state in _RELEASABLE:
                recs.append((dts, "released"))
        ts.waiting_on.clear()
        return self._released(ts, recs)

    def _released(self, ts: TaskState, recs: list[Rec]) -> list[Rec]:
        self.transition(ts, "released", notify=True)
        recs.append((ts, "waiting") if self.wanted(ts) else (ts, "forgotten"))
        return recs

    @_on(("released", "forgotten"))
    def _forget(self, ts: TaskState) -> list[Rec]:
        if self.wanted(ts):
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
        del self.tasks[ts.key]
        self.held.discard(ts)
        ts.group.n_tasks -= 1
        if ts.group.n_tasks <= 0:
            self.groups.pop(ts.group.name, None)
        self.placement.forget(ts.key)
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
                recs.append((dts, "processing"))
        if len(recs) > 1:
            recs.sort(key=lambda r: r[0].priority)  # several made ready: best priority first
        for dts in ts.dependencies:
            dts.waiters.discard(ts)
            if not dts.waiters and not dts.who_wants and dts.state in _RELEASABLE:
                recs.append((dts, "released"))
        ts.who_wants.discard(FIRE_AND_FORGET)
        for client in ts.who_wants:
            self.out.send(client, KeyInMemory(ts.key, ts.typename))
        if not self.wanted(ts):
            recs.append((ts, "released"))
        return recs

    def lose(self, ts: TaskState, why: str) -> list[Rec]:
        """``ts`` was in memory and its last copy is gone: recompute, or err if it cannot."""
        self.transition(ts, "released")
        recs: list[Rec] = []
        for client in ts.who_wants:
            self.out.send(client, LostDataReport(ts.key))
        for dts in by_priority(ts.dependents):
            if dts.state in _PENDING:
                dts.waiting_on.add(ts)
                if dts.state != "waiting":  # it was ready: it waits for ts again
                    recs.append((dts, "released"))
        if not self.wanted(ts):
            recs.append((ts, "forgotten"))  # nobody needs it again: not recomputed
        elif ts.run_spec is None:
            exc = LostData(f"data of {ts.key!r} was scattered and is lost: {why}")
            recs += self.set_erred(ts, exc, "", str(exc))
        else:
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
                if not dts.waiters and not dts.who_wants and dts.state in _HELD_OR_PENDING:
                    recs.append((dts, "released"))
            t.who_wants.discard(FIRE_AND_FORGET)
            if t.who_wants:
                self.report_erred(t, list(t.who_wants))
            for dts in by_priority(t.dependents):
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
            self.out.send(c, TaskErredReport(ts.key, ts.exception, ts.traceback,
                                             ts.exception_text, origin.key))

    # ================================================================ processing
    def add_to_processing(self, ts: TaskState, ws: WorkerInfo, send: bool = True,
                          members: list[WorkerInfo] | None = None) -> None:
        """Give ``ts`` to ``ws`` (a ``compute-task`` carrying where its dependencies are;
        ``send=False``: ``ws`` runs it already, as an element of a bulk map). A wide task
        holds a slot on each of ``members`` (``ws`` first) until it leaves processing:
        each counts it as a task it runs."""
        avg = ts.group.average_duration
        est = self.unknown_task_duration if avg is None else avg
        self.transition(ts, "processing")
        ts.processing_on = ws
        ws.processing[ts] = est
        ws.occupancy += est
        if members is not None:
            self.leases[ts] = tuple(members)
            self.comm_of[ts] = comm = self.comms.take(tuple(w.address for w in members))
            for other in members[1:]:
                other.processing[ts] = est
                other.occupancy += est
                self.placement.push_free(other)
        if len(ws.processing) > ws.nthreads:
            self.placement.backlogged.add(ws)
        if ts.resource_restrictions:
            for r, q in ts.resource_restrictions.items():
                ws.used_resources[r] = ws.used_resources.get(r, 0) + q
        self.placement.push_free(ws)
        if not send:
            return
        deps = ts.dependencies
        who_has = {d.key: [w.address for w in d.who_has] for d in deps} if deps else {}
        nbytes = {d.key: d.nbytes for d in deps} if deps else {}
        # a suspect says when it starts: a death while it runs is then its alone
        duration = est if not ts.suspicious else max(est, SHORT_TASK)
        if members is None:  # one slot, nearly every task: no gang's fields to fill in
            self.out.send(ws.address, ComputeTask(
                ts.key, ts.run_spec, ts.priority, who_has, nbytes,
                ts.resource_restrictions or None, duration))
            return
        # every member of a gang runs the task (MPI programs: one rank each); the first
        # one's result is the task's
        gang = [w.address for w in members]
        msg = ComputeTask(
            ts.key, ts.run_spec, ts.priority, who_has, nbytes,
            ts.resource_restrictions or None, duration, gang,
            comm, self.comms.take_frees(gang), [w.host for w in members])
        for address in gang:
            self.out.send(address, msg)

    def _exit_processing(self, ts: TaskState, notify: bool) -> None:
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
        if ts.stealing:
            ts.stealing = False
            self.steal_targets.pop(ts.key, None)
        if ws.address in self.registry.workers:
            if notify:
                self.out.send(ws.address, FreeKeys([ts.key]))
            self.placement.open_slots(ws)
        if ts.width > 1:
            self._release_lease(ts, notify)

    def _release_lease(self, ts: TaskState, notify: bool) -> None:
        """A wide task left processing: the slots it held on its other workers are free
        (``notify``: they are told to drop it, as the first one is)."""
        workers = self.registry.workers
        self.placement.gang_moved = True
        self.members_done.pop(ts, None)
        comm = self.comm_of.pop(ts, None)
        if comm is not None:
            self.comms.give_back(comm, gone={ws.address for ws in self.leases.get(ts, ())
                                             if workers.get(ws.address) is not ws})
        for ws in self.leases.pop(ts, ())[1:]:
            if notify and workers.get(ws.address) is ws:
                self.out.send(ws.address, FreeKeys([ts.key]))
            est = ws.processing.pop(ts, 0.0)
            ws.occupancy = max(ws.occupancy - est, 0.0) if ws.processing else 0.0
            ws.executing.discard(ts)
            if workers.get(ws.address) is ws:
                self.placement.open_slots(ws)

    # ================================================================ replicas
    def add_replica(self, ts: TaskState, ws: WorkerInfo, nbytes: int) -> None:
        """``ws`` holds a copy of ``ts``'s result."""
        if nbytes >= 0 and nbytes != ts.nbytes:
            self.set_nbytes(ts, nbytes)
        if ws not in ts.who_has:
            ts.who_has.add(ws)
            ws.has_what[ts] = None
            ws.nbytes += max(ts.nbytes, 0)

    def set_nbytes(self, ts: TaskState, nbytes: int) -> None:
        """``ts``'s result has a new size (reported or scattered again); the workers
        holding it account the change."""
        if nbytes != ts.nbytes:
            delta = nbytes - max(ts.nbytes, 0)
            for holder in ts.who_has:
                holder.nbytes += delta
            ts.nbytes = nbytes

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

    # ================================================================ invariants
    def validate(self) -> None:
        """The tasks agree with each other and with the workers that hold or run them."""
        workers = self.registry.workers
        for ws in workers.values():
            for ts in ws.processing:
                assert ts.state == "processing", (ts, ws)
                assert ts.processing_on is ws or ws in self.leases.get(ts, ()), (ts, ws)
                assert self.tasks.get(ts.key) is ts, ts
            assert ws.executing <= set(ws.processing), ws
            assert ws.long_running <= ws.executing, ws
            occ = sum(ws.processing.values())
            assert abs(ws.occupancy - occ) < 1e-6 * max(1, occ) + 1e-9, (ws, ws.occupancy, occ)
            for ts in ws.has_what:
                assert ws in ts.who_has, (ts, ws)
            nbytes = sum(max(ts.nbytes, 0) for ts in ws.has_what) + ws.element_nbytes
            assert ws.nbytes == nbytes, (ws, ws.nbytes, nbytes)
        for key, ts in self.tasks.items():
            assert ts.key == key
            for ws in ts.who_has:
                assert workers.get(ws.address) is ws, (ts, ws)
                assert ts in ws.has_what, (ts, ws)
            for dts in ts.dependencies:
                assert ts in dts.dependents, (ts, dts)
                assert self.tasks.get(dts.key) is dts, (ts, dts)
            for dts in ts.dependents:
                assert ts in dts.dependencies, (ts, dts)
            for dts in ts.waiters:
                assert ts in dts.dependencies, (ts, dts)
            st = ts.state
            if st == "memory":
                assert ts.who_has, ts
                assert not ts.waiting_on, ts
            else:
                assert not ts.who_has, (ts, ts.who_has)
            if st == "processing":
                assert ts.processing_on is not None and ts in ts.processing_on.processing, ts
                assert workers.get(ts.processing_on.address) is ts.processing_on, ts
                assert all(d.state == "memory" for d in ts.dependencies), ts
            else:
                assert ts.processing_on is None, ts
            # a wide task holds a slot on each of ``width`` distinct workers while it runs
            lease = self.leases.get(ts)
            if st == "processing" and ts.width > 1:
                assert lease is not None and len(set(lease)) == len(lease) == ts.width, ts
                assert lease[0] is ts.processing_on, ts
                assert all(workers.get(w.address) is w and ts in w.processing
                           for w in lease), (ts, lease)
            else:
                assert lease is None, ts
            if st == "waiting":
                assert ts.waiting_on or ts in self.held, ts
                for dts in ts.waiting_on:
                    assert dts.state != "memory", (ts, dts)
                    assert dts in ts.dependencies
                for dts in ts.dependencies:
                    assert ts in dts.waiters, (ts, dts)
            if st == "queued":
                assert not ts.waiting_on, ts
            if st == "erred":
                assert ts.exception is not None or ts.exception_blame is not None, ts
            if st in _PENDING:
                assert self.wanted(ts), ts
            if st == "released":
                # nobody wants it and nothing could need it recomputed: it leaked
                assert self.wanted(ts) or ts.dependents, ("leaked", ts)
        # a thief is planned for exactly the tasks being stolen (none kept past the steal)
        for key in self.steal_targets:
            stolen = self.tasks.get(key)
            assert stolen is not None and stolen.stealing and stolen.state == "processing", (
                "thief", key)
        for ts in self.leases:
            assert self.tasks.get(ts.key) is ts and ts.state == "processing", ("lease", ts)
        for ts, done in self.members_done.items():
            assert ts in self.leases and done <= set(self.leases[ts][1:]), ("members", ts)


#: every finish a recommendation may name
_FINISHES = frozenset(finish for _, finish in _TRANSITIONS)


class GangComms:
    """Which communicator the members of each wide task use: made once for a set of
    members (``Comm.Create_group`` costs messages among them), used again by the next
    task on the same members, in the same order.

    A communicator is named by a number that is never used again: a member makes it
    when it has none of that number, so the members agree without asking each other.
    The scheduler hands one to a single running task at a time (two tasks on the same
    members at once get two). Each worker keeps at most ``per_worker`` of them: making
    one more evicts that worker's least recently used idle one, and the members of an
    evicted one are told to free it with the next task they are given
    (:meth:`take_frees`). Costs are in the members of one task, not in the cluster.

    >>> comms = GangComms(per_worker=1)
    >>> a = comms.take(("w1", "w2")); comms.give_back(a)
    >>> comms.take(("w1", "w2")) == a  # used again
    True
    >>> comms.give_back(a); b = comms.take(("w2", "w3"))  # w2 holds one at most
    >>> b != a, comms.take_frees(("w1",)), comms.take_frees(("w2", "w3"))
    (True, [1], [1])
    """

    def __init__(self, per_worker: int):
        self.per_worker = max(int(per_worker), 1)
        self.next_id = 1
        self.members: dict[int, tuple[str, ...]] = {}  # every communicator kept
        self.idle: dict[tuple[str, ...], list[int]] = {}  # member set -> those not in use
        # worker -> its communicators not in use, least recently used first
        self.lru: dict[str, dict[int, None]] = {}
        self.held: dict[str, int] = {}  # worker -> how many communicators it keeps
        self.to_free: dict[str, list[int]] = {}  # worker -> evicted, still to free

    def take(self, members: tuple[str, ...]) -> int:
        """The communicator for a task that runs on ``members`` (in order), now in use."""
        free = self.idle.get(members)
        if free:
            comm = free.pop()
            if not free:
                del self.idle[members]
            for m in members:
                del self.lru[m][comm]
            return comm
        for m in members:
            lru = self.lru.get(m)
            if self.held.get(m, 0) >= self.per_worker and lru:
                self._evict(next(iter(lru)))
        comm = self.next_id
        self.next_id += 1
        self.members[comm] = members
        for m in members:
            self.held[m] = self.held.get(m, 0) + 1
        return comm

    def give_back(self, comm: int, gone: Collection[str] = ()) -> None:
        """The task using ``comm`` left processing: the next one on its members may (or,
        a member ``gone``, none will: the others free it)."""
        members = self.members[comm]
        if gone:
            del self.members[comm]
            for m in members:
                self.held[m] -= 1
                if m not in gone:
                    self.to_free.setdefault(m, []).append(comm)
                elif not self.held[m]:
                    del self.held[m]
            return
        self.idle.setdefault(members, []).append(comm)
        for m in members:
            self.lru.setdefault(m, {})[comm] = None

    def worker_left(self, address: str) -> None:
        """The worker at ``address`` left: its idle communicators are freed by the other
        members, and nothing of it is kept (those in use go when their task ends)."""
        for comm in list(self.lru.get(address, ())):
            self._evict(comm)
        self.lru.pop(address, None)
        self.to_free.pop(address, None)
        if not self.held.get(address):
            self.held.pop(address, None)

    def take_frees(self, workers: Iterable[str]) -> list[int]:
        """The communicators evicted that ``workers`` still hold (they free them now)."""
        out: list[int] = []
        for w in workers:
            out += self.to_free.pop(w, ())
        return out

    def _evict(self, comm: int) -> None:
        members = self.members.pop(comm)
        free = self.idle[members]
        free.remove(comm)
        if not free:
            del self.idle[members]
        for m in members:
            del self.lru[m][comm]
            self.held[m] -= 1
            self.to_free.setdefault(m, []).append(comm)
