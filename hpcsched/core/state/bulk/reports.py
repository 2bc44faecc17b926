"""What comes back of bulk maps' elements: results, elements given back, departures.

:class:`Reports` turns a worker's ``range-finished`` into elements in memory (their
client hears one ``map-in-memory``, their group's durations count them), a
``range-released`` into elements queued again, and a worker's departure or retirement
into elements queued again and results lost or made tasks. It owns no table of its
own: it moves elements in the :class:`~.book.MapBook`, their count per worker in the
:class:`~.handout.Handout`, and hands a promoted element's report to the scheduler's
handler of one task's result.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import sub
from typing import Any

from hpcsched.core.protocol.messages import FreeKeys, LostData, MapInMemory
from hpcsched.core.state import events as ev
from hpcsched.core.state.bulk.book import MapBook
from hpcsched.core.state.bulk.elements import (
    FORGOTTEN,
    MEMORY,
    NO_SLOT,
    PROCESSING,
    PROMOTED,
    BulkMap,
    holds,
)
from hpcsched.core.state.bulk.handout import Handout
from hpcsched.core.state.bulk.promotion import Promotions
from hpcsched.core.state.model import FIRE_AND_FORGET, Outbox, TaskState, WorkerInfo
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.settings import SchedulerSettings
from hpcsched.core.state.tasks import TaskGraph

Key = Any


class Reports:
    """The workers' reports of elements (module docstring). ``task_finished``: the
    scheduler's handler of one task's result (a promoted element's report goes there)."""

    def __init__(
        self,
        book: MapBook,
        handout: Handout,
        promotions: Promotions,
        graph: TaskGraph,
        registry: WorkerRegistry,
        out: Outbox,
        task_finished: Callable[[ev.TaskFinished], None],
        settings: SchedulerSettings,
    ):
        self.book = book
        self.handout = handout
        self.promotions = promotions
        self.graph = graph
        self.registry = registry
        self.out = out
        self.task_finished = task_finished
        self.allowed_failures = settings.allowed_failures

    def range_finished(self, e: ev.RangeFinished) -> None:
        """A worker holds the results of elements of a map."""
        ws = self.registry.workers.get(e.worker)
        if ws is None:
            return
        n = len(e.indices)
        if not len(e.nbytes) == len(e.types) == len(e.starts) == len(e.stops) == n:
            raise ev.MalformedMessage(
                "range-finished: indices, nbytes, types, starts and stops differ in length"
            )
        m = self.book.maps.get(e.prefix)
        slot = self.book.store.slots.get(ws.address, NO_SLOT)
        done: list[int] = []  # positions in the report of the elements now in memory
        stray: list[int] = []  # promoted, or unknown: one task's report each
        free: list[str] = []
        finished = 0
        mean = None
        if m is None:
            stray = list(range(n))
        else:
            state, where, nbytes, sizes = m.state, m.where, m.nbytes, e.nbytes
            size = len(state)
            for j, i in enumerate(e.indices):
                if i >= size:
                    stray.append(j)
                    continue
                st = state[i]
                if st == PROCESSING and where[i] == slot:
                    state[i] = MEMORY
                    nbytes[i] = sizes[j]  # a count >= 0 (checked as it is decoded)
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
                # summed apart from the loop above: one C loop over the report, not an
                # addition of Python ints per element
                held = sum(sizes) if len(done) == n else sum([sizes[j] for j in done])
                holds(ws, len(done), held)
                mean = self._in_memory(m, ws, e, done)
                if ws.status == "closing_gracefully":
                    self.promotions.promote_results(m, [e.indices[j] for j in done])
            self.book.drop_if_done(m)
        if free:
            self.out.send(ws.address, FreeKeys(free))
        self.handout.reported(ws.address, finished, mean)
        for j in stray:
            self.promotions.out_of_range(ws, e.prefix + str(e.indices[j]))
            self.task_finished(self._one(e, j))
        self.handout.fill(ws)

    @staticmethod
    def _one(e: ev.RangeFinished, j: int) -> ev.TaskFinished:
        """The ``j``-th element of a report, as one task's report."""
        return ev.TaskFinished(
            key=e.prefix + str(e.indices[j]),
            nbytes=e.nbytes[j],
            typename=e.types[j],
            start=e.starts[j],
            stop=e.stops[j],
            cpu=e.cpu / len(e.indices),
            memory=e.memory,
            worker=e.worker,
            now=e.now,
            stimulus_id=e.stimulus_id,
        )

    def _in_memory(self, m: BulkMap, ws: WorkerInfo, e: ev.RangeFinished, done: list[int]) -> float:
        """Elements (positions ``done`` in report ``e``) are in memory: their client hears
        it in one message; their group's durations count them; a recorder (dashboard)
        sees each. Returns the seconds they took each, on average."""
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
        recorder = self.out.recorder
        if recorder is not None:
            prefix = m.prefix
            nbytes = e.nbytes if len(done) == len(e.nbytes) else [e.nbytes[j] for j in done]
            # the report's CPU time shared by the elements it counts here
            cpu = e.cpu * len(done) / len(e.indices) if e.cpu else 0.0
            recorder.elements_finished(
                m.group, ws, [prefix + str(i) for i in indices], starts, stops, nbytes,
                cpu, e.memory,
            )
        return spent / len(done)

    def range_released(self, e: ev.RangeReleased) -> None:
        """A worker gave back elements it had not started (``release-range``): they go back
        to the queue, and to the workers that found it empty. An element promoted since it
        was given (a task now, counted as running there) is placed again as a task, also when
        its map is gone meanwhile (every element of it a task, or forgotten)."""
        ws = self.registry.workers.get(e.worker)
        if ws is None:
            return
        slot = self.book.store.slots.get(ws.address, NO_SLOT)
        back = 0
        again: list[TaskState] = []
        tasks = self.graph.tasks
        for prefix, indices in e.released.items():
            m = self.book.maps.get(prefix)
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
                self.book.requeue(m, requeue)
            self.book.drop_if_done(m)
        self.handout.answered(ws.address, back)
        graph = self.graph
        for ts in again:
            self.promotions.out_of_range(ws, ts.key)
            graph.transition(ts, "waiting")
        graph.transitions([(ts, "processing") for ts in again])
        self.handout.fill_hungry()
        if ws.status == "running" and not self.handout.outstanding.get(ws.address):
            self.handout.fill(ws)

    def orphan_erred(self, ws: WorkerInfo, key: Key) -> None:
        """An element forgotten while ``ws`` ran it raised there: that was its report
        (as a ``range-finished`` would have been), due no more."""
        found = self.book.store.element(key)
        if found is None:
            return
        m, i = found
        if m.state[i] == FORGOTTEN and m.where[i] == self.book.store.slots.get(ws.address, NO_SLOT):
            m.where[i] = -1
            m.n_orphans -= 1
            self.handout.count_back(ws.address)
            self.book.drop_if_done(m)

    def retire(self, addresses: list[str]) -> None:
        """Workers start retiring: they give back the elements they have not started, and
        the results they hold become tasks of their own, which the retirement moves to
        other workers as it moves any result (:class:`~.maintenance.Maintenance`); so do
        those of the elements still running there, once reported."""
        store = self.book.store
        for address in addresses:
            ws = self.registry.workers.get(address)
            slot = store.slots.get(address)
            if ws is None or slot is None:
                continue
            self.handout.set_aside(ws, retiring=True)
            for m in list(store.given_maps.get(slot, ())):
                held = m.given[slot].held(m.where, slot)
                self.promotions.promote_results(m, [i for i in held if m.state[i] == MEMORY])

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
        self.handout.forget(ws.address)
        spared = self.promotions.left(ws)
        store = self.book.store
        slot = store.slots.pop(ws.address, None)
        if slot is None:
            return 0, spared
        store.slot_ws[slot] = None
        unfinished = 0 if graceful else len(spared)
        lost: dict[str, list[Key]] = {}
        alone = 1 if self.allowed_failures <= 2 else 2  # deaths that make an element a task
        suspects: list[tuple[BulkMap, int]] = []
        for m in store.given_maps.pop(slot, ()):
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
                self.book.requeue(m, requeue)
            self.book.drop_if_done(m)
        for m, i in suspects:
            ts = self.promotions.resolve(m.prefix + str(i), alone=True)  # a task, run alone
            if ts is not None:  # the deaths in a range count once: which one did it is unknown
                ts.suspicious = 1
                ts.erred_on += (ws.address,)
        for client, keys in lost.items():
            if client != FIRE_AND_FORGET:
                for k in keys:
                    self.out.send(client, LostData(k))
        return unfinished, spared
