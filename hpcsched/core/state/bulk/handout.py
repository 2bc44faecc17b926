"""Handing out bulk maps' elements to workers as ranges, and asking for them back.

:class:`Handout` owns each worker's load of elements (given and not reported), its
recent time per element, the workers that found the queue empty ("hungry"), the
release-range requests unanswered, and the workers given nothing for a while: retiring
ones, and those running a suspect task (one a worker died running: it runs alone
there, so that a death is its own). The ranges come from the :class:`~.book.MapBook`'s
queue, sized by guided self-scheduling (the package's docstring).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

from hpcsched.core.protocol.messages import ComputeRange, ReleaseRange
from hpcsched.core.state.bulk.book import MapBook
from hpcsched.core.state.bulk.elements import PROCESSING, QUEUED, Given, runs
from hpcsched.core.state.bulk.promotion import Promotions
from hpcsched.core.state.model import Outbox, WorkerInfo
from hpcsched.core.state.policies import FIRST_WAVE_WORKERS
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.settings import SchedulerSettings

#: elements in one compute-range at most (large enough that messages cost little per
#: element, small enough that a worker leaving loses little)
MAX_RANGE = 4096
#: ranges per thread of the cluster the unassigned elements are cut into (guided
#: self-scheduling's divisor)
RANGES_PER_THREAD = 4
#: seconds of work a range holds at least once its map's elements have a measured time
#: (the package's docstring); the tail it may leave a worker with stays under a round
#: trip's worth of stealing (STEAL_MIN_SECONDS)
RANGE_SECONDS = 0.005
#: seconds of a worker's elements not yet started, at least, that are worth a steal
#: (a round trip to it costs well under a millisecond)
STEAL_MIN_SECONDS = 0.01


class Handout:
    """Ranges to workers, and back (module docstring). ``slots_freed(ws)``: ``ws`` has
    threads free of elements (a wide task waiting may take it); ``held_back(priority)``:
    maps of that priority wait behind a wide task gathering its workers."""

    def __init__(
        self,
        book: MapBook,
        promotions: Promotions,
        registry: WorkerRegistry,
        out: Outbox,
        settings: SchedulerSettings,
    ):
        self.book = book
        self.promotions = promotions
        self.registry = registry
        self.out = out
        self.work_stealing = settings.work_stealing  # idle workers take ranges' tails (steal)
        self.outstanding: dict[str, int] = {}  # worker -> elements it runs for the maps
        # running workers that would take more than the queue has left (they are topped
        # up when elements go back to the queue)
        self.hungry: dict[str, WorkerInfo] = {}
        self.releasing: dict[str, int] = {}  # worker -> release-range requests unanswered
        self.element_time: dict[str, float] = {}  # worker -> seconds per element, recently
        self.retiring: set[str] = set()  # workers told to retire (they may run again)
        # workers given no elements while a suspect task is theirs (WorkerEvents blames it)
        self.quarantined: set[str] = set()
        self.first_wave = False  # hungry workers wait for the rest of a map's first wave
        self._epoch = 0  # ranges given or reported so far (a steal round may find more)
        self._fruitless = -1  # the epoch at which a steal round found no worker to steal from
        self.slots_freed: Callable[[WorkerInfo], None] = lambda ws: None
        self.held_back: Callable[[tuple], bool] = lambda priority: False
        # whether a worker may start work of so many seconds of a group (its lifetime)
        self.lifetime_allows: Callable[[WorkerInfo, float | None, str], bool] = (
            lambda ws, seconds, group: True
        )

    # ================================================================ the load
    def load(self, address: str) -> int:
        """What the worker at ``address`` holds of the maps: its elements and the tasks its
        ranges run (an element made a task, by a client wanting it for instance, is still
        work that worker holds: counting only elements would hand such a map out at once
        and leave nothing to steal)."""
        return self.outstanding.get(address, 0) + self.promotions.in_range(address)

    def elements_on(self, ws: WorkerInfo) -> int:
        """Elements ``ws`` runs or was given for the maps (a retirement waits for them)."""
        return self.outstanding.get(ws.address, 0)

    def count_back(self, address: str, n: int = 1) -> None:
        """``n`` elements the worker at ``address`` was given are no longer its to run
        (reported, given back, made tasks)."""
        if n:
            self.outstanding[address] = self.outstanding.get(address, 0) - n

    def reported(self, address: str, n: int, mean: float | None = None) -> None:
        """The worker at ``address`` reported ``n`` of its elements, which took ``mean``
        seconds each (None: none of them measured)."""
        self._epoch += 1
        self.count_back(address, n)
        if mean is not None:
            before = self.element_time.get(address)
            self.element_time[address] = mean if before is None else (before + mean) / 2

    def answered(self, address: str, n: int) -> None:
        """The worker at ``address`` answered a release-range, giving back ``n`` elements;
        what it gave back goes to others first."""
        left = self.releasing.get(address, 0)
        if left > 1:
            self.releasing[address] = left - 1
        else:
            self.releasing.pop(address, None)
        self.count_back(address, n)
        self.hungry.pop(address, None)

    def forget(self, address: str) -> None:
        """The worker at ``address`` left."""
        self.outstanding.pop(address, None)
        self.hungry.pop(address, None)
        self.releasing.pop(address, None)
        self.element_time.pop(address, None)

    def given_work(self, unknown: float) -> dict[str, tuple[int, int, float]]:
        """What each worker holds of the maps (:meth:`load`) and has not reported, by
        address: ``(elements, tasks its ranges run, expected seconds of both)``. An
        element takes the worker's recent time per element, else the first map's
        (:meth:`.book.MapBook.element_seconds`), else ``unknown``; a task the worker's
        recent time too, else its TaskGroup's measured duration
        (:meth:`.promotion.Promotions.seconds_each`). The tasks are counted as
        :meth:`.promotion.Promotions.in_range` does (at most). One entry per worker
        holding some, not per element."""
        pending = self.book.pending
        first = self.book.element_seconds(pending[0]) if pending else None
        promotions = self.promotions
        out: dict[str, tuple[int, int, float]] = {}
        for address in self.outstanding.keys() | promotions.in_ranges.keys():
            given = self.outstanding.get(address, 0)
            tasks = promotions.in_range(address)
            if not (given or tasks):
                continue
            recent = self.element_time.get(address)
            each = first if recent is None else recent
            seconds = given * (unknown if each is None else each)
            if tasks:
                each = recent if recent is not None else promotions.seconds_each(address)
                if each is None:
                    each = first
                seconds += tasks * (unknown if each is None else each)
            out[address] = (given, tasks, seconds)
        return out

    # ================================================================ giving
    def _range_size(self) -> int:
        pending = self.book.pending
        threads = max(self.registry.total_nthreads, 1)
        size = self.book.unassigned() // (threads * RANGES_PER_THREAD)
        seconds = pending[0].mean_seconds() if pending else None
        if seconds is not None:
            size = max(size, int(RANGE_SECONDS / seconds) if seconds > 0 else MAX_RANGE)
        return max(1, min(MAX_RANGE, size))

    def fill_all(self) -> None:
        """Top up every running worker (a map arrived); while none of the first map's
        elements has finished, :data:`FIRST_WAVE_WORKERS` of them, the others are hungry
        and get theirs from the next events (:attr:`first_wave`)."""
        pending = self.book.pending
        if not pending:
            return
        wave = FIRST_WAVE_WORKERS if pending[0].mean_seconds() is None else 0
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
        return self.first_wave and bool(self.book.pending) and bool(self.hungry)

    def fill_hungry(self) -> None:
        """Top up the workers that found the queue empty, while it holds elements (some
        went back to it), those with a thread free first: a worker that had enough then
        has enough now, and is topped up when it reports. In a map's first wave (nothing
        of it measured yet), :data:`FIRST_WAVE_WORKERS` free ones at most."""
        outstanding, pending = self.outstanding, self.book.pending
        if self.first_wave:
            if pending and pending[0].mean_seconds() is None:
                wave = [
                    ws
                    for ws in self.hungry.values()
                    if outstanding.get(ws.address, 0) < ws.nthreads
                ][:FIRST_WAVE_WORKERS]
                for ws in wave:
                    if not pending:
                        break
                    self.fill(ws)
                if len(wave) < FIRST_WAVE_WORKERS:
                    self.first_wave = False
                return
            self.first_wave = False
        hungry = list(self.hungry.values())
        idle = [ws for ws in hungry if outstanding.get(ws.address, 0) < ws.nthreads]
        for ws in idle + hungry if len(idle) < len(hungry) else idle:
            if not pending:
                return
            self.fill(ws)

    def fill(self, ws: WorkerInfo) -> None:
        """Give ``ws`` ranges while it holds (:meth:`load`) less than two per thread of
        what is queued;
        none while it is kept free for a wide task, or the maps come after the wide task
        gathering its workers (it waits hungry, and a wide task waiting may take it)."""
        address, pending = ws.address, self.book.pending
        if ws.status != "running" or self.registry.workers.get(address) is not ws \
                or ws.resources_only:  # kept for tasks that ask for its resources
            self.hungry.pop(address, None)
            return
        if ws.reserved is not None or (pending and self.held_back(pending[0].priority)):
            self.hungry[address] = ws
            if self.outstanding.get(address, 0) < ws.nthreads:
                self.slots_freed(ws)
            return
        if ws.processing and any(ts.suspicious for ts in ws.processing):
            self.quarantined.add(address)
            self.hungry.pop(address, None)
            return
        if ws.end is not None and pending:  # it leaves before the head's elements end
            m = pending[0]
            seconds = m.duration if m.duration is not None else self.book.element_seconds(m)
            if not self.lifetime_allows(ws, seconds, m.group):
                self.hungry.pop(address, None)
                return
        have = self.outstanding.get(address, 0)
        tasks = self.promotions.in_range(address)  # held tasks count here, not in outstanding
        if tasks and have < ws.nthreads and pending \
                and have + tasks >= 2 * self._range_size() * ws.nthreads:
            # the count may hold tasks gone meanwhile (erred, released): count exactly
            # before a worker that may run dry is given nothing
            tasks = self.promotions.unstarted(ws)
        given = 0
        while pending:
            size = self._range_size()
            if have + tasks + given >= 2 * size * ws.nthreads:
                break
            n, sent = self._assign(ws, size)
            have += n
            given += sent - n
        self.outstanding[address] = have
        if pending:
            self.hungry.pop(address, None)
        else:
            self.hungry[address] = ws
        if have < ws.nthreads:
            self.slots_freed(ws)

    def _assign(self, ws: WorkerInfo, size: int) -> tuple[int, int]:
        """Give ``ws`` the next range of at most ``size`` queued elements; returns (elements
        it runs for the map, elements sent: those and the held tasks among them)."""
        self._epoch += 1
        m, start, stop = self.book.take(size)
        state = m.state
        slot = self.book.store.slot(ws)
        n = stop - start
        given = m.given.get(slot)
        if given is None:
            given = m.given[slot] = Given()
            self.book.store.given_maps.setdefault(slot, {})[m] = None
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
                self.promotions.run_held(ws, m, start, stop, indices)
            args = [m.args[i] for i in indices]
        if given.length > given.limit:
            given.compact(m.where, slot)
        if indices:
            self.out.send(ws.address, ComputeRange(m.prefix, m.function, indices, args))
        return n, len(indices)

    # ================================================================ taking back
    def release_all(self, ws: WorkerInfo) -> None:
        """``ws`` gives back every element it has not started (it paused, or retires), the
        tasks its ranges run among them (held, or promoted while given)."""
        have = self.outstanding.get(ws.address, 0) + self.promotions.unstarted(ws)
        if have:
            self._release(ws, have)

    def _release(self, ws: WorkerInfo, count: int) -> None:
        self.releasing[ws.address] = self.releasing.get(ws.address, 0) + 1
        self.out.send(ws.address, ReleaseRange(count))

    def steal(self) -> None:
        """Work stealing of ranges' tails: while no element is queued, each idle worker
        (a thread free, nothing queued for it) has one other worker give back half the
        elements it holds beyond its threads (its :meth:`load`: the tasks its ranges run
        count too), if they are worth
        :data:`STEAL_MIN_SECONDS` at that worker's recent speed (unknown: worth it);
        the elements go back to the queue (``range-released``), and from there to the
        idle workers. The victims give back only elements they have not started, so
        none runs twice or is lost; a round that finds no victim is not repeated until
        ranges are given or reported. Off with ``scheduler.work-stealing``."""
        if (
            not self.work_stealing
            or self.book.pending
            or not self.hungry
            or self._fruitless == self._epoch
        ):
            return
        load, workers = self.load, self.registry.workers
        thieves = [
            ws
            for ws in self.hungry.values()
            if ws.status == "running" and load(ws.address) < ws.nthreads
        ]
        if not thieves:
            return
        victims: list[tuple[int, WorkerInfo]] = []
        promotions = self.promotions
        for address in self.outstanding.keys() | promotions.in_ranges.keys():
            ws = workers.get(address)
            if ws is None or address in self.releasing:
                continue
            have = load(address)
            if have > ws.nthreads and promotions.in_range(address):
                # the count may hold tasks gone meanwhile (released, cancelled, erred):
                # a victim is asked only for what it may still hold, or a worker whose
                # map is gone is asked again at every round, and gives back nothing
                have = self.outstanding.get(address, 0) + promotions.unstarted(ws)
            if have <= ws.nthreads:
                continue
            count = (have - ws.nthreads + 1) // 2
            if count * self.element_time.get(address, STEAL_MIN_SECONDS) >= STEAL_MIN_SECONDS:
                victims.append((count, ws))
        if not victims:
            self._fruitless = self._epoch
            return
        victims.sort(key=lambda v: -v[0])
        for count, ws in victims[: len(thieves)]:
            self._release(ws, count)

    def set_aside(self, ws: WorkerInfo, retiring: bool = False) -> None:
        """``ws`` takes no elements for now and gives back those it has not started: it
        retires, or (``retiring`` false) a suspect task runs there."""
        (self.retiring if retiring else self.quarantined).add(ws.address)
        self.hungry.pop(ws.address, None)
        self.release_all(ws)

    def on_tick(self) -> None:
        """Retiring workers that left are forgotten; one whose retirement was given up
        (its results had nowhere to go) runs again, as do workers whose suspect tasks are
        done: they take elements, or are hungry. Then idle workers steal."""
        workers = self.registry.workers
        for address in list(self.retiring):
            ws = workers.get(address)
            if ws is None or ws.status != "closing_gracefully":
                self.retiring.discard(address)
                if ws is not None:
                    self.fill(ws)
        for address in list(self.quarantined):
            ws = workers.get(address)
            if ws is None:
                self.quarantined.discard(address)
            elif not any(ts.suspicious for ts in ws.processing):
                self.quarantined.discard(address)
                self.fill(ws)
        self.steal()

    def validate(self, per_slot: dict[int, int]) -> None:
        """Each worker's load is the elements it runs or must report (``per_slot``, by
        slot: :meth:`.book.MapBook.validate`)."""
        workers, slots = self.registry.workers, self.book.store.slots
        for addr, ws in self.hungry.items():
            assert workers.get(addr) is ws, addr
        for addr, n in self.releasing.items():
            assert n > 0 and addr in workers, addr
        for addr, n in self.outstanding.items():
            slot = slots.get(addr)
            assert n == (per_slot.get(slot, 0) if slot is not None else 0), (addr, n)
