"""The scheduler state's one view of bulk maps: :class:`BulkMaps`, a shell over the parts.

It builds the parts (the package's docstring), takes the maps' messages (``update-map``,
``range-finished``, ``range-released``), hears the events of the scheduler that concern
elements, and answers the views. Each method hands the work to the part owning it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.state import events as ev
from hpcsched.core.state.bulk.book import MapBook
from hpcsched.core.state.bulk.handout import Handout
from hpcsched.core.state.bulk.promotion import Promotions
from hpcsched.core.state.bulk.reports import Reports
from hpcsched.core.state.model import Outbox, TaskState, WorkerInfo
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.settings import SchedulerSettings
from hpcsched.core.state.tasks import TaskGraph

Key = Any


class BulkMaps:
    """The bulk maps of the scheduler and the handlers of their messages (the package's
    docstring). ``task_finished`` is the scheduler's handler of one task's result (a
    promoted element's report goes there). The parts' tables are here under the names
    the scheduler state and the tests read (the same objects: never rebound)."""

    handlers = Handlers("scheduler state (bulk maps)")

    def __init__(
        self,
        graph: TaskGraph,
        registry: WorkerRegistry,
        out: Outbox,
        task_finished: Callable[[ev.TaskFinished], None],
        settings: SchedulerSettings,
    ):
        self.registry = registry
        self.out = out
        self.book = book = MapBook(graph)
        self.promotions = Promotions(book, graph, lambda address: handout.count_back(address))
        self.handout = handout = Handout(book, self.promotions, registry, out, settings)
        self.reports = Reports(
            book, handout, self.promotions, graph, registry, out, task_finished, settings
        )
        self.store = book.store
        self.maps = book.maps
        self.pending = book.pending
        self.spent = book.spent
        self.slots = book.store.slots
        self.given_maps = book.store.given_maps
        self.outstanding = handout.outstanding
        self.hungry = handout.hungry
        self.releasing = handout.releasing
        self.promoted = self.promotions.promoted
        self.unheld = self.promotions.unheld
        self.in_ranges = self.promotions.in_ranges

    def wait_on(
        self,
        slots_freed: Callable[[WorkerInfo], None],
        held_back: Callable[[tuple], bool],
        lifetime_allows: Callable[[WorkerInfo, float | None, str], bool],
    ) -> None:
        """Tell the placement of tasks when a worker's threads are free of elements (a
        wide task waiting may take it), and ask it whether maps of a priority wait behind
        a wide task gathering its workers, and whether a worker stays long enough for
        elements of so many seconds."""
        self.handout.slots_freed = slots_freed
        self.handout.held_back = held_back
        self.handout.lifetime_allows = lifetime_allows

    # ================================================================ messages
    @handlers.on(ev.UpdateMap)
    def update_map(self, e: ev.UpdateMap) -> None:
        """A block of a map arrived: hold it, give ranges to the workers."""
        if self.book.add_block(e):
            self.handout.fill_all()

    @handlers.on(ev.RangeFinished)
    def range_finished(self, e: ev.RangeFinished) -> None:
        """A worker holds the results of elements of a map."""
        self.reports.range_finished(e)

    @handlers.on(ev.RangeReleased)
    def range_released(self, e: ev.RangeReleased) -> None:
        """A worker gave back elements it had not started."""
        self.reports.range_released(e)

    # ================================================================ the scheduler's events
    def release(self, keys: list, client: str) -> list:
        """``client`` dropped its futures of ``keys``: the elements among them are
        forgotten; returns the other keys, which the caller releases as tasks."""
        return self.book.release(keys, client)

    def flush_frees(self) -> None:
        """Tell each worker the forgotten results it may drop, in one message."""
        self.book.flush_frees(self.out)

    def remove_client(self, client: str) -> None:
        """``client`` left: its maps' elements are forgotten."""
        book = self.book
        for m in [m for m in book.maps.values() if m.client == client]:
            book.forget_all(m)
            self.promotions.unhold(m)
            book.drop_if_done(m)
        book.flush_frees(self.out)

    def resolve(self, key: Key, alone: bool = False) -> TaskState | None:
        """Element ``key`` as a task of its own, or None (:mod:`.promotion`)."""
        return self.promotions.resolve(key, alone)

    def take_promoted(self) -> list[TaskState]:
        """The elements promoted while queued or released, to move to ``waiting``."""
        return self.promotions.take_promoted()

    def take_unheld(self) -> list[TaskState]:
        """The held tasks whose map is gone, to place as any task."""
        return self.promotions.take_unheld()

    def after(
        self, e: ev.AddWorker | ev.WorkerStatusChange | ev.Tick | ev.TaskStarted | ev.TaskErred
    ) -> None:
        """After a worker joined or changed status, hand out elements: to it, and to the
        workers that found the queue empty (never the whole cluster, so that a worker
        coming costs what it takes); a paused worker gives back those it has not started,
        and so does one where a suspect task starts. A worker whose element raised is
        topped up (it reports a batch of failures only with no ``range-finished``). On a
        tick, idle workers steal (:meth:`.handout.Handout.steal`). (A worker that left:
        its elements go back to the queue, and from there to the workers that found it
        empty, in whatever event removed it: :meth:`worker_left`, then
        :meth:`fill_hungry`.)"""
        handout, workers = self.handout, self.registry.workers
        if isinstance(e, ev.TaskErred):
            ws = workers.get(e.worker)
            if ws is not None:
                self.reports.orphan_erred(ws, e.key)
                self.promotions.out_of_range(ws, e.key)  # its load no longer
                handout.fill(ws)
            return
        if isinstance(e, ev.Tick):
            handout.on_tick()
            return
        if isinstance(e, ev.TaskStarted):
            ts = self.book.graph.tasks.get(e.key)
            ws = workers.get(e.worker)
            if ts is not None and ts.suspicious and ws is not None and ts.processing_on is ws:
                handout.set_aside(ws)
            return
        address = e.worker if isinstance(e, ev.WorkerStatusChange) else e.address
        ws = workers.get(address)
        if ws is not None and ws.status == "paused":
            handout.hungry.pop(address, None)
            handout.release_all(ws)
        if ws is not None:
            handout.fill(ws)  # nothing queued: it is marked hungry (a thief, if idle)
        handout.fill_hungry()

    def fill_hungry(self) -> None:
        """Top up the workers that found the queue empty (:mod:`.handout`)."""
        self.handout.fill_hungry()

    @property
    def fill_pending(self) -> bool:
        """Hungry workers wait for the next part of a map's first wave (``FillQueue``)."""
        return self.handout.fill_pending

    def fill_wave(self) -> None:
        """``FillQueue``: the next free workers of a map's first wave get ranges, all of
        them once the map's elements have a measured time."""
        if self.handout.first_wave:
            self.handout.fill_hungry()

    def worker_left(self, ws: WorkerInfo) -> tuple[int, set[TaskState]]:
        """``ws`` left (:meth:`.reports.Reports.worker_left`)."""
        return self.reports.worker_left(ws)

    def retire(self, addresses: list[str]) -> None:
        """Workers start retiring (:meth:`.reports.Reports.retire`)."""
        self.reports.retire(addresses)

    def promote_largest(self, ws: WorkerInfo, nbytes: float) -> None:
        """Results of elements that ``ws`` holds become tasks, largest first, until they
        weigh ``nbytes``."""
        self.promotions.promote_largest(ws, nbytes)

    # ================================================================ views
    def elements_on(self, ws: WorkerInfo) -> int:
        """Elements ``ws`` runs or was given for the maps (a retirement waits for them)."""
        return self.handout.outstanding.get(ws.address, 0)

    def waiting(self) -> list[tuple[str, int, float | None]]:
        """The work waiting in the maps' queues (:meth:`.book.MapBook.waiting`)."""
        return self.book.waiting()

    def given_work(self, unknown: float) -> dict[str, tuple[int, int, float]]:
        """What each worker holds of the maps and has not reported: elements and tasks
        (:meth:`.handout.Handout.given_work`)."""
        return self.handout.given_work(unknown)

    def validate(self) -> None:
        """The parts' counters agree with the arrays and with each other."""
        per_slot = self.book.validate(self.registry)
        self.handout.validate(per_slot)
        self.promotions.validate(self.registry.workers)
