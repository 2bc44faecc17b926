"""Bulk maps: ``Client.map`` over many elements, scheduled as ranges, not tasks.

A parameter sweep is one function over 10^5 to 10^7 arguments. Holding each call as a
:class:`~.model.TaskState` costs the scheduler a kilobyte and tens of microseconds per
call; a task farm (mpi4py.futures with a ``chunksize``, HyperQueue's task arrays) ships
and tracks the calls in chunks. A :class:`BulkMap` does the same while every element
keeps its own key, ``f"{prefix}{i}"``, and its client its own future. This module
schedules them; the elements themselves are in :mod:`.elements` (a
:class:`~.elements.BulkMap` per map, its arrays, and the lookups by key):

* the map holds the function once, each element's pickled arguments, and per element a
  state byte (queued, processing, memory, promoted, forgotten), the worker running or
  holding it and its result's size, in flat arrays; the queued elements are a list of
  ranges;
* a worker is given a range of elements in one ``compute-range`` message, and again
  whenever what it holds of the maps runs low. The size of a range follows guided
  self-scheduling (Polychronopoulos and Kuck, 1987): the unassigned elements over four
  times the cluster's threads, at most :data:`MAX_RANGE`, so that ranges are large while
  much is left (few messages) and shrink to single elements at the end (balanced); but
  once the map's elements have a measured time, a range holds at least
  :data:`RANGE_SECONDS` of work: a thousand workers are not each given a few elements of
  microseconds (a message each way per few microseconds of work, and results spread
  over the cluster that later tasks must fetch). While no element of a map has
  finished, a map that arrives goes to :data:`~.policies.FIRST_WAVE_WORKERS` free
  workers per event; the others get theirs from the next events (the server's
  ``FillQueue``), by when the first reports may have measured the elements;
* a worker reports many finished elements in one ``range-finished``; the client hears
  them in one ``map-in-memory``;
* an element gets its own ``TaskState`` only when it must, by an explicit call
  (:meth:`~.tasks.TaskGraph.promote`, which asks :meth:`BulkMaps.resolve`): when it
  failed, is a dependency of a new task, is cancelled, retried or lost its result's
  holder. A lookup never makes one: views see elements beside the tasks. From then on it is an ordinary task (its run spec is the map's
  function and its arguments) and the map forgets it ("promoted"). A queued element
  promoted stays in the queue, its task waiting ("held") until a range with it goes to
  a worker, which runs it with its neighbours: the additions of a tree reduction
  submitted over a map's futures find both inputs on one worker, where elements taken
  out to run alone, one per free worker, would spread them over the cluster;
* a worker that leaves takes its unfinished elements and the results only it held
  back to the queue (their clients hear ``lost-data`` of the results); the map keeps,
  per worker, the runs of elements given to it (:class:`Given`), so that a departure
  visits what that worker had, not the map;
* a worker gives back elements it has not started when asked (``release-range``,
  answered by ``range-released``: it either started an element or gives it up, so
  none runs twice by design or is lost): an idle worker steals half of what a busy one
  holds beyond its threads, while nothing is queued, when that is worth a round trip
  at the busy worker's speed (:meth:`BulkMaps.steal`); a paused worker gives back
  everything not started; so does a retiring one, whose results become tasks of their
  own, moved to other workers as any result of a retiring worker is;
* a client that releases an element (its future was dropped) forgets it here without
  ever making a task of it.

What is not done for elements until they are promoted: worker restrictions and
resources (such maps go task by task). A worker's ``nbytes`` counts its elements'
results with its tasks' (``n_elements``, ``element_nbytes``), so that retirement,
rebalancing, adaptive scaling and the views weigh it right. A map with a future among
its arguments, even
one shared by every element, goes task by task: as a bulk map it would need the map to
hold its dependency (against its client's release, its loss, its failure: every element
errs) and a worker to fetch it before a range and keep it while the range runs.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from itertools import compress
from operator import sub
from typing import Any

from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.messages import (
    ComputeRange,
    FreeKeys,
    LostData,
    MapInMemory,
    ReleaseRange,
)
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.state import events as ev
from hpcsched.core.state.elements import (
    FORGOTTEN,
    MEMORY,
    NO_SLOT,
    PROCESSING,
    PROMOTED,
    QUEUED,
    BulkMap,
    ElementStore,
    Given,
    holds,
    runs,
)
from hpcsched.core.state.model import FIRE_AND_FORGET, Outbox, TaskState, WorkerInfo
from hpcsched.core.state.policies import FIRST_WAVE_WORKERS
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.settings import SchedulerSettings
from hpcsched.core.state.tasks import TaskGraph

Key = Any

#: elements made tasks, of dropped maps, remembered before the maps whose tasks are gone
#: are let go (8 bytes each)
SPENT_PRUNE = 65_536
#: elements in one compute-range at most (large enough that messages cost little per
#: element, small enough that a worker leaving loses little)
MAX_RANGE = 4096
#: ranges per thread of the cluster the unassigned elements are cut into (guided
#: self-scheduling's divisor)
RANGES_PER_THREAD = 4
#: seconds of work a range holds at least once its map's elements have a measured time
#: (module docstring); the tail it may leave a worker with stays under a round trip's
#: worth of stealing (STEAL_MIN_SECONDS)
RANGE_SECONDS = 0.005
#: seconds of a worker's elements not yet started, at least, that are worth a steal
#: (a round trip to it costs well under a millisecond)
STEAL_MIN_SECONDS = 0.01


class BulkMaps:
    """The bulk maps of the scheduler and the handlers of their messages (module
    docstring). ``task_finished`` is the scheduler's handler of one task's result
    (a promoted element's report goes there)."""

    handlers = Handlers("scheduler state (bulk maps)")

    def __init__(self, graph: TaskGraph, registry: WorkerRegistry, out: Outbox,
                 task_finished: Callable[[ev.TaskFinished], None], settings: SchedulerSettings):
        self.graph = graph
        self.registry = registry
        self.out = out
        self.task_finished = task_finished
        self.allowed_failures = settings.allowed_failures
        self.work_stealing = settings.work_stealing  # idle workers take ranges' tails (steal)
        # the elements and the workers' slots (.elements); the store's tables under the
        # names used here (the same objects: never rebound)
        self.store = store = ElementStore()
        self.maps = store.maps
        self.slots = store.slots
        self.slot_ws = store.slot_ws
        self.given_maps = store.given_maps
        self.pending: list[BulkMap] = []  # maps with queued elements, best priority first
        self.outstanding: dict[str, int] = {}  # worker -> elements it runs for the maps
        self.promoted: list[TaskState] = []  # queued elements promoted during this event
        self.unheld: list[TaskState] = []  # held tasks whose map is gone: ready to place
        # worker -> tasks a range given to it runs (held tasks, elements promoted while
        # given): not in outstanding, yet a paused or retiring worker gives them back too
        self.in_ranges: dict[str, dict[TaskState, None]] = {}
        self._frees: dict[str, list] = {}  # worker -> forgotten results it holds
        # running workers that would take more than the queue has left (they are topped
        # up when elements go back to the queue)
        self.hungry: dict[str, WorkerInfo] = {}
        # dropped maps with elements made tasks: prefix -> those elements (their keys may
        # still be tasks', so the prefix may not name a new map); pruned as it doubles
        self.spent: dict[str, array] = {}
        self._spent_size = 0  # their elements, and one per map
        self._spent_bound = SPENT_PRUNE
        self.retiring: set[str] = set()  # workers told to retire (they may run again)
        # workers given no elements while a suspect task (one a worker died running) is
        # theirs: it runs alone there, so that a death is its own (WorkerEvents blames it)
        self.quarantined: set[str] = set()
        self.releasing: dict[str, int] = {}  # worker -> release-range requests unanswered
        self.element_time: dict[str, float] = {}  # worker -> seconds per element, recently
        self.first_wave = False  # hungry workers wait for the rest of a map's first wave
        self._epoch = 0  # ranges given or reported so far (a steal round may find more)
        self._fruitless = -1  # the epoch at which a steal round found no worker to steal from
        # set by the scheduler's state: a worker's threads are free of elements (a wide task
        # waiting may take it); whether maps of a priority wait behind a wide task
        self.slots_freed: Callable[[WorkerInfo], None] = lambda ws: None
        self.held_back: Callable[[tuple], bool] = lambda priority: False
        graph.promote_element = self.resolve

    # ================================================================ client side
    @handlers.on(ev.UpdateMap)
    def update_map(self, e: ev.UpdateMap) -> None:
        """A block of a map arrived: hold it, give ranges to the workers."""
        m = self.maps.get(e.prefix)
        if not e.prefix.endswith("-"):
            raise ev.MalformedMessage(f"update-map: prefix {e.prefix!r} must end with '-'")
        if m is None:
            if e.offset != 0:
                raise ev.MalformedMessage(f"update-map: the first block of {e.prefix!r} "
                                          f"starts at {e.offset}, not 0")
            if e.prefix in self.spent:
                raise ev.MalformedMessage(f"update-map: prefix {e.prefix!r} named an earlier "
                                          "map, whose elements may be tasks still")
            m = self.maps[e.prefix] = BulkMap(
                e.prefix, e.client, e.function,
                (self.graph.new_generation(), -e.priority), e.retries)
        elif m.client != e.client or e.offset != len(m.args):
            raise ev.MalformedMessage(f"update-map: a block of {e.prefix!r} at {e.offset} "
                                      "does not continue the map")
        if not e.args:
            return
        m.extend(e.args)
        if m not in self.pending:
            self.pending.append(m)
            self.pending.sort(key=lambda b: b.priority)
        self.fill_all()

    def release(self, keys: list, client: str) -> list:
        """``client`` dropped its futures of ``keys``: the elements held here among them
        are forgotten (their results' holders hear it at :meth:`flush_frees`); returns the
        other keys, which the caller releases as tasks (promoted elements among them).

        One pass over the keys, with no call per element: a client drops a map's futures
        together, and each is released."""
        run = self.store.run_of(keys) if self.maps else None
        if run is not None and run[0].client == client:
            m, lo, hi, ordered = run
            n = hi - lo
            if m.state.count(MEMORY, lo, hi) == n:  # the common case: all in memory
                slot_ws = self.slot_ws
                by_slot = self.store.by_slot(m.where, lo, hi, ordered)
                seg, sizes = m.where[lo:hi], m.nbytes[lo:hi]
                for w, wkeys in by_slot.items():
                    ws = slot_ws[w]
                    if ws is not None:
                        self._frees.setdefault(ws.address, []).extend(wkeys)
                        size = sum(sizes) if len(by_slot) == 1 else \
                            sum(compress(sizes, map(w.__eq__, seg)))
                        holds(ws, -len(wkeys), -size)
                m.state[lo:hi] = bytes([FORGOTTEN]) * n
                m.where[lo:hi] = array("i", [-1]) * n
                m.n_live -= n
                self._maybe_drop(m)
                return []
        rest: list = []
        touched: dict[BulkMap, None] = {}
        frees: dict[int, list] = {}
        freed_bytes: dict[int, int] = {}
        for m, found in self.store.split(keys, rest).items():
            touched[m] = None
            state, where = m.state, m.where
            if m.client != client:  # not its map: nothing of it to release
                for key, i in found:
                    if state[i] == PROMOTED:
                        rest.append(key)
                continue
            live = orphans = 0
            for key, i in found:
                st = state[i]
                if st == MEMORY:
                    state[i] = FORGOTTEN
                    live += 1
                    w = where[i]
                    where[i] = -1
                    got = frees.get(w)
                    if got is None:
                        got = frees[w] = []
                        freed_bytes[w] = 0
                    got.append(key)
                    freed_bytes[w] += m.nbytes[i]
                elif st == PROCESSING:  # its worker's report is due; the result is freed then
                    state[i] = FORGOTTEN
                    live += 1
                    orphans += 1
                elif st == QUEUED:
                    state[i] = FORGOTTEN
                    live += 1
                elif st == PROMOTED:  # a task of its own now: released as one
                    rest.append(key)
            m.n_live -= live
            m.n_orphans += orphans
        slot_ws = self.slot_ws
        for w, wkeys in frees.items():
            ws = slot_ws[w]
            if ws is not None:  # one free-keys per worker: flush_frees
                self._frees.setdefault(ws.address, []).extend(wkeys)
                holds(ws, -len(wkeys), -freed_bytes[w])
        for m in touched:
            self._maybe_drop(m)
        return rest

    def _forget(self, m: BulkMap, i: int) -> None:
        st = m.state[i]
        if st >= PROMOTED:
            return
        m.state[i] = FORGOTTEN
        m.n_live -= 1
        w = m.where[i]
        if st == PROCESSING:
            m.n_orphans += 1  # its worker's report is due; the result is freed then
        elif st == MEMORY:
            ws = self.slot_ws[w]
            m.where[i] = -1
            if ws is not None:  # one free-keys per worker: flush_frees
                self._frees.setdefault(ws.address, []).append(m.prefix + str(i))
                holds(ws, -1, -m.nbytes[i])

    def _spend(self, m: BulkMap) -> None:
        """Map ``m`` is dropped while some of its elements are tasks: remember which, so
        that its prefix names no new map while one of them lives. Prefixes whose tasks
        are all forgotten are let go whenever the record has doubled: a client running
        maps all day does not grow it (amortized, a look-up per element made a task). It
        is counted in elements, not maps: a map of a million elements, all made tasks,
        weighs as much as a million maps of one."""
        state, promoted = m.state, array("q")
        i = state.find(PROMOTED)
        while i >= 0:
            promoted.append(i)
            i = state.find(PROMOTED, i + 1)
        self.spent[m.prefix] = promoted
        self._spent_size += len(promoted) + 1
        if self._spent_size > self._spent_bound:
            tasks = self.graph.tasks
            self.spent = {p: idx for p, idx in self.spent.items()
                          if any(p + str(i) in tasks for i in idx)}
            self._spent_size = sum(len(idx) + 1 for idx in self.spent.values())
            self._spent_bound = max(SPENT_PRUNE, 2 * self._spent_size)

    def flush_frees(self) -> None:
        """Tell each worker the forgotten results it may drop, in one message."""
        frees, self._frees = self._frees, {}
        for address, keys in frees.items():
            self.out.send(address, FreeKeys(keys))

    def _maybe_drop(self, m: BulkMap) -> None:
        # held tasks keep their map: their ranges are still to give (_assign)
        if m.n_live == 0 and m.n_orphans == 0 and not m.held and self.maps.get(m.prefix) is m:
            if PROMOTED in m.state:  # their keys are tasks' (a client never reuses a prefix)
                self._spend(m)
            for slot in m.given:
                self.given_maps.get(slot, {}).pop(m, None)
            del self.maps[m.prefix]
            if m in self.pending:
                self.pending.remove(m)

    def remove_client(self, client: str) -> None:
        """``client`` left: its maps' elements are forgotten."""
        for m in [m for m in self.maps.values() if m.client == client]:
            for i in range(len(m.state)):
                self._forget(m, i)
            self._unhold(m)
            self._maybe_drop(m)
        self.flush_frees()

    def resolve(self, key: Key, alone: bool = False) -> TaskState | None:
        """Element ``key`` as a task of its own (see the module docstring), or None. A
        queued element stays in the queue, its task held in ``waiting`` until a range with
        it goes to a worker (:meth:`_assign`), so that a task combining neighbouring
        elements finds them on one worker; ``alone``: it leaves the queue and runs as any
        task (a suspect of a worker's death)."""
        found = self.store.element(key)
        if found is None:
            return None
        m, i = found
        st = m.state[i]
        if st >= PROMOTED:
            return None
        graph = self.graph
        ts = graph.new_task(key, RunSpec(m.function, m.args[i]), m.group)
        ts.priority = (*m.priority, i)
        ts.retries = m.retries
        ts.who_wants.add(m.client)
        w = m.where[i]
        ws = self.slot_ws[w] if w >= 0 else None
        m.state[i] = PROMOTED
        m.n_live -= 1
        m.where[i] = -1
        if st == PROCESSING and ws is not None:
            self.outstanding[ws.address] -= 1
            graph.transition(ts, "waiting")
            graph.add_to_processing(ts, ws, send=False)
            # it may be running: neither stolen nor moved off a retiring worker (its death
            # counts as its range's elements': worker_left)
            ws.executing.add(ts)
            self._in_range(ws, ts)
        elif st == MEMORY and ws is not None:
            holds(ws, -1, -m.nbytes[i])  # as a task's result from now on (add_replica)
            ts.nbytes = m.nbytes[i]
            graph.add_replica(ts, ws, m.nbytes[i])
            graph.transition(ts, "memory")
        else:
            if st == QUEUED and not alone:
                m.held[i] = ts  # still in m.free: given to a worker with its range
                graph.held.add(ts)
            self.promoted.append(ts)  # released and wanted: to waiting after the event
        self._maybe_drop(m)
        return ts

    def take_promoted(self) -> list[TaskState]:
        out, self.promoted = self.promoted, []
        return out

    def take_unheld(self) -> list[TaskState]:
        out, self.unheld = self.unheld, []
        return out

    def _unhold(self, m: BulkMap) -> None:
        """``m`` is done with but for its held tasks (every other element is gone): they
        leave its queue and run as any task (after the event: :attr:`unheld`)."""
        tasks, held = self.graph.tasks, self.graph.held
        for ts in m.held.values():
            held.discard(ts)
            if tasks.get(ts.key) is ts and ts.state == "waiting":
                self.unheld.append(ts)
        m.held.clear()

    # ================================================================ workers
    def _range_size(self) -> int:
        left = sum(m.unassigned() for m in self.pending)
        threads = max(self.registry.total_nthreads, 1)
        size = left // (threads * RANGES_PER_THREAD)
        seconds = self.pending[0].mean_seconds() if self.pending else None
        if seconds is not None:
            size = max(size, int(RANGE_SECONDS / seconds) if seconds > 0 else MAX_RANGE)
        return max(1, min(MAX_RANGE, size))

    def fill_all(self) -> None:
        """Top up every running worker (a map arrived); while none of the first map's
        elements has finished, :data:`FIRST_WAVE_WORKERS` of them, the others are hungry
        and get theirs from the next events (:attr:`first_wave`)."""
        if not self.pending:
            return
        wave = FIRST_WAVE_WORKERS if self.pending[0].mean_seconds() is None else 0
        filled = 0
        for ws in list(self.registry.running()):
            if wave and filled >= wave:
                if not self.outstanding.get(ws.address):
                    self.hungry[ws.address] = ws
                    self.first_wave = True
                continue
            self.fill(ws)
            filled += 1

    @property
    def fill_pending(self) -> bool:
        """Hungry workers wait for the next part of a map's first wave (``FillQueue``)."""
        return self.first_wave and bool(self.pending) and bool(self.hungry)

    def fill_wave(self) -> None:
        """``FillQueue``: the next free workers of a map's first wave get ranges, all of
        them once the map's elements have a measured time."""
        if self.first_wave:
            self.fill_hungry()

    def after(self, e: ev.AddWorker | ev.WorkerStatusChange | ev.Tick | ev.TaskStarted
              | ev.TaskErred) -> None:
        """After a worker joined or changed status, hand out elements: to it, and to the
        workers that found the queue empty (never the whole cluster, so that a worker
        coming costs what it takes); a paused worker gives back those it has not started,
        and so does one where a suspect task starts. A worker whose element raised is
        topped up (it reports a batch of failures only with no ``range-finished``). On a
        tick, idle workers steal (:meth:`steal`). (A worker that left: its elements go
        back to the queue, and from there to the workers that found it empty, in
        whatever event removed it: :meth:`worker_left`, then :meth:`fill_hungry`.)"""
        if isinstance(e, ev.TaskErred):
            ws = self.registry.workers.get(e.worker)
            if ws is not None:
                self._orphan_erred(ws, e.key)
                self.fill(ws)
            return
        if isinstance(e, ev.Tick):
            if self.retiring:
                self._retired_back()
            if self.quarantined:
                self._quarantine_over()
            self.steal()
            return
        if isinstance(e, ev.TaskStarted):
            ts = self.graph.tasks.get(e.key)
            ws = self.registry.workers.get(e.worker)
            if ts is not None and ts.suspicious and ws is not None \
                    and ts.processing_on is ws:
                self.quarantined.add(ws.address)
                self.hungry.pop(ws.address, None)
                self.release_all(ws)
            return
        address = e.worker if isinstance(e, ev.WorkerStatusChange) else e.address
        ws = self.registry.workers.get(address)
        if ws is not None and ws.status == "paused":
            self.hungry.pop(address, None)
            self.release_all(ws)
        if ws is not None:
            self.fill(ws)  # nothing queued: it is marked hungry (a thief, if idle)
        self.fill_hungry()

    def _orphan_erred(self, ws: WorkerInfo, key: Key) -> None:
        """An element forgotten while ``ws`` ran it raised there: that was its report
        (as a ``range-finished`` would have been), due no more."""
        found = self.store.element(key)
        if found is None:
            return
        m, i = found
        if m.state[i] == FORGOTTEN and m.where[i] == self.slots.get(ws.address, NO_SLOT):
            m.where[i] = -1
            m.n_orphans -= 1
            self.outstanding[ws.address] = self.outstanding.get(ws.address, 0) - 1
            self._maybe_drop(m)

    def fill_hungry(self) -> None:
        """Top up the workers that found the queue empty, while it holds elements (some
        went back to it), those with a thread free first: a worker that had enough then
        has enough now, and is topped up when it reports. In a map's first wave (nothing
        of it measured yet), :data:`FIRST_WAVE_WORKERS` free ones at most."""
        outstanding = self.outstanding
        if self.first_wave:
            if self.pending and self.pending[0].mean_seconds() is None:
                wave = [ws for ws in self.hungry.values()
                        if outstanding.get(ws.address, 0) < ws.nthreads][:FIRST_WAVE_WORKERS]
                for ws in wave:
                    if not self.pending:
                        break
                    self.fill(ws)
                if len(wave) < FIRST_WAVE_WORKERS:
                    self.first_wave = False
                return
            self.first_wave = False
        hungry = list(self.hungry.values())
        idle = [ws for ws in hungry if outstanding.get(ws.address, 0) < ws.nthreads]
        for ws in idle + hungry if len(idle) < len(hungry) else idle:
            if not self.pending:
                return
            self.fill(ws)

    def fill(self, ws: WorkerInfo) -> None:
        """Give ``ws`` ranges while it holds less than two per thread of what is queued;
        none while it is kept free for a wide task, or the maps come after the wide task
        gathering its workers (it waits hungry, and a wide task waiting may take it)."""
        address = ws.address
        if ws.status != "running" or self.registry.workers.get(address) is not ws:
            self.hungry.pop(address, None)
            return
        if ws.reserved is not None or (self.pending and self.held_back(self.pending[0].priority)):
            self.hungry[address] = ws
            if self.outstanding.get(address, 0) < ws.nthreads:
                self.slots_freed(ws)
            return
        if ws.processing and any(ts.suspicious for ts in ws.processing):
            self.quarantined.add(address)
            self.hungry.pop(address, None)
            return
        have = self.outstanding.get(address, 0)
        given = 0  # held tasks among them count here, but not in outstanding
        while self.pending:
            size = self._range_size()
            if have + given >= 2 * size * ws.nthreads:
                break
            n, sent = self._assign(ws, size)
            have += n
            given += sent - n
        self.outstanding[address] = have
        if self.pending:
            self.hungry.pop(address, None)
        else:
            self.hungry[address] = ws
        if have < ws.nthreads:
            self.slots_freed(ws)

    def _assign(self, ws: WorkerInfo, size: int) -> tuple[int, int]:
        """Give ``ws`` the next range of at most ``size`` queued elements; returns (elements
        it runs for the map, elements sent: those and the held tasks among them)."""
        self._epoch += 1
        m = self.pending[0]
        start, stop = m.take(size)
        if not m.free:
            self.pending.pop(0)
        state = m.state
        slot = self.store.slot(ws)
        n = stop - start
        given = m.given.get(slot)
        if given is None:
            given = m.given[slot] = Given()
            self.given_maps.setdefault(slot, {})[m] = None
        if state.count(QUEUED, start, stop) == n:  # the common case: all still queued
            state[start:stop] = bytes([PROCESSING]) * n
            m.where[start:stop] = array("i", [slot]) * n
            indices = list(range(start, stop))
            args = m.args[start:stop]
            given.add(start, stop)
        else:
            indices = [i for i in range(start, stop) if state[i] == QUEUED]
            for i in indices:
                state[i] = PROCESSING
                m.where[i] = slot
            for a, b in runs(indices):
                given.add(a, b)
            n = len(indices)
            if m.held:
                tasks = self.graph.tasks
                for i in range(start, stop):
                    ts = m.held.pop(i, None) if state[i] == PROMOTED else None
                    if ts is None:
                        continue
                    self.graph.held.discard(ts)
                    live = ts.state == "waiting" and tasks.get(ts.key) is ts
                    if not live:
                        continue  # forgotten, or released and kept for its dependents
                    # the range runs it; its report is the task's (range_finished)
                    self.graph.add_to_processing(ts, ws, send=False)
                    ws.executing.add(ts)
                    self._in_range(ws, ts)
                    indices.append(i)
                if len(indices) > n:
                    indices.sort()
                if not m.held:
                    self._maybe_drop(m)
            args = [m.args[i] for i in indices]
        if given.length > given.limit:
            given.compact(m.where, slot)
        if indices:
            self.out.send(ws.address, ComputeRange(m.prefix, m.function, indices, args))
        return n, len(indices)

    @handlers.on(ev.RangeFinished)
    def range_finished(self, e: ev.RangeFinished) -> None:
        """A worker holds the results of elements of a map."""
        ws = self.registry.workers.get(e.worker)
        if ws is None:
            return
        self._epoch += 1
        n = len(e.indices)
        if not len(e.nbytes) == len(e.types) == len(e.starts) == len(e.stops) == n:
            raise ev.MalformedMessage("range-finished: indices, nbytes, types, starts and "
                                      "stops differ in length")
        m = self.maps.get(e.prefix)
        slot = self.slots.get(ws.address, NO_SLOT)
        done: list[int] = []  # positions in the report of the elements now in memory
        stray: list[int] = []  # promoted, or unknown: one task's report each
        free: list[str] = []
        finished = 0
        if m is None:
            stray = list(range(n))
        else:
            state, where, nbytes, sizes = m.state, m.where, m.nbytes, e.nbytes
            size = len(state)
            held = 0  # bytes of the results now in memory
            for j, i in enumerate(e.indices):
                if i >= size:
                    stray.append(j)
                    continue
                st = state[i]
                if st == PROCESSING and where[i] == slot:
                    state[i] = MEMORY
                    b = sizes[j]
                    if b > 0:
                        nbytes[i] = b
                        held += b
                    else:
                        nbytes[i] = 0
                    done.append(j)
                    finished += 1
                elif st == FORGOTTEN and where[i] == slot:
                    where[i] = -1
                    m.n_orphans -= 1
                    free.append(m.prefix + str(i))
                    finished += 1
                elif st == PROMOTED:
                    stray.append(j)
                    if e.stops[j] > e.starts[j]:  # it measures the map's elements too
                        m.spent += e.stops[j] - e.starts[j]
                    m.n_done += 1
                else:  # a copy nobody asked for (its element is queued again)
                    free.append(m.prefix + str(i))
            if done:
                holds(ws, len(done), held)
                self._report(m, ws, e, done)
                if ws.status == "closing_gracefully":
                    self._promote_results(m, [e.indices[j] for j in done])
            self._maybe_drop(m)
        if free:
            self.out.send(ws.address, FreeKeys(free))
        if finished:
            self.outstanding[ws.address] = self.outstanding.get(ws.address, 0) - finished
        ranged = self.in_ranges.get(ws.address)
        for j in stray:
            if ranged:
                ts = self.graph.tasks.get(e.prefix + str(e.indices[j]))
                if ts is not None:
                    ranged.pop(ts, None)
            self.task_finished(self._one(e, j))
        if ranged is not None and not ranged:
            del self.in_ranges[ws.address]
        self.fill(ws)

    @staticmethod
    def _one(e: ev.RangeFinished, j: int) -> ev.TaskFinished:
        """The ``j``-th element of a report, as one task's report."""
        return ev.TaskFinished(key=e.prefix + str(e.indices[j]), nbytes=e.nbytes[j],
                               typename=e.types[j], start=e.starts[j], stop=e.stops[j],
                               worker=e.worker, now=e.now, stimulus_id=e.stimulus_id)

    def _report(self, m: BulkMap, ws: WorkerInfo, e: ev.RangeFinished, done: list[int]
                ) -> None:
        """Elements (positions ``done`` in report ``e``) are in memory: their client hears
        it in one message; their group's durations count them; a recorder (dashboard)
        sees each."""
        indices, types, starts, stops = e.indices, e.types, e.starts, e.stops
        if len(done) < len(indices):
            indices, types = [indices[j] for j in done], [types[j] for j in done]
            starts, stops = [starts[j] for j in done], [stops[j] for j in done]
        self.out.send(m.client, MapInMemory(m.prefix, list(indices), list(types)))
        spent = sum([d for d in map(sub, stops, starts) if d > 0.0])
        m.spent += spent
        m.n_done += len(done)
        tg = self.graph.groups.get(m.group)
        if tg is not None:
            tg.duration_total += spent
            tg.n_durations += len(done)
        mean = spent / len(done)
        before = self.element_time.get(ws.address)
        self.element_time[ws.address] = mean if before is None else (before + mean) / 2
        recorder = self.out.recorder
        if recorder is not None:
            prefix = m.prefix
            nbytes = e.nbytes if len(done) == len(e.nbytes) else [e.nbytes[j] for j in done]
            recorder.elements_finished(m.group, ws, [prefix + str(i) for i in indices],
                                       starts, stops, nbytes)

    def worker_left(self, ws: WorkerInfo) -> tuple[int, set[TaskState]]:
        """``ws`` left: its unfinished elements, and the results only it held, go back to
        the queue. Returns how many unfinished elements it held (any may have been
        running when it died), and the tasks its ranges ran (held ones, elements promoted
        while given): they count its death as the elements do, not as tasks said started
        (they run as tasks next, where a death while they run is theirs).

        A worker that died (not one retiring) may have died of an element it ran. Which
        one is not known here (a range's finished elements are reported in batches), so
        each unfinished element counts the death; one counted twice becomes a task of
        its own (its deaths in ranges counting as one), which says when it starts, and
        whose worker runs no range meanwhile (it gives back the elements it has not
        started and is given none while a suspect is its), so that a death while it runs
        is blamed on it alone, as for any task, until ``allowed_failures`` deaths make
        it err with ``KilledWorker``. A poison element thus kills one worker more than a
        poison task does, and its neighbours in a range run once more, each alone,
        instead of being blamed."""
        graceful = ws.status == "closing_gracefully"
        self.outstanding.pop(ws.address, None)
        self.hungry.pop(ws.address, None)
        self.releasing.pop(ws.address, None)
        self.element_time.pop(ws.address, None)
        ranged = self.in_ranges.pop(ws.address, None)
        tasks = self.graph.tasks
        spared = {ts for ts in ranged if ts.processing_on is ws
                  and tasks.get(ts.key) is ts} if ranged else set()
        slot = self.slots.pop(ws.address, None)
        if slot is None:
            return 0, spared
        self.slot_ws[slot] = None
        unfinished = 0 if graceful else len(spared)
        lost: dict[str, list[Key]] = {}
        alone = 1 if self.allowed_failures <= 2 else 2  # deaths that make an element a task
        suspects: list[tuple[BulkMap, int]] = []
        for m in self.given_maps.pop(slot, ()):
            given = m.given.pop(slot)
            where, state = m.where, m.state
            requeue: list[int] = []
            for i in given.held(where, slot):
                st = state[i]
                if st == FORGOTTEN:
                    where[i] = -1
                    m.n_orphans -= 1
                    continue
                if st == MEMORY:
                    lost.setdefault(m.client, []).append(m.prefix + str(i))
                elif not graceful:  # PROCESSING: it may be what killed the worker
                    unfinished += 1
                    if m.suspicious is None:
                        m.suspicious = bytearray(len(state))
                    n = m.suspicious[i] = min(m.suspicious[i] + 1, 255)
                    if n >= alone:
                        suspects.append((m, i))
                requeue.append(i)
            if requeue:
                m.requeue(requeue)
                if m not in self.pending:
                    self.pending.append(m)
                    self.pending.sort(key=lambda b: b.priority)
            self._maybe_drop(m)
        for m, i in suspects:
            ts = self.resolve(m.prefix + str(i), alone=True)  # queued: a task, run alone
            if ts is not None:  # the deaths in a range count once: which one did it is unknown
                ts.suspicious = 1
                ts.erred_on += (ws.address,)
        for client, keys in lost.items():
            if client != FIRE_AND_FORGET:
                for k in keys:
                    self.out.send(client, LostData(k))
        return unfinished, spared

    # ================================================================ taking elements back
    def _in_range(self, ws: WorkerInfo, ts: TaskState) -> None:
        """A range given to ``ws`` runs task ``ts`` (:attr:`in_ranges`). Those that left
        it unreported (released, erred) are dropped whenever the worker's count reaches a
        power of two from 64 on: at most twice those it runs, plus 64."""
        ranged = self.in_ranges.get(ws.address)
        if ranged is None:
            ranged = self.in_ranges[ws.address] = {}
        ranged[ts] = None
        n = len(ranged)
        if n >= 64 and not n & (n - 1):
            self._prune_ranged(ws, ranged)

    def _prune_ranged(self, ws: WorkerInfo, ranged: dict[TaskState, None]) -> None:
        tasks = self.graph.tasks
        for ts in [ts for ts in ranged if ts.processing_on is not ws
                   or tasks.get(ts.key) is not ts]:
            del ranged[ts]

    def release_all(self, ws: WorkerInfo) -> None:
        """``ws`` gives back every element it has not started (it paused, or retires), the
        tasks its ranges run among them (:attr:`in_ranges`: held, or promoted while given)."""
        have = self.outstanding.get(ws.address, 0)
        ranged = self.in_ranges.get(ws.address)
        if ranged:  # the tasks its ranges run, that it has not started, come back too
            self._prune_ranged(ws, ranged)
            have += len(ranged)
            if not ranged:
                del self.in_ranges[ws.address]
        if have:
            self._release(ws, have)

    def _release(self, ws: WorkerInfo, count: int) -> None:
        self.releasing[ws.address] = self.releasing.get(ws.address, 0) + 1
        self.out.send(ws.address, ReleaseRange(count))

    def steal(self) -> None:
        """Work stealing of ranges' tails: while no element is queued, each idle worker
        (a thread free, nothing queued for it) has one other worker give back half the
        elements it holds beyond its threads, if they are worth
        :data:`STEAL_MIN_SECONDS` at that worker's recent speed (unknown: worth it);
        the elements go back to the queue (``range-released``), and from there to the
        idle workers. The victims give back only elements they have not started, so
        none runs twice or is lost; a round that finds no victim is not repeated until
        ranges are given or reported. Off with ``scheduler.work-stealing``."""
        if not self.work_stealing or self.pending or not self.hungry \
                or self._fruitless == self._epoch:
            return
        outstanding, workers = self.outstanding, self.registry.workers
        thieves = [ws for ws in self.hungry.values() if ws.status == "running"
                   and outstanding.get(ws.address, 0) < ws.nthreads]
        if not thieves:
            return
        victims: list[tuple[int, WorkerInfo]] = []
        for address, have in outstanding.items():
            ws = workers.get(address)
            if ws is None or address in self.releasing or have <= ws.nthreads:
                continue
            count = (have - ws.nthreads + 1) // 2
            if count * self.element_time.get(address, STEAL_MIN_SECONDS) >= STEAL_MIN_SECONDS:
                victims.append((count, ws))
        if not victims:
            self._fruitless = self._epoch
            return
        victims.sort(key=lambda v: -v[0])
        for count, ws in victims[:len(thieves)]:
            self._release(ws, count)

    @handlers.on(ev.RangeReleased)
    def range_released(self, e: ev.RangeReleased) -> None:
        """A worker gave back elements it had not started (``release-range``): they go back
        to the queue, and to the workers that found it empty. An element promoted since it
        was given (a task now, counted as running there) is placed again as a task, also when
        its map is gone meanwhile (every element of it a task, or forgotten)."""
        ws = self.registry.workers.get(e.worker)
        if ws is None:
            return
        address = ws.address
        n = self.releasing.get(address, 0)
        if n > 1:
            self.releasing[address] = n - 1
        else:
            self.releasing.pop(address, None)
        slot = self.slots.get(address, NO_SLOT)
        back = 0
        again: list[TaskState] = []
        tasks = self.graph.tasks
        ranged = self.in_ranges.get(address)
        for prefix, indices in e.released.items():
            m = self.maps.get(prefix)
            if m is None:  # gone: its elements given back are tasks' (promoted), if any
                for i in set(indices):
                    ts = tasks.get(prefix + str(i))
                    if ts is not None and ts.state == "processing" and ts.processing_on is ws:
                        again.append(ts)
                continue
            state, where = m.state, m.where
            requeue: list[int] = []
            for i in sorted(set(indices)):
                if i >= len(state):
                    continue
                st = state[i]
                if st == PROCESSING and where[i] == slot:
                    requeue.append(i)
                elif st == FORGOTTEN and where[i] == slot:  # its report is due no more
                    where[i] = -1
                    m.n_orphans -= 1
                    back += 1
                elif st == PROMOTED:
                    ts = tasks.get(prefix + str(i))
                    if ts is not None and ts.state == "processing" and ts.processing_on is ws:
                        again.append(ts)
            if requeue:
                back += len(requeue)
                m.requeue(requeue)
                if m not in self.pending:
                    self.pending.append(m)
                    self.pending.sort(key=lambda b: b.priority)
            self._maybe_drop(m)
        if back:
            self.outstanding[address] = self.outstanding.get(address, 0) - back
        graph = self.graph
        for ts in again:
            if ranged:
                ranged.pop(ts, None)
            graph.transition(ts, "waiting")
        if ranged is not None and not ranged:
            del self.in_ranges[address]
        graph.transitions([(ts, "processing") for ts in again])
        self.hungry.pop(address, None)  # what it gave back goes to others first
        self.fill_hungry()
        if ws.status == "running" and not self.outstanding.get(address):
            self.fill(ws)

    def retire(self, addresses: list[str]) -> None:
        """Workers start retiring: they give back the elements they have not started, and
        the results they hold become tasks of their own, which the retirement moves to
        other workers as it moves any result (:class:`~.maintenance.Maintenance`); so do
        those of the elements still running there, once reported."""
        for address in addresses:
            ws = self.registry.workers.get(address)
            slot = self.slots.get(address)
            if ws is None or slot is None:
                continue
            self.hungry.pop(address, None)
            self.retiring.add(address)
            self.release_all(ws)
            for m in list(self.given_maps.get(slot, ())):
                held = m.given[slot].held(m.where, slot)
                self._promote_results(m, [i for i in held if m.state[i] == MEMORY])

    def _retired_back(self) -> None:
        """Retiring workers that left are forgotten; one whose retirement was given up
        (its results had nowhere to go) runs again: it takes elements, or is hungry."""
        workers = self.registry.workers
        for address in list(self.retiring):
            ws = workers.get(address)
            if ws is None or ws.status != "closing_gracefully":
                self.retiring.discard(address)
                if ws is not None:
                    self.fill(ws)

    def _quarantine_over(self) -> None:
        """Workers whose suspect tasks are done take elements again (or are hungry)."""
        workers = self.registry.workers
        for address in list(self.quarantined):
            ws = workers.get(address)
            if ws is None:
                self.quarantined.discard(address)
            elif not any(ts.suspicious for ts in ws.processing):
                self.quarantined.discard(address)
                self.fill(ws)

    def _promote_results(self, m: BulkMap, indices: list[int]) -> None:
        prefix = m.prefix
        for i in indices:
            self.resolve(prefix + str(i))

    def promote_largest(self, ws: WorkerInfo, nbytes: float) -> None:
        """Results of elements that ``ws`` holds become tasks, largest first, until they
        weigh ``nbytes`` (a rebalance then moves them as it moves any result)."""
        slot = self.slots.get(ws.address)
        if slot is None:
            return
        held = [(m.nbytes[i], m.prefix, i) for m in self.given_maps.get(slot, ())
                for i in m.given[slot].held(m.where, slot) if m.state[i] == MEMORY]
        held.sort(key=lambda h: -h[0])
        total = 0
        for size, prefix, i in held:
            if total >= nbytes:
                break
            self.resolve(prefix + str(i))
            total += size

    def elements_on(self, ws: WorkerInfo) -> int:
        """Elements ``ws`` runs or was given for the maps (a retirement waits for them)."""
        return self.outstanding.get(ws.address, 0)

    # ================================================================ queries
    def element_seconds(self, m: BulkMap) -> float | None:
        """Seconds one element of ``m`` is expected to take: the mean of its elements
        reported so far, else its TaskGroup's (elements promoted, tasks of the same
        name), else None (nothing measured yet)."""
        seconds = m.mean_seconds()
        if seconds is None:
            tg = self.graph.groups.get(m.group)
            seconds = tg.average_duration if tg is not None else None
        return seconds

    def waiting(self) -> list[tuple[str, int, float | None]]:
        """The work waiting in the maps' queues, given to no worker yet: ``(TaskGroup,
        elements, seconds each as in element_seconds)`` per map with queued elements. The
        held tasks among them count (a range runs them); promoted or forgotten elements
        still in a queue's ranges do not. Visits the queue's ranges, not the elements."""
        out = []
        for m in self.pending:
            state = m.state
            n = sum(state.count(QUEUED, a, b) for a, b in m.free)
            n += sum(1 for ts in m.held.values() if ts.state == "waiting")
            if n:
                out.append((m.group, n, self.element_seconds(m)))
        return out

    def given_work(self, unknown: float) -> dict[str, tuple[int, float]]:
        """What each worker was given of the maps and has not reported, by address:
        ``(elements, their expected seconds)``, each at the worker's recent time per
        element, else the first map's (:meth:`element_seconds`), else ``unknown``. What
        it holds of their results is in its ``nbytes`` and ``n_elements``. One entry per
        worker given elements, not per element."""
        first = self.element_seconds(self.pending[0]) if self.pending else None
        out: dict[str, tuple[int, float]] = {}
        for address, given in self.outstanding.items():
            if given:
                each = self.element_time.get(address, first)
                out[address] = (given, given * (unknown if each is None else each))
        return out

    def validate(self) -> None:
        """The counters agree with the arrays."""
        per_slot: dict[int, int] = {}
        for prefix, m in self.maps.items():
            assert m.prefix == prefix
            st = m.state
            assert m.n_live == st.count(QUEUED) + st.count(PROCESSING) + st.count(MEMORY), m
            orphans = 0
            for i, s in enumerate(st):
                w = m.where[i]
                if s in (PROCESSING, MEMORY):
                    assert w >= 0 and self.slot_ws[w] is not None, (prefix, i)
                if s == FORGOTTEN and w >= 0:
                    orphans += 1
                if s in (PROCESSING, FORGOTTEN) and w >= 0:
                    per_slot[w] = per_slot.get(w, 0) + 1
                if s == QUEUED:
                    assert w == -1 and any(a <= i < b for a, b in m.free), (prefix, i)
            assert orphans == m.n_orphans, (prefix, orphans, m.n_orphans)
            assert (m in self.pending) == bool(m.free), prefix
            assert m.n_free == sum(b - a for a, b in m.free), prefix
            assert all(m.free[k][1] < m.free[k + 1][0] for k in range(len(m.free) - 1)), prefix
            # every element a worker runs or holds is in the runs given to it
            for to, given in m.given.items():
                assert m in self.given_maps[to], (prefix, to)
                r = given.runs
                inside = {i for k in range(0, len(r), 2) for i in range(r[k], r[k + 1])}
                assert inside.issuperset(i for i, w in enumerate(m.where) if w == to), \
                    (prefix, to)
            assert not {w for w in m.where if w >= 0} - set(m.given), prefix
        for given_to, maps in self.given_maps.items():
            assert all(self.maps.get(m.prefix) is m and given_to in m.given for m in maps), \
                given_to
        for addr, ws in self.hungry.items():
            assert self.registry.workers.get(addr) is ws, addr
        for addr, n in self.releasing.items():
            assert n > 0 and addr in self.registry.workers, addr
        for addr, n in self.outstanding.items():
            slot = self.slots.get(addr)
            assert n == (per_slot.get(slot, 0) if slot is not None else 0), (addr, n)
        # each worker's count and bytes of the elements' results it holds
        results: dict[int, list[int]] = {}
        for m in self.maps.values():
            for i, s in enumerate(m.state):
                if s == MEMORY:
                    got = results.setdefault(m.where[i], [0, 0])
                    got[0] += 1
                    got[1] += m.nbytes[i]
        for ws in self.registry.workers.values():
            slot = self.slots.get(ws.address)
            n, size = results.get(slot, (0, 0)) if slot is not None else (0, 0)
            assert (ws.n_elements, ws.element_nbytes) == (n, size), (ws, n, size)
        # a held task waits in its map's queue, from which a range will take it
        held: set[TaskState] = set()
        for prefix, m in self.maps.items():
            for i, ts in m.held.items():
                assert m.state[i] == PROMOTED and any(a <= i < b for a, b in m.free), (prefix, i)
                held.add(ts)
        assert self.graph.held <= held, self.graph.held - held
        for addr in self.in_ranges:
            assert addr in self.registry.workers, addr
