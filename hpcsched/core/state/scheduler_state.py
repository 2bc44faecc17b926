"""The scheduler as a pure state machine: events in, ``Send`` commands out.

Rules of this file:

* No sockets, threads, MPI or clocks: every event carries ``now``.
* ``handle(event) -> list[Send]``; messages to one peer are batched by the
  server, not here.
* Task states: released, waiting, queued, no-worker, processing, memory,
  erred (and forgotten, i.e. deleted). Every change of state goes through the
  task graph (:class:`~.tasks.TaskGraph`): its ``transition`` checks the move
  against :data:`~hpcsched.core.state.model.ALLOWED_TRANSITIONS` and logs it with
  the ``stimulus_id`` of the event being handled; recommendations run from a LIFO
  stack through a ``(start, finish) -> method`` table.
* :meth:`SchedulerState.validate` checks every invariant; tests call it after
  each step.

:class:`SchedulerState` composes components that each own their data and talk
through methods, lowest first:

* :class:`~.registry.WorkerRegistry`: the workers, their thread total, the bandwidth;
* :class:`~.placement.Placement`: which worker a ready task goes to
  (:mod:`.policies`), the queue of root-ish tasks and its blocks, the no-worker tasks;
* :class:`~.tasks.TaskGraph`: the tasks, their groups and transitions;
* :class:`~.maintenance.Maintenance` (scatter, stealing, retirement, rebalance, the
  tick), :class:`~.workers.WorkerEvents` (workers join, leave, report results) and
  :class:`~.clients.ClientRequests` (graphs, wanted and released keys): the handlers
  of events, each declared with ``@handlers.on(Event)``
  (:mod:`hpcsched.core.protocol.dispatch`);

and the :class:`~.model.Outbox` they share. The records are in :mod:`.model`, the
settings and their defaults in :mod:`.settings`.

Priorities are ``(generation, -user_priority, static_priority)``: every task of
an earlier ``submit``/``map``/``compute`` call comes before those of a later
one ("first-come-first-served, coarsely", as distributed's priorities).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from hpcsched.core.protocol import records
from hpcsched.core.protocol.dispatch import Unhandled
from hpcsched.core.state import events as ev
from hpcsched.core.state.bulk import BulkMaps
from hpcsched.core.state.clients import ClientRequests
from hpcsched.core.state.maintenance import Maintenance
from hpcsched.core.state.model import (
    KilledWorker,  # noqa: F401 - what clients see of it
    Outbox,
    TaskState,
    WorkerInfo,
)
from hpcsched.core.state.placement import Placement
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.settings import SchedulerSettings
from hpcsched.core.state.tasks import TaskGraph, Transition
from hpcsched.core.state.workers import WorkerEvents

Key = Any
#: events after which the bulk maps give ranges to the workers that have room (one whose
#: element raised: a batch of failures only comes with no range-finished), take
#: elements back from a paused worker or one running a suspect task, or steal
#: (BulkMaps.after); a worker's departure is no such event: _remove_worker
_BULK_AFTER = frozenset({ev.AddWorker, ev.WorkerStatusChange, ev.Tick, ev.TaskStarted,
                         ev.TaskErred})


class SchedulerState:
    """The scheduler's state (see the module's docstring). Keyword arguments override
    fields of ``settings`` (:class:`~.settings.SchedulerSettings`)."""

    def __init__(self, settings: SchedulerSettings | None = None, **overrides: Any):
        st = settings or SchedulerSettings()
        if overrides:
            st = records.replace(st, **overrides)
        self.settings = st
        self.out = Outbox()
        self.registry = WorkerRegistry(st.bandwidth)
        self.placement = Placement(self.registry, st)
        self.graph = TaskGraph(self.registry, self.placement, self.out, st)
        self.maintenance = Maintenance(self.graph, self.registry, self.placement, self.out,
                                       self._remove_worker, st,
                                       elements_on=lambda ws: self.bulk.elements_on(ws))
        self.worker_events = WorkerEvents(self.graph, self.registry, self.placement,
                                          self.maintenance, self.out, st)
        self.client_requests = ClientRequests(self.graph, self.registry, self.placement,
                                              self.out)
        self.bulk = BulkMaps(self.graph, self.registry, self.out,
                             self.worker_events.task_finished, st)
        self.elements = self.bulk.store  # the elements of bulk maps, asked by the views
        self.placement.elements_on = self.bulk.elements_on
        self.placement.now = lambda: self.out.now
        self.placement.recorder = lambda: self.out.recorder
        self.bulk.wait_on(self.placement.worker_freed, self.placement.holds_back,
                          self.placement.lifetime_allows)
        self._table: dict[type, Callable[[Any], None]] = {
            **WorkerEvents.handlers.bind(self.worker_events),
            **ClientRequests.handlers.bind(self.client_requests),
            **Maintenance.handlers.bind(self.maintenance),
            **BulkMaps.handlers.bind(self.bulk),
            # the bulk maps hear of these first (their elements are no tasks until promoted)
            ev.RemoveWorker: self._remove_worker,
            ev.RemoveClient: self._remove_client,
            ev.ClientReleasesKeys: self._client_releases,
            ev.RetireWorkers: self._retire_workers,
            ev.RebalanceKeys: self._rebalance,
            ev.FillQueue: self._fill_queue,
        }
        # the components' own data, under the names the server and the tests read
        self.tasks = self.graph.tasks
        self.groups = self.graph.groups
        self.workers = self.registry.workers
        self.clients = self.client_requests.clients
        self.unrunnable = self.placement.unrunnable
        self.removed_by = self.registry.removed_by
        self.scatters = self.maintenance.scatters
        self.mars_assignment = self.placement.mars_assignment
        self.transition_log = self.graph.transition_log

    @staticmethod
    def event_types() -> frozenset[type]:
        """Every event type :meth:`handle` takes (a server hands it those that arrive)."""
        return frozenset(WorkerEvents.handlers.table) | frozenset(ClientRequests.handlers.table) \
            | frozenset(Maintenance.handlers.table) | frozenset(BulkMaps.handlers.table)

    def _fill_queue(self, e: ev.FillQueue) -> None:
        """The next part of a bulk map's first wave; the queue's fill follows every event."""
        self.bulk.fill_wave()

    def _remove_worker(self, e: ev.RemoveWorker) -> None:
        """Every removal of a worker: its event, and those a tick makes (past
        ``worker_ttl``, at the end of a retirement)."""
        ws = self.registry.workers.get(e.address)
        elements, spared = self.bulk.worker_left(ws) if ws is not None else (0, set())
        self.worker_events.remove_worker(e, elements_unfinished=elements, spared=spared)
        # the elements it had went back to the queue: they go to the workers that found it
        # empty here, whatever event this is (after a tick, no event may be due that would
        # hand them out: the other workers are idle and report nothing)
        if self.bulk.pending:
            self.bulk.fill_hungry()

    def _retire_workers(self, e: ev.RetireWorkers) -> None:
        self.bulk.retire(e.workers)
        self.maintenance.retire_workers(e)

    def _rebalance(self, e: ev.RebalanceKeys) -> None:
        """A rebalance of all data moves elements' results too: those of each worker above
        the mean become tasks, largest first, until they weigh its excess; the
        rebalance then moves them as any result."""
        if self.bulk.maps and e.keys is None:
            pool = self.maintenance.rebalance_pool(e)
            if len(pool) > 1:
                mean = sum(ws.nbytes for ws in pool) / len(pool)
                for ws in pool:
                    if ws.nbytes > mean and ws.n_elements:
                        self.bulk.promote_largest(ws, ws.nbytes - mean)
        self.maintenance.rebalance(e)

    def _remove_client(self, e: ev.RemoveClient) -> None:
        self.bulk.remove_client(e.client)
        self.client_requests.remove_client(e)

    def _client_releases(self, e: ev.ClientReleasesKeys) -> None:
        bulk = self.bulk
        if bulk.maps:
            keys = bulk.release(e.keys, e.client)
            bulk.flush_frees()
            if len(keys) != len(e.keys):
                e = records.replace(e, keys=keys)
        self.client_requests.client_releases(e)

    # ================================================================ dispatch
    def handle(self, event: Any) -> list[ev.Send]:
        """Apply ``event``; return the messages to send."""
        out = self.out
        out.stimulus_id = event.stimulus_id
        out.now = event.now
        try:
            handler = self._table[type(event)]
        except KeyError:
            raise Unhandled(f"scheduler state has no handler for "
                            f"{type(event).__name__}") from None
        handler(event)
        bulk = self.bulk
        if bulk.promoted:  # elements that became tasks of their own, still to run
            graph = self.graph
            graph.transitions([(ts, "waiting") for ts in bulk.take_promoted()
                               if ts.state == "released" and graph.wanted(ts)])
        if bulk.unheld:  # held tasks of maps that are gone: placed as any task
            self.graph.transitions([(ts, "processing") for ts in bulk.take_unheld()])
        # a worker whose ranges run tasks of maps now gone gives them back when it pauses
        if (bulk.maps or bulk.in_ranges) and type(event) in _BULK_AFTER:
            bulk.after(event)
        placement = self.placement
        if placement.slots_opened or placement.blocks.fill_all or placement.retry_unrunnable:
            self._fill_slots(placement.take_opened())
        if placement.gang_moved:  # elements held back behind a wide task may go out
            placement.gang_moved = False
            if bulk.hungry and bulk.pending:
                bulk.fill_hungry()
        messages, out.messages = out.messages, []
        return messages

    def _fill_slots(self, opened: dict[WorkerInfo, None]) -> None:
        """Slots opened (or tasks were queued while some were free): the no-worker tasks
        may run now, and queued tasks go to the free slots."""
        placement = self.placement
        if placement.unrunnable or placement.gangs:  # (none: the common case, no call)
            self.graph.retry_no_worker()
        if placement.n_queued:
            placement.fill_slots(opened, self.graph.add_to_processing)
        else:
            placement.blocks.fill_all = False

    @property
    def fill_pending(self) -> bool:
        """Queued tasks wait for free workers this event did not fill (a group of unknown
        duration is handed out a few workers per event): the server should handle
        :class:`~.events.FillQueue` once this event's messages are out."""
        placement = self.placement
        return (placement.blocks.fill_all and placement.n_queued > 0) or self.bulk.fill_pending \
            or bool(placement.slots_opened)

    def validate(self) -> None:
        """Check every invariant; raises AssertionError naming the broken one."""
        self.registry.validate()
        self.graph.validate()
        self.placement.validate(self.graph.tasks)
        self.bulk.validate()

    # ================================================================ queries
    # Every view asks here, and sees the elements of bulk maps as it sees tasks; none of
    # these makes an element a task (only :meth:`promote` does).
    def promote(self, key: Key) -> TaskState | None:
        """The task ``key``, an element of a bulk map made one (:meth:`.tasks.TaskGraph.promote`)."""
        return self.graph.promote(key)

    def knows(self, key: Key) -> bool:
        """Whether ``key`` is a task or an element of a bulk map the scheduler holds."""
        return key in self.tasks or self.elements.element(key) is not None

    def who_has(self, keys: Iterable[Key] | None = None) -> dict[Key, list[str]]:
        """The addresses of the workers holding each of ``keys`` (None: every result held)."""
        if keys is None:
            keys = [*self.tasks, *self.elements.memory_keys()]
        return {k: sorted(ws.address for ws in self.holders(k)) for k in keys}

    def has_what(self, address: str) -> list[Key]:
        """The keys whose result the worker at ``address`` holds."""
        ws = self.registry.workers.get(address)
        if ws is None:
            return []
        return [ts.key for ts in ws.has_what] + self.elements.keys_on(address)

    def processing(self, address: str) -> list[Key]:
        """The keys the worker at ``address`` runs or was given to run."""
        ws = self.registry.workers.get(address)
        if ws is None:
            return []
        return [ts.key for ts in ws.processing] + self.elements.keys_on(address, running=True)

    def load(self, ws: WorkerInfo) -> tuple[int, int]:
        """``(processing, executing)`` on ``ws``: the tasks and elements it runs or was given
        to run, and of those, how many run on its threads (elements fill the threads
        its tasks leave free)."""
        elements = self.bulk.elements_on(ws)
        executing = len(ws.executing)
        return (len(ws.processing) + elements,
                executing + min(elements, max(ws.nthreads - executing, 0)))

    def group_counts(self) -> dict[tuple[str, str], int]:
        """How many tasks of each group are in each state (the elements included)."""
        counts = self.elements.group_counts()
        for ts in self.tasks.values():
            k = (ts.group.name, ts.state)
            counts[k] = counts.get(k, 0) + 1
        return counts

    def holders_of(self, keys: list) -> tuple[dict[str, list], list]:
        """``({worker address: those of keys whose result it holds}, keys held nowhere)``:
        :meth:`holders` of many keys, one holder each (of several, chosen by the key's
        hash, so that repeated gathers spread over replicas); bulk maps' elements
        found in one pass (:meth:`.bulk.elements.ElementStore.holders_of`)."""
        rest: list = []
        if self.bulk.maps:
            per_worker, missing = self.elements.holders_of(keys, rest)
        else:
            per_worker, missing, rest = {}, [], keys
        for key in rest:
            holders = self.holders(key)
            if not holders:
                missing.append(key)
                continue
            if len(holders) > 1:
                holders.sort(key=lambda ws: ws.address)
                ws = holders[hash(key) % len(holders)]
            else:
                ws = holders[0]
            got = per_worker.get(ws.address)
            if got is None:
                got = per_worker[ws.address] = []
            got.append(key)
        return per_worker, missing

    def small_results(self, keys: list, budget: int, each: int) -> list:
        """Those of ``keys`` in memory whose result weighs at most ``each`` bytes, in
        order, while they add up to at most ``budget`` bytes (the values a gather may
        carry along unasked: large ones stay on their workers)."""
        rest: list = []
        sizes = self.elements.result_sizes(keys, rest) if self.bulk.maps else {}
        if not self.bulk.maps:
            rest = keys
        tasks = self.tasks
        for key in rest:
            ts = tasks.get(key)
            if ts is not None and ts.state == "memory":
                sizes[key] = ts.nbytes
        if len(sizes) == len(keys) and sizes:  # all in memory: all small, and few bytes?
            got = sizes.values()
            if min(got) >= 0 and max(got) <= each and sum(got) <= budget:
                return list(keys)  # no call per key
        out = []
        total = 0
        for key in keys:
            b = sizes.get(key)
            if b is None or b < 0 or b > each or total + b > budget:
                continue
            total += b
            out.append(key)
        return out

    def holders(self, key: Key) -> list[WorkerInfo]:
        """The workers holding ``key``'s result (none unless it is in memory); an element
        of a bulk map stays one (:mod:`.bulk`)."""
        ts = self.tasks.get(key)
        if ts is None:
            return self.elements.holders(key) or []
        return list(ts.who_has) if ts.state == "memory" else []

    def task_counts(self) -> dict[str, int]:
        """How many tasks are in each state (the elements of bulk maps included)."""
        counts: dict[str, int] = self.elements.counts()
        for ts in self.tasks.values():
            counts[ts.state] = counts.get(ts.state, 0) + 1
        return counts

    def workers_info(self) -> dict[str, dict]:
        """Each worker's description (:meth:`.model.WorkerInfo.info`), by address: what it
        runs counts the elements of bulk maps given to it (:meth:`load`), as its
        ``nbytes`` and ``n_keys`` count their results."""
        out = {}
        for a, ws in self.workers.items():
            info = out[a] = ws.info()
            info["processing"], info["executing"] = self.load(ws)
        return out

    def workers_to_retire(self, addresses: Iterable[str] | None, names: Iterable[Any] | None,
                          n: int | None = None) -> list[str]:
        """The workers a retirement names (:meth:`.registry.WorkerRegistry.resolve`); the
        ``n`` chosen are the least busy with the least data, bulk maps' elements and their
        results counted as tasks' are."""
        return self.registry.resolve(addresses, names, n,
                                     lambda ws: (self.load(ws)[0], ws.nbytes))

    def running(self) -> list[WorkerInfo]:
        """Running workers (callers must not modify the list)."""
        return self.registry.running()

    @property
    def total_nthreads(self) -> int:
        return self.registry.total_nthreads

    @property
    def bandwidth(self) -> float:
        """Measured transfer speed between workers (bytes/s)."""
        return self.registry.bandwidth

    @property
    def n_queued(self) -> int:
        return self.placement.n_queued

    @property
    def n_unrunnable(self) -> int:
        """How many tasks wait for workers that can run them (no-worker), wide ones too."""
        return len(self.placement.unrunnable) + len(self.placement.gangs)

    @property
    def generation(self) -> int:
        return self.graph.generation

    @property
    def blocks(self) -> Any:
        return self.placement.blocks

    @property
    def rootish_policy(self) -> str:
        """The policy in effect (co-assign where queuing has no slots to queue for)."""
        return self.placement.rootish_policy

    @property
    def unknown_task_duration(self) -> float:
        """Seconds a task is thought to take before its group has a measured one."""
        return self.settings.unknown_task_duration

    @property
    def work_stealing(self) -> bool:
        return self.maintenance.work_stealing

    @property
    def recorder(self) -> Any:
        """What happened goes here (:mod:`hpcsched.diagnostics.recorder`); None: nowhere."""
        return self.out.recorder

    @recorder.setter
    def recorder(self, recorder: Any) -> None:
        self.out.recorder = recorder

    @property
    def transition_listener(self) -> list[Transition] | None:
        """Every transition also goes here while a list is set (see :class:`~.tasks.TaskGraph`)."""
        return self.graph.transition_listener

    @transition_listener.setter
    def transition_listener(self, listener: list[Transition] | None) -> None:
        self.graph.transition_listener = listener

    def transition(self, ts: TaskState, finish: str, stimulus_id: str | None = None,
                   notify: bool = False) -> None:
        """Move ``ts`` to ``finish`` (:meth:`~.tasks.TaskGraph.transition`)."""
        self.graph.transition(ts, finish, stimulus_id, notify)
