"""Elements of bulk maps made tasks of their own, and the tasks that ranges run.

An element becomes a :class:`~.model.TaskState` only by an explicit call,
:meth:`~.tasks.TaskGraph.promote`, which asks :meth:`Promotions.resolve` (the package's
docstring says when). :class:`Promotions` owns what that leaves to do after the event
(tasks promoted while released, held tasks whose map is gone) and, per worker, the tasks
that a range given to it runs (held tasks, elements promoted while given): not counted
among its elements, yet a paused or retiring worker gives them back too, and a death
while they run counts as its range's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.state.bulk.book import MapBook
from hpcsched.core.state.bulk.elements import MEMORY, PROCESSING, PROMOTED, QUEUED, BulkMap, holds
from hpcsched.core.state.model import TaskState, WorkerInfo
from hpcsched.core.state.tasks import TaskGraph

Key = Any


class Promotions:
    """Elements made tasks (module docstring). ``uncount(address)``: an element the worker
    at ``address`` was given is a task now, no longer one of its elements."""

    def __init__(self, book: MapBook, graph: TaskGraph, uncount: Callable[[str], None]):
        self.book = book
        self.graph = graph
        self.uncount = uncount
        self.promoted: list[TaskState] = []  # queued elements promoted during this event
        self.unheld: list[TaskState] = []  # held tasks whose map is gone: ready to place
        # worker -> tasks a range given to it runs (held tasks, elements promoted while
        # given): not among its elements, yet a paused or retiring worker gives them back
        self.in_ranges: dict[str, dict[TaskState, None]] = {}
        graph.promote_element = self.resolve

    def resolve(self, key: Key, alone: bool = False) -> TaskState | None:
        """Element ``key`` as a task of its own, or None. A queued element stays in the
        queue, its task held in ``waiting`` until a range with it goes to a worker
        (:meth:`run_held`), so that a task combining neighbouring elements finds them on
        one worker; ``alone``: it leaves the queue and runs as any task (a suspect of a
        worker's death)."""
        found = self.book.store.element(key)
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
        ws = self.book.store.slot_ws[w] if w >= 0 else None
        m.state[i] = PROMOTED
        m.n_live -= 1
        m.where[i] = -1
        if st == PROCESSING and ws is not None:
            self.uncount(ws.address)
            graph.transition(ts, "waiting")
            graph.add_to_processing(ts, ws, send=False)
            # it may be running: neither stolen nor moved off a retiring worker (its death
            # counts as its range's elements': Reports.worker_left)
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
        self.book.drop_if_done(m)
        return ts

    def promote_results(self, m: BulkMap, indices: list[int]) -> None:
        """The results of elements ``indices`` of ``m`` become tasks' results."""
        prefix = m.prefix
        for i in indices:
            self.resolve(prefix + str(i))

    def promote_largest(self, ws: WorkerInfo, nbytes: float) -> None:
        """Results of elements that ``ws`` holds become tasks, largest first, until they
        weigh ``nbytes`` (a rebalance then moves them as it moves any result)."""
        store = self.book.store
        slot = store.slots.get(ws.address)
        if slot is None:
            return
        held = [
            (m.nbytes[i], m.prefix, i)
            for m in store.given_maps.get(slot, ())
            for i in m.given[slot].held(m.where, slot)
            if m.state[i] == MEMORY
        ]
        held.sort(key=lambda h: -h[0])
        total = 0
        for size, prefix, i in held:
            if total >= nbytes:
                break
            self.resolve(prefix + str(i))
            total += size

    # ================================================================ after the event
    def take_promoted(self) -> list[TaskState]:
        """The elements promoted while queued or released, since the last call."""
        out = self.promoted[:]
        self.promoted.clear()
        return out

    def take_unheld(self) -> list[TaskState]:
        """The held tasks whose map is gone, since the last call: placed as any task."""
        out = self.unheld[:]
        self.unheld.clear()
        return out

    def unhold(self, m: BulkMap) -> None:
        """``m`` is done with but for its held tasks (every other element is gone): they
        leave its queue and run as any task (after the event: :attr:`unheld`)."""
        tasks, held = self.graph.tasks, self.graph.held
        for ts in m.held.values():
            held.discard(ts)
            if tasks.get(ts.key) is ts and ts.state == "waiting":
                self.unheld.append(ts)
        m.held.clear()

    # ================================================================ tasks in ranges
    def run_held(
        self, ws: WorkerInfo, m: BulkMap, start: int, stop: int, indices: list[int]
    ) -> None:
        """A range ``start:stop`` of ``m`` goes to ``ws``: the held tasks in it run there,
        their indices added to ``indices`` (sorted); their reports are the tasks'."""
        tasks, graph = self.graph.tasks, self.graph
        n = len(indices)
        state = m.state
        for i in range(start, stop):
            ts = m.held.pop(i, None) if state[i] == PROMOTED else None
            if ts is None:
                continue
            graph.held.discard(ts)
            if ts.state != "waiting" or tasks.get(ts.key) is not ts:
                continue  # forgotten, or released and kept for its dependents
            graph.add_to_processing(ts, ws, send=False)
            ws.executing.add(ts)
            self._in_range(ws, ts)
            indices.append(i)
        if len(indices) > n:
            indices.sort()
        if not m.held:
            self.book.drop_if_done(m)

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
            self._prune(ws, ranged)

    def _prune(self, ws: WorkerInfo, ranged: dict[TaskState, None]) -> None:
        tasks = self.graph.tasks
        for ts in [
            ts for ts in ranged if ts.processing_on is not ws or tasks.get(ts.key) is not ts
        ]:
            del ranged[ts]

    def in_range(self, address: str) -> int:
        """How many tasks the ranges given to the worker at ``address`` run, at most (a
        count, no pruning: those that left it unreported stay counted until the next
        prune; :meth:`unstarted` counts exactly)."""
        ranged = self.in_ranges.get(address)
        return len(ranged) if ranged else 0

    def seconds_each(self, address: str) -> float | None:
        """The measured duration of the tasks the ranges given to the worker at
        ``address`` run, their TaskGroup's as one of them tells it (one stands for all: a
        worker's ranges are mostly of one map), or None (not measured, or no such task)."""
        ranged = self.in_ranges.get(address)
        return next(iter(ranged)).group.average_duration if ranged else None

    def unstarted(self, ws: WorkerInfo) -> int:
        """How many tasks the ranges given to ``ws`` run still (it gives them back with
        its elements when it pauses or retires)."""
        ranged = self.in_ranges.get(ws.address)
        if not ranged:
            return 0
        self._prune(ws, ranged)
        if not ranged:
            del self.in_ranges[ws.address]
        return len(ranged)

    def out_of_range(self, ws: WorkerInfo, key: Key) -> None:
        """Task ``key`` that a range gave ``ws`` was reported or given back."""
        ranged = self.in_ranges.get(ws.address)
        if ranged:
            ts = self.graph.tasks.get(key)
            if ts is not None:
                ranged.pop(ts, None)
        if ranged is not None and not ranged:
            del self.in_ranges[ws.address]

    def left(self, ws: WorkerInfo) -> set[TaskState]:
        """``ws`` left: the tasks its ranges ran, that were still its."""
        ranged = self.in_ranges.pop(ws.address, None)
        tasks = self.graph.tasks
        return (
            {ts for ts in ranged if ts.processing_on is ws and tasks.get(ts.key) is ts}
            if ranged
            else set()
        )

    def validate(self, workers: dict[str, WorkerInfo]) -> None:
        """A held task waits in its map's queue, from which a range will take it."""
        held: set[TaskState] = set()
        for prefix, m in self.book.maps.items():
            for i, ts in m.held.items():
                assert m.state[i] == PROMOTED and any(a <= i < b for a, b in m.free), (prefix, i)
                held.add(ts)
        assert self.graph.held <= held, self.graph.held - held
        for addr in self.in_ranges:
            assert addr in workers, addr
