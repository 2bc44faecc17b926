"""Blocks of queued root-ish tasks: a worker takes its queued tasks from one run of
consecutive ones while that run lasts.

Queuing (``scheduler.worker-saturation``, as in dask) gives each freed slot the
best-priority queued task. With several workers, consecutive root tasks in priority
order -- siblings that one downstream task combines, such as the two leaves under a node
of a tree reduction -- then alternate between the workers, and nearly every combining
task waits for a transfer. dask's documentation names this the first downside of
queuing: "initial tasks are not co-assigned", so "workers may have to make data
transfers which could have been avoided"
(https://distributed.dask.org/en/stable/scheduling-policies.html#queuing).

Here the queue is also cut into blocks of consecutive tasks, in the order they are
queued (priority order: a graph's ready tasks are queued sorted). A worker claims the
best unclaimed block and takes its tasks in order, one per free slot as without blocks, so the
saturation bound on what a worker holds is unchanged; only which queued task fills a
slot changes. A worker whose block is used up claims the next. When every block is
claimed, a worker takes the best queued task, wherever it is (and that task's block,
when its owner cannot run it: it left, paused or is retiring). A block gives way to
queued work of an earlier submission or of a higher user priority, and to better work
that no block claimed (a root-ish dependent queued after its roots: ongoing work
finishes before new work starts, as with dask's queuing).

A block holds ``min(scheduler.queue-block-size, tasks in the group / threads)`` tasks,
so that every worker can have a block of its own; a size of 1 is dask's queuing. Blocks
trade memory for transfers: each worker's block is a front of its own, whose partial
results wait for the neighbouring blocks, so larger blocks hold more at once. The
default keeps the two sibling levels of a binary reduction together, which cuts
the transfers of a tree reduction by much; larger blocks cut them further.

That memory is only worth spending on small results, whose transfers cost a message's
latency each and whose extra copies cost nothing. With results of a megabyte, blocks
raise the memory peaks of ``benchmarks/bench_memory.py``, the more the larger the
block. So a block also holds no more tasks than
``scheduler.queue-block-bytes`` of results, at its group's mean result size so far: a
group whose results are larger than half of it is queued as in dask. Blocks are cut
before any result of a group is known (its roots are queued as its graph arrives), but
a worker claims one only once the group's first result is known to be small, and stops
taking from it if the mean grows too large; until then the queue is dask's.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcsched.core.state.model import TaskState, WorkerInfo


def _before(a: TaskState, b: TaskState) -> bool:
    """``a`` comes from an earlier submission than ``b``, or has a higher user priority
    (the first two parts of a priority, (generation, -user priority, static))."""
    pa, pb = a.priority, b.priority
    return pa[0] < pb[0] or (pa[0] == pb[0] and pa[1] < pb[1])


def _goes_first(head: TaskState, ts: TaskState) -> bool:
    """The queue's best task ``head`` goes before the block's ``ts``: it is of an earlier
    submission or a higher user priority, or it is better and no worker's block has it."""
    if _before(head, ts):
        return True
    blk = head.block
    return (blk is None or blk.owner is None) and head.priority < ts.priority


class RootBlock:
    """Consecutive queued tasks, taken in order by the worker that claimed them."""

    __slots__ = ("tasks", "pos", "owner", "size")

    def __init__(self, size: int):
        self.tasks: list[TaskState] = []
        self.pos = 0
        self.owner: WorkerInfo | None = None
        self.size = size

    def next_queued(self) -> TaskState | None:
        """The first of its tasks still queued in this block, or None."""
        tasks = self.tasks
        while self.pos < len(tasks):
            ts = tasks[self.pos]
            if ts.block is self:  # still queued here (leaving "queued" clears it)
                return ts
            self.pos += 1
        if len(tasks) >= self.size:  # full and used up: hold no tasks alive
            tasks.clear()
            self.pos = 0
        return None

    def __repr__(self) -> str:
        return f"<RootBlock {self.pos}/{len(self.tasks)} owner={self.owner!r}>"


