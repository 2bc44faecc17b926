"""Where a ready task goes: the worker decisions, the queue of root-ish tasks, and the
tasks no worker can take yet.

Lifetimes. A worker may say when it will leave (``WorkerInfo.end``: its ``--lifetime``,
its job's walltime). A task expected to run longer than a worker has left (its
``duration`` as submitted, else its group's measured mean) is not started there while
another running worker stays long enough (HyperQueue's ``--time-request``): the decision
is made among those, the queue's head is not handed to it, and the bulk maps ask the same
(:meth:`Placement.lifetime_allows`). When no running worker stays long enough, the task
runs where it would have, and the placement says so once per task group (a warning in the
log, a ``walltime`` event for the dashboard): waiting for a worker that may never come
would stall the work. A worker that says nothing of its end stays, as far as placement
knows, for ever.

:class:`Placement` owns the queue (a heap by priority, lazily cleaned, and its blocks,
:mod:`hpcsched.core.state.blocks`), the heap of workers with free slots, the workers
whose slots opened during the event being handled, the workers with an idle thread
(the thieves of stealing), the ``no-worker`` tasks and the MARS assignment.
:meth:`Placement.decide_worker` picks a worker for a task that became ready
(:mod:`hpcsched.core.state.policies`: queuing with ``worker-saturation``,
co-assignment, ``decide_worker``); root-ish tasks that find every worker full wait in
the queue, and :meth:`Placement.fill_slots`, after each event, hands them to the
workers whose slots opened (beyond its slots, milliseconds of a group of short tasks:
:func:`~hpcsched.core.state.policies.queue_slots`). It reads the workers from the
:class:`~.registry.WorkerRegistry` and changes no task's state: the task graph
(:mod:`.tasks`) moves tasks and tells the placement (:meth:`enqueue`,
:meth:`leave_queue`, :meth:`add_unrunnable`, :meth:`leave_unrunnable`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import math
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from hpcsched.core.state import policies
from hpcsched.core.state.blocks import RootBlocks
from hpcsched.core.state.model import TaskState, WorkerInfo
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.settings import SchedulerSettings

Key = Any

logger = logging.getLogger("hpcsched.scheduler")


class Placement:
    """Worker decisions and the queue (see the module's docstring)."""

    def __init__(self, registry: WorkerRegistry, settings: SchedulerSettings):
        self.registry = registry
        self.worker_saturation = float(settings.worker_saturation)
        rootish_policy = settings.rootish_policy
        if math.isinf(self.worker_saturation) and rootish_policy == "queue":
            rootish_policy = "co-assign"  # no slots to queue for
        self.rootish_policy = rootish_policy
        self.rootish_factor = settings.rootish_factor
        self.rootish_max_deps = settings.rootish_max_deps
        self.rng = random.Random(settings.seed)
        self.queued: list[tuple[tuple, int, TaskState]] = []  # heap, lazily cleaned
        self.n_queued = 0
        self.blocks = RootBlocks(settings.queue_block_size, settings.queue_block_bytes)
        self.unrunnable: dict[TaskState, None] = {}  # the narrow no-worker tasks
        self.free_heap: list[tuple[float, int, int, WorkerInfo]] = []  # not-full workers
        self.slots_opened: dict[WorkerInfo, None] = {}
        # workers given more tasks than they have threads since the last tick: the only
        # possible victims of stealing (pruned by the tick)
        self.backlogged: set[WorkerInfo] = set()
        # running workers with a thread free, in the order they became so: the thieves of
        # stealing (checked again when read: a worker may have left or paused since)
        self.idle: dict[WorkerInfo, None] = {}
        self.mars_assignment: dict[Key, str] = {}
        self.seq = itertools.count()
        # wide tasks (a slot on each of ``width`` workers) waiting for their slots: each is
        # no-worker; the one of best priority keeps the workers that become free for itself.
        # A heap by priority for each shape, (width, ranks per node) (lazily cleaned: an
        # entry counts while its task maps to its sequence number here), so that finding
        # the best one costs the few shapes in use, not the number of wide tasks waiting
        self.gangs: dict[TaskState, int] = {}
        self.gang_heaps: dict[tuple[int, int], list[tuple[tuple, int, TaskState]]] = {}
        self.reserving: TaskState | None = None
        self.reserved: dict[WorkerInfo, None] = {}  # the workers kept free for it
        # narrow tasks of worse priority made ready while it gathers: they wait (no-worker)
        # until it runs or stops gathering, so that they never take the slots it waits for
        self.behind: dict[TaskState, None] = {}
        # a wide task started, stopped gathering or gave its slots back during this event:
        # work held back (bulk maps' elements) may go out again
        self.gang_moved = False
        # tasks held back behind a wide task became no-worker again during this event: the
        # no-worker tasks are tried after it, even if no slot opened (free ones may be)
        self.retry_unrunnable = False
        # elements of bulk maps a worker runs (set by the owner of the maps): such a
        # worker is not free for a wide task
        self.elements_on: Callable[[WorkerInfo], int] = lambda ws: 0
        # the time of the event being handled (set by the state: events carry it)
        self.now: Callable[[], float] = lambda: 0.0
        # what happened, for the dashboard (the state's recorder, if any)
        self.recorder: Callable[[], Any] = lambda: None
        # task groups told that no worker stays long enough for them, and when
        self.outlived: dict[str, float] = {}

    # ================================================================ lifetimes
    @staticmethod
    def expected_seconds(ts: TaskState) -> float | None:
        """How long ``ts`` is expected to run: as submitted (``duration=``), else its
        group's measured mean, else None (unknown)."""
        return ts.duration if ts.duration is not None else ts.group.average_duration

    def lifetime_allows(self, ws: WorkerInfo, seconds: float | None, group: str) -> bool:
        """Whether ``ws`` may start work of ``seconds`` (of TaskGroup ``group``): it stays
        long enough, or no running worker does (said once per group, see the module's
        documentation)."""
        if ws.end is None or seconds is None:
            return True
        now = self.now()
        if ws.end - now >= seconds:
            return True
        latest = self.registry.latest_end()
        if latest - now >= seconds:
            return False
        if group not in self.outlived:
            self.outlived[group] = now
            left = max(latest - now, 0.0)
            logger.warning("tasks of %s are expected to run %.0f s, and no worker stays that "
                           "long (the longest has %.0f s left): they start anyway, and may "
                           "be cut off with their worker", group, seconds, left)
            recorder = self.recorder()
            if recorder is not None:
                recorder.event("walltime", {"group": group, "expected": seconds,
                                            "longest-left": left}, now)
        return True

    def _outliving(self, ts: TaskState, ws: WorkerInfo) -> WorkerInfo | None:
        """``ws`` was chosen for ``ts``: it, if it stays long enough for ``ts`` (or none
        does), else the decision among the running workers that do (None: none of them
        may run ``ts``: ``ws`` then, said as when none stays)."""
        seconds = self.expected_seconds(ts)
        if self.lifetime_allows(ws, seconds, ts.group.name):
            return ws
        assert seconds is not None
        now = self.now()
        order, keys = self.registry.by_end()
        k = bisect.bisect_right(keys, -(now + seconds))  # order[:k] stay long enough

        def stays(w: WorkerInfo) -> bool:
            return w.end is None or w.end - now >= seconds

        valid = policies.valid_workers(ts, order[:k]) if ts.worker_restrictions \
            or ts.resource_restrictions else None
        if valid is not None and not valid:
            if not ts.loose_restrictions:
                return ws  # none of those it may run on stays long enough
            valid = None
        if valid is None:
            # a holder of its inputs that stays, else a bounded sample of those that stay:
            # a decision costs the same on any number of workers
            valid = list({h for dts in ts.dependencies for h in dts.who_has
                          if h.status == "running" and h.reserved is None
                          and not h.resources_only and stays(h)})
            if not valid:
                sample = order[:k] if k <= policies.SAMPLE_LIMIT else \
                    [order[i] for i in self.rng.sample(range(k), policies.SAMPLE_LIMIT)]
                valid = [w for w in sample if not w.resources_only]
        choice = policies.decide_worker(ts, valid, valid, self.registry.bandwidth, self.rng)
        return ws if choice is None else choice

    # ================================================================ decisions
    def is_rootish(self, ts: TaskState) -> bool:
        """Root-ish (:func:`~hpcsched.core.state.policies.is_rootish`): queued or co-assigned."""
        return policies.is_rootish(ts, self.registry.total_nthreads, self.rootish_factor,
                                   self.rootish_max_deps)

    def decide_worker(self, ts: TaskState) -> WorkerInfo | None:
        """The worker for ``ts``, ready now; None: it waits (queued, or no worker fits).
        Not one that leaves before ``ts`` would end while another stays long enough."""
        ws = self._decide_worker(ts)
        if ws is None or ws.end is None:
            return ws
        if not ts.worker_restrictions and not ts.resource_restrictions \
                and self.rootish_policy == "queue" and self.is_rootish(ts):
            # from the heap of free workers: one too short-lived for the task leaves the
            # heap until its tasks change, and the next free one is asked
            seconds = self.expected_seconds(ts)
            while ws is not None and not self.lifetime_allows(ws, seconds, ts.group.name):
                self._drop_free(ws)
                ws = self.pop_free_worker()
            return ws
        return self._outliving(ts, ws)

    def _decide_worker(self, ts: TaskState) -> WorkerInfo | None:
        registry = self.registry
        if not registry.workers:
            return None
        valid = policies.valid_workers(ts, registry.workers.values())
        if valid is not None and not valid and ts.loose_restrictions:
            valid = None
        if valid is None and self.is_rootish(ts):
            if self.rootish_policy == "queue":
                ws = self.pop_free_worker()
                if ws is not None and self.blocks.size_for(ts, registry.total_nthreads) > 1:
                    # queued first: after this event fill_slots gives each free worker a block
                    self.blocks.fill_all = True
                    return None
                return ws
            if self.rootish_policy == "mars":
                addr = self.mars_assignment.get(ts.key)
                ws = registry.workers.get(addr) if addr else None
                if ws is not None and ws.status == "running" and ws.reserved is None:
                    return ws
            return policies.co_assign_worker(ts, ts.group, registry.running(),
                                             registry.total_nthreads, self.least_busy())
        return policies.decide_worker(ts, registry.running(), valid, registry.bandwidth,
                                      self.rng)

    def decide_gang(self, ts: TaskState) -> list[WorkerInfo] | None:
        """The workers for wide task ``ts``, one slot on each of ``ts.width`` distinct ones,
        the first of which runs it; None: it waits (no-worker).

        Only the waiting wide task of best priority gathers workers, once it is next in
        priority (no queued task comes before it): it keeps each worker with a free slot
        for itself (:attr:`reserved`: no new work starts there) until it has enough, and
        narrow tasks of worse priority made ready meanwhile wait (:attr:`behind`), so that
        a stream of them never starves it; two wide tasks never each hold part of what
        they need (a better one arriving takes over what was kept). A wide task wider
        than the running workers keeps none: it waits for the cluster to grow. Of more
        free workers than it needs, it takes those on the fewest hosts. The cost is in
        the free workers looked at, the idle ones, not in the size of the cluster, nor in
        the number of wide tasks waiting."""
        if ts not in self.gangs:
            seq = self.gangs[ts] = next(self.seq)
            heapq.heappush(self.gang_heaps.setdefault((ts.width, ts.per_node), []),
                           (ts.priority, seq, ts))
        registry = self.registry
        capacity = self._gang_capacity()
        if not self._may_gather(ts, capacity):
            # it waits for the cluster to grow (to more hosts, if spread), keeping nothing
            if self.reserving is ts:
                self._unreserve_all()
            return None
        # the best of those the cluster can hold (a wider one must not block them)
        head = self._best_gang(capacity)
        queued = self.queue_head()
        if head is not ts or (queued is not None and queued.priority < ts.priority):
            if self.reserving is ts:
                self._unreserve_all()
            return None
        if self.reserving is not ts:
            self._unreserve_all()
            self.reserving = ts
        for ws in list(self.idle):
            if ws not in self.reserved and self._free_for_gang(ws):
                self.reserved[ws] = None
                registry.reserve(ws, ts)
        for ws in [ws for ws in self.reserved if not self._free_for_gang(ws)]:
            del self.reserved[ws]  # it left, paused, or retires
            if registry.workers.get(ws.address) is ws:
                registry.reserve(ws, None)
        if len(self.reserved) < ts.width:
            return None
        members = _packed(list(self.reserved), ts.width, ts.per_node)
        if members is None:  # enough workers kept, on too few hosts (ranks_per_node)
            return None
        self._unreserve_all()
        del self.gangs[ts]
        return members

    def _may_gather(self, ts: TaskState, capacity: int) -> bool:
        """Whether the workers running and kept (``capacity`` of them) could hold wide task
        ``ts``: enough of them, and, spread (``ranks_per_node``), on enough hosts."""
        return ts.width <= capacity and not (ts.per_node and _packed(
            [*self.registry.running(), *self.reserved], ts.width, ts.per_node) is None)

    def _gang_capacity(self) -> int:
        """How many workers a wide task could gather now: the running ones and those kept,
        of one batch job when they come from several."""
        n = len(self.registry.running()) + len(self.reserved)
        widest = self.registry.widest_job()
        return n if widest is None else min(n, widest)

    def _best_gang(self, capacity: int) -> TaskState | None:
        """The waiting wide task of best priority among those the cluster can hold: at
        most ``capacity`` wide, and, spread (``ranks_per_node``), over its hosts."""
        best: tuple | None = None
        gangs = self.gangs
        for (width, per_node), heap in self.gang_heaps.items():
            if width > capacity:
                continue
            while heap and gangs.get(heap[0][2]) != heap[0][1]:
                heapq.heappop(heap)  # started, gone, or waiting under a newer entry
            if heap and per_node and _packed([*self.registry.running(), *self.reserved],
                                             width, per_node) is None:
                continue  # too few hosts for this shape: it must not block the others
            if heap and (best is None or heap[0] < best):
                best = heap[0]
        return None if best is None else best[2]

    def next_gang(self) -> TaskState | None:
        """The waiting wide task that may gather workers now (the best the cluster can
        hold; :meth:`decide_gang` says whether it may yet), or None. The others wait
        behind it, so trying them when slots open would find nothing."""
        return self._best_gang(self._gang_capacity()) if self.gangs else None

    def _free_for_gang(self, ws: WorkerInfo) -> bool:
        """``ws`` has a slot free (tasks and elements of bulk maps counted), and is not a
        worker kept for tasks asking for its resources while the gang asks for none."""
        gang = self.reserving
        return self.registry.workers.get(ws.address) is ws and ws.status == "running" \
            and policies.busy_slots(ws) + self.elements_on(ws) < ws.nthreads \
            and ws.reserved in (None, gang) \
            and not (ws.resources_only and (gang is None or not gang.resource_restrictions))

    def holds_back(self, priority: tuple) -> bool:
        """Whether narrow work of ``priority`` (a task, a bulk map's elements), ready,
        waits behind the gathering wide task (it comes after it: :meth:`decide_gang`)."""
        gang = self.reserving
        return gang is not None and priority > gang.priority

    def worker_freed(self, ws: WorkerInfo) -> None:
        """``ws``'s threads are free of other work (elements of bulk maps): a wide task
        waiting, or a no-worker task (one held back behind a wide task that stopped
        gathering), may take it once this event is handled."""
        if self.gangs or self.unrunnable:
            self.open_slots(ws)

    def hold_back(self, ts: TaskState) -> None:
        """``ts`` (just moved to no-worker) waits until the wide task ahead of it runs."""
        self.behind[ts] = None

    def _unreserve_all(self) -> None:
        """The workers kept for the gathering wide task take any work again, and the tasks
        held back behind it are ready again (no-worker: placed when slots open)."""
        workers = self.registry.workers
        for ws in self.reserved:
            if workers.get(ws.address) is ws:
                self.registry.reserve(ws, None)
                self.open_slots(ws)
        self.reserved.clear()
        self.reserving = None
        self.gang_moved = True
        if self.behind:
            self.unrunnable.update(self.behind)
            self.behind.clear()
            self.retry_unrunnable = True

    def should_queue(self, ts: TaskState) -> bool:
        """``ts`` found no worker: it waits in the queue (else it is no-worker)."""
        return self.rootish_policy == "queue" and bool(self.registry.workers) \
            and self.is_rootish(ts) and bool(self.registry.running())

    def least_busy(self) -> WorkerInfo | None:
        """The running worker with the fewest busy slots per thread (then bytes held)."""
        running = self.registry.running()
        if not running:
            return None
        if len(running) > policies.SAMPLE_LIMIT:
            running = self.rng.sample(running, policies.SAMPLE_LIMIT)
        return min(running, key=lambda ws: (policies.busy_slots(ws) / ws.nthreads, ws.nbytes))

    def plan_mars(self, deps: Mapping[Key, Collection[Key]], running: list[str]) -> None:
        """Assign the new tasks ``deps`` to the running workers (MARS, :mod:`.mars`)."""
        from hpcsched.core.graph.mars import assign_initial

        self.mars_assignment.update(assign_initial(deps, running))

    def forget(self, key: Key) -> None:
        """The task ``key`` is gone."""
        self.mars_assignment.pop(key, None)

    # ================================================================ free slots
    def push_free(self, ws: WorkerInfo) -> None:
        """``ws`` may have a free slot: a candidate for queued root-ish tasks (lazy heap).
        Called whenever its tasks change (and as it joins or resumes): it notes whether
        ``ws`` has an idle thread too."""
        if ws.status != "running":
            self.idle.pop(ws, None)
            return
        # busy_slots and worker_full written out: this runs twice per task
        busy = len(ws.processing) - len(ws.long_running)
        if busy < ws.nthreads:
            self.idle[ws] = None
        elif ws in self.idle:
            del self.idle[ws]
        saturation = self.worker_saturation
        if saturation != math.inf:
            slots = math.ceil(saturation * ws.nthreads)
            if busy >= (slots if slots > 1 else 1):
                return
        ws.heap_version += 1
        heap = self.free_heap
        if len(heap) > 2 * len(self.registry.workers) + 64:
            # each push outdates the worker's previous entry: drop the outdated ones now
            # and then, or they pile up, one per task, where no pop reaches them
            workers = self.registry.workers
            heap[:] = [e for e in heap if e[2] == e[3].heap_version
                       and workers.get(e[3].address) is e[3]]
            heapq.heapify(heap)
        heapq.heappush(heap, (busy / ws.nthreads, next(self.seq),
                              ws.heap_version, ws))

    def _drop_free(self, ws: WorkerInfo) -> None:
        """Take ``ws`` off the heap of free workers (it is at its head) until its tasks change."""
        heap = self.free_heap
        if heap and heap[0][3] is ws:
            heapq.heappop(heap)

    def pop_free_worker(self) -> WorkerInfo | None:
        """The least-busy running worker that is not full, or None (lazy heap)."""
        heap = self.free_heap
        workers = self.registry.workers
        while heap:
            _, _, version, ws = heap[0]
            if version != ws.heap_version or workers.get(ws.address) is not ws \
                    or ws.status != "running" or ws.reserved is not None \
                    or ws.resources_only or policies.worker_full(ws, self.worker_saturation):
                heapq.heappop(heap)
                continue
            return ws
        return None

    def idle_workers(self, limit: int) -> list[WorkerInfo]:
        """Up to ``limit`` running workers with an idle thread, longest idle first (those
        that left, paused or got busy since are dropped on the way)."""
        out: list[WorkerInfo] = []
        stale: list[WorkerInfo] = []
        workers = self.registry.workers
        for ws in self.idle:
            if workers.get(ws.address) is not ws or ws.status != "running" \
                    or policies.busy_slots(ws) >= ws.nthreads:
                stale.append(ws)
                continue
            if ws.reserved is not None or ws.resources_only:
                continue  # kept free for a wide task, or for its resources: it steals nothing
            out.append(ws)
            if len(out) >= limit:
                break
        for ws in stale:
            del self.idle[ws]
        return out

    def worker_left(self, ws: WorkerInfo) -> None:
        """``ws`` left the cluster: it is no thief, and no victim (workers come and go all
        day: the idle and the backlogged must not keep them, nor what they point to; the
        backlogged are pruned only by a round of stealing, which may never come)."""
        self.idle.pop(ws, None)
        self.backlogged.discard(ws)
        self.reserved.pop(ws, None)
        gang = self.reserving
        if gang is not None and not self._may_gather(gang, self._gang_capacity()):
            # too few are left for the wide task gathering: it waits for the cluster to
            # grow, and the workers it kept take other work meanwhile
            self._unreserve_all()

    def open_slots(self, ws: WorkerInfo, push: bool = True) -> None:
        """``ws`` can take work again: queued tasks flow to it after this event (``push``:
        and it is a candidate for the queued tasks made ready during this event)."""
        self.slots_opened[ws] = None
        if push:
            self.push_free(ws)

    def take_opened(self) -> dict[WorkerInfo, None]:
        """The workers whose slots opened during this event (and forget them)."""
        opened = self.slots_opened
        if opened:
            self.slots_opened = {}
        self.retry_unrunnable = False
        return opened

    def fill_slots(self, opened: Iterable[WorkerInfo],
                   assign: Callable[[TaskState, WorkerInfo], None]) -> None:
        """Give queued root-ish tasks to the ``opened`` workers, best priority first:
        ``assign(ts, ws)`` puts each on its worker (and takes it out of the queue). When
        tasks were queued while workers had free slots (``blocks.fill_all``), every free
        worker then gets its share, least busy first: they come off the heap of not-full
        workers, so the cost is in the tasks handed out, not in the size of the cluster.
        While none of the queue head's group has finished, one call fills at most
        :data:`~.policies.FIRST_WAVE_WORKERS` of them and leaves ``blocks.fill_all`` set:
        the next event fills the next ones (the server sends ``FillQueue`` once these
        tasks are out)."""
        workers = self.registry.workers
        for ws in opened:
            if not self.n_queued:
                break
            if ws.address in workers and ws.status == "running" and ws.reserved is None:
                self._fill(ws, assign)
        if self.blocks.fill_all:
            self.blocks.fill_all = False
            filled = 0
            while self.n_queued:
                if filled >= policies.FIRST_WAVE_WORKERS:
                    head = self.queue_head()
                    if head is not None and not head.group.n_durations:
                        # nothing of the group has finished: whether its tasks take
                        # microseconds or minutes is unknown. The next free workers get
                        # theirs in the server's next iteration (FillQueue), by when the
                        # first results may say they are short: then a few workers take
                        # runs of them (queue_slots), rather than every worker two, and
                        # the tasks that combine their results find them in place
                        self.blocks.fill_all = True
                        break
                free = self.pop_free_worker()
                if free is None:
                    break
                head = self.queue_head()
                if free.end is not None and head is not None and not self.lifetime_allows(
                        free, self.expected_seconds(head), head.group.name):
                    self._drop_free(free)  # it leaves too soon for the queue's head
                    continue
                self._fill(free, assign)
                filled += 1
                if not policies.worker_full(free, self.worker_saturation):
                    break  # the queue has nothing more for anyone

    def _fill(self, ws: WorkerInfo, assign: Callable[[TaskState, WorkerInfo], None]) -> None:
        """Queued tasks to ``ws`` (its block's first) until it is full or the queue empty;
        full is more than its slots for a group of short tasks (:func:`~.policies.queue_slots`)."""
        workers = self.registry.workers
        while self.n_queued:
            head = self.queue_head()
            if self.reserving is not None and head is not None \
                    and self.holds_back(head.priority):
                break  # it waits behind a wide task gathering its workers
            if ws.end is not None and head is not None and not self.lifetime_allows(
                    ws, self.expected_seconds(head), head.group.name):
                break  # it leaves before the head would end, and another worker stays
            if policies.worker_full(ws, self.worker_saturation) and (
                    head is None or policies.busy_slots(ws) >= policies.queue_slots(
                        ws, self.worker_saturation, head.group, self.blocks.max_bytes)):
                break
            ts = self.blocks.take(ws, head)
            if ts is None:
                if head is None:
                    break
                ts = head
                self.blocks.took_head(ws, ts, workers)
            assign(ts, ws)

    # ================================================================ the queue
    def enqueue(self, ts: TaskState) -> None:
        """``ts`` (just moved to queued) waits in the queue, and in a block."""
        ts.queued_seq = next(self.seq)
        heapq.heappush(self.queued, (ts.priority, ts.queued_seq, ts))
        self.n_queued += 1
        self.blocks.add(ts, self.registry.total_nthreads)

    def leave_queue(self, ts: TaskState) -> None:
        """``ts`` left queued (its heap entry is dropped lazily)."""
        self.n_queued -= 1
        ts.block = None
        if not self.n_queued:
            self.blocks.clear()

    def queue_head(self) -> TaskState | None:
        """The best queued task (stale heap entries are dropped on the way: a task that
        left queued, or was queued again since, under a newer sequence number)."""
        queued = self.queued
        while queued:
            _, seq, ts = queued[0]
            if ts.state == "queued" and ts.queued_seq == seq:
                return ts
            heapq.heappop(queued)
        return None

    # ================================================================ no-worker
    def add_unrunnable(self, ts: TaskState) -> None:
        """``ts`` (just moved to no-worker) waits for a worker that can run it (a wide
        task waits among :attr:`gangs`, where :meth:`decide_gang` put it)."""
        if ts.width == 1:
            self.unrunnable[ts] = None

    def leave_unrunnable(self, ts: TaskState) -> None:
        """``ts`` left no-worker (a wide task: it keeps no workers any more)."""
        self.unrunnable.pop(ts, None)
        self.behind.pop(ts, None)
        if ts.width > 1:
            self.gangs.pop(ts, None)
            if self.reserving is ts:
                self._unreserve_all()

    # ================================================================ invariants
    def validate(self, tasks: Mapping[Key, TaskState]) -> None:
        """The queue and the no-worker set agree with the states of ``tasks``."""
        n_queued = 0
        for ts in tasks.values():
            st = ts.state
            if st == "queued":
                n_queued += 1
                assert ts.block is None or ts in ts.block.tasks, ts
            else:
                assert ts.block is None, ("in a block of the queue, not queued", ts)
            if st == "no-worker":
                assert (ts in self.unrunnable) + (ts in self.behind) + (ts in self.gangs) \
                    == 1, ts
            else:
                assert ts not in self.unrunnable and ts not in self.behind, ts
                assert ts not in self.gangs, ts
        assert n_queued == self.n_queued, (n_queued, self.n_queued)
        if not n_queued:
            assert not self.blocks.free and not self.blocks.owned, "blocks of an empty queue"
        for blk in self.blocks.owned:
            assert blk.owner is not None and blk.owner.root_block is blk, blk
        for ws in self.registry.running():
            if policies.busy_slots(ws) < ws.nthreads:
                assert ws in self.idle, ("idle, not among the thieves", ws)
        for ws in self.idle:
            assert self.registry.is_current(ws), ("a worker that left is a thief", ws)
        # one wide task at most keeps workers, the best waiting one, and only free ones
        for ts, seq in self.gangs.items():
            assert ts.state == "no-worker" and ts.width > 1 and ts not in self.unrunnable, ts
            assert (ts.priority, seq, ts) in self.gang_heaps[ts.width, ts.per_node], ts
        assert self.reserving is None or self.reserving in self.gangs, self.reserving
        for ws in self.registry.workers.values():
            assert ws.reserved is None or (ws.reserved is self.reserving
                                           and ws in self.reserved), (ws, ws.reserved)
        for ws in self.reserved:
            assert self.registry.is_current(ws) and ws.reserved is self.reserving, ws
        assert not self.behind or self.reserving is not None, "held back behind nothing"
        for ts in self.behind:
            assert ts.width == 1 and ts.priority > self.reserving.priority, ts  # type: ignore[union-attr]
        for ws in self.backlogged:
            assert self.registry.is_current(ws), ("a worker that left is a victim", ws)


def _packed(workers: list[WorkerInfo], n: int, per_node: int = 0) -> list[WorkerInfo] | None:
    """``n`` of ``workers``, all of one batch job (its launcher reaches only its own
    nodes: the job with the most of them that can hold them), on as few hosts as they can
    be: hosts with the most of them first (a gang's ranks then talk through shared memory
    where they can); ``per_node``: at most that many on one host (None: too few hosts, or
    jobs too small, for it). Members of one host come together, in the order of the hosts
    taken.

    >>> class W:
    ...     def __init__(self, a, h, job=None): self.address, self.host, self.job = a, h, job
    >>> ws = [W("a", "x"), W("b", "y"), W("c", "y"), W("d", "z")]
    >>> [w.address for w in _packed(ws, 2)]
    ['b', 'c']
    >>> [w.address for w in _packed(ws, 3, per_node=1)]
    ['b', 'a', 'd']
    >>> _packed(ws, 4, per_node=1) is None
    True
    >>> jobs = [W("a", "x", "7"), W("b", "y", "8"), W("c", "y", "8"), W("d", "z", "7")]
    >>> [w.address for w in _packed(jobs, 2, per_node=1)], _packed(jobs, 3) is None
    (['a', 'd'], True)
    """
    by_job: dict[str | None, list[WorkerInfo]] = {}
    for ws in workers:
        by_job.setdefault(ws.job, []).append(ws)
    if len(by_job) > 1:
        for group in sorted(by_job.values(), key=lambda g: (-len(g), g[0].address)):
            members = _packed(group, n, per_node) if len(group) >= n else None
            if members is not None:
                return members
        return None
    by_host: dict[str, list[WorkerInfo]] = {}
    for ws in workers:
        by_host.setdefault(ws.host, []).append(ws)
    ordered = sorted(by_host.values(), key=lambda group: (-len(group), group[0].address))
    if per_node:
        ordered = [group[:per_node] for group in ordered]
    members = [ws for group in ordered for ws in group][:n]
    return members if len(members) == n else None