class RootBlocks:
    """The blocks of the queue (see the module's docstring). ``limit`` <= 1 turns them off."""

    def __init__(self, limit: int, max_bytes: int = 2**20):
        self.limit = int(limit)
        self.max_bytes = int(max_bytes)
        self.free: list[tuple[Any, int, RootBlock]] = []  # heap: (first priority, seq, block)
        self.filling: RootBlock | None = None
        self.owned: set[RootBlock] = set()  # claimed by a worker
        # tasks were queued while workers had free slots: fill every worker's after the event
        self.fill_all = False
        self.seq = itertools.count()

    def size_for(self, ts: TaskState, total_nthreads: int) -> int:
        """How many tasks the block ``ts`` starts may hold (1: no blocks for it)."""
        if self.limit <= 1:
            return 1
        size = min(self.limit, ts.group.n_tasks // max(total_nthreads, 1))
        avg = ts.group.average_nbytes
        if avg:
            size = min(size, int(self.max_bytes // avg))
        return size

    def _small(self, ts: TaskState) -> bool:
        """``ts``'s group has results known, and small enough for blocks."""
        avg = ts.group.average_nbytes
        return avg is not None and 2 * avg <= self.max_bytes

    def add(self, ts: TaskState, total_nthreads: int) -> None:
        """``ts`` was just queued: it joins the block being filled (or starts one)."""
        blk = self.filling
        if blk is None or len(blk.tasks) >= blk.size:
            size = self.size_for(ts, total_nthreads)
            if size <= 1:
                self.filling = None
                return
            blk = self.filling = RootBlock(size)
            heapq.heappush(self.free, (ts.priority, next(self.seq), blk))
        blk.tasks.append(ts)
        ts.block = blk

    def take(self, ws: WorkerInfo, head: TaskState | None) -> TaskState | None:
        """The queued task ``ws`` should run next from the blocks, or None when it should
        take the queue's best task (``head``) instead."""
        blk = ws.root_block
        if blk is not None:
            if blk.owner is ws:
                ts = blk.next_queued()
                if ts is not None:
                    if self._small(ts) and (head is None or not _goes_first(head, ts)):
                        return ts
                    # queued work of an earlier submission or a higher user priority
                    # (dask's ``priority=``), or better work no worker has claimed (a
                    # dependent that is root-ish too), or results found too large for
                    # blocks: let the block go
                    heapq.heappush(self.free, (ts.priority, next(self.seq), blk))
                blk.owner = None
                self.owned.discard(blk)
            ws.root_block = None
        free = self.free
        while free:
            blk = free[0][2]
            ts = blk.next_queued() if blk.owner is None else None
            if ts is None:
                heapq.heappop(free)  # used up, or claimed since it was pushed
                continue
            if not self._small(ts) or (head is not None and _goes_first(head, ts)):
                return None
            heapq.heappop(free)
            self._claim(ws, blk)
            return ts
        return None

    def _claim(self, ws: WorkerInfo, blk: RootBlock) -> None:
        old = blk.owner
        if old is not None and old.root_block is blk:
            old.root_block = None
        blk.owner = ws
        ws.root_block = blk
        self.owned.add(blk)

    def took_head(self, ws: WorkerInfo, ts: TaskState, workers: dict) -> None:
        """``ws`` takes the queue's best task ``ts`` (before it leaves the queue), and its
        block too when the block's owner cannot run it: gone, paused or retiring."""
        blk = ts.block
        if blk is None or ws.root_block is not None or not self._small(ts):
            return
        owner = blk.owner
        if owner is None or owner.status != "running" or workers.get(owner.address) is not owner:
            self._claim(ws, blk)

    def clear(self) -> None:
        """Nothing is queued any more: forget every block and the tasks they held."""
        self.free.clear()
        self.filling = None
        for blk in self.owned:
            blk.tasks.clear()
            blk.pos = 0
            blk.owner = None  # its worker drops it at its next take()
        self.owned.clear()
