"""Where a ready task goes: the worker decisions and the queue of root-ish tasks.

A component of :class:`~hpcsched.core.state.scheduler_state.SchedulerState`, handed the state
(as its event handlers are): :meth:`Placement.decide_worker` picks a worker for a task
that became ready (:mod:`hpcsched.core.state.policies`: queuing with ``worker-saturation``,
co-assignment, ``decide_worker``); root-ish tasks that find every worker full wait in
the state's queue, and :meth:`Placement.fill_slots`, after each event, gives them to the
workers whose slots opened, from the blocks of :mod:`hpcsched.core.state.blocks`.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from hpcsched.core.state import policies

if TYPE_CHECKING:
    from hpcsched.core.state.model import TaskState, WorkerInfo
    from hpcsched.core.state.scheduler_state import SchedulerState


class Placement:
    """Worker decisions and the queue, for the state ``s``."""

    def __init__(self, s: SchedulerState):
        self.s = s

    def is_rootish(self, ts: TaskState) -> bool:
        """Root-ish (:func:`~hpcsched.core.state.policies.is_rootish`): queued or co-assigned."""
        s = self.s
        return policies.is_rootish(ts, s.total_nthreads, s.rootish_factor,
                                   s.rootish_max_deps)

    def decide_worker(self, ts: TaskState) -> WorkerInfo | None:
        """The worker for ``ts``, ready now; None: it waits (queued, or no worker fits)."""
        s = self.s
        if not s.workers:
            return None
        valid = policies.valid_workers(ts, s.workers.values())
        if valid is not None and not valid and ts.loose_restrictions:
            valid = None
        if valid is None and self.is_rootish(ts):
            if s.rootish_policy == "queue":
                ws = self.pop_free_worker()
                if ws is not None and s.blocks.size_for(ts, s.total_nthreads) > 1:
                    # queued first: after this event fill_slots gives each free worker a block
                    s.blocks.fill_all = True
                    return None
                return ws
            if s.rootish_policy == "mars":
                addr = s.mars_assignment.get(ts.key)
                ws = s.workers.get(addr) if addr else None
                if ws is not None and ws.status == "running":
                    return ws
            return policies.co_assign_worker(ts, ts.group, s.running(), s.total_nthreads,
                                             self.least_busy())
        return policies.decide_worker(ts, s.running(), valid, s.bandwidth, s.rng)

    def least_busy(self) -> WorkerInfo | None:
        """The running worker with the fewest busy slots per thread (then bytes held)."""
        s = self.s
        running = s.running()
        if not running:
            return None
        if len(running) > policies.SAMPLE_LIMIT:
            running = s.rng.sample(running, policies.SAMPLE_LIMIT)
        return min(running, key=lambda ws: (policies.busy_slots(ws) / ws.nthreads, ws.nbytes))

    def push_free(self, ws: WorkerInfo) -> None:
        """``ws`` may have a free slot: a candidate for queued root-ish tasks (lazy heap)."""
        s = self.s
        if ws.status != "running" or policies.worker_full(ws, s.worker_saturation):
            return
        ws.heap_version += 1
        heapq.heappush(s.free_heap, (policies.busy_slots(ws) / ws.nthreads, next(s.seq),
                                     ws.heap_version, ws))

    def pop_free_worker(self) -> WorkerInfo | None:
        """The least-busy running worker that is not full, or None (lazy heap)."""
        s = self.s
        heap = s.free_heap
        while heap:
            _, _, version, ws = heap[0]
            if version != ws.heap_version or s.workers.get(ws.address) is not ws \
                    or ws.status != "running" \
                    or policies.worker_full(ws, s.worker_saturation):
                heapq.heappop(heap)
                continue
            return ws
        return None

    def open_slots(self, ws: WorkerInfo) -> None:
        """``ws`` can take work again: queued tasks flow to it after this event."""
        s = self.s
        s.slots_opened[ws] = None
        self.push_free(ws)

    def fill_slots(self) -> None:
        """Give queued root-ish tasks to workers whose slots opened, best priority first."""
        s = self.s
        if s.blocks.fill_all:
            s.blocks.fill_all = False
            for ws in s.running():
                if not policies.worker_full(ws, s.worker_saturation):
                    s.slots_opened[ws] = None
        if not s.slots_opened:
            return
        opened, s.slots_opened = s.slots_opened, {}
        if s.unrunnable:
            s.transitions([(ts, "waiting-ready") for ts in list(s.unrunnable)])
        if not s.n_queued:
            return
        for ws in opened:
            if ws.address not in s.workers or ws.status != "running":
                continue
            while s.n_queued and not policies.worker_full(ws, s.worker_saturation):
                head = self.queue_head()
                ts = s.blocks.take(ws, head)
                if ts is None:
                    if head is None:
                        break
                    ts = head
                    s.blocks.took_head(ws, ts, s.workers)
                s.add_to_processing(ts, ws)

    def enqueue(self, ts: TaskState) -> None:
        """``ts`` is ready and root-ish, and waits in the queue (and in a block)."""
        s = self.s
        s.transition(ts, "queued")
        ts.queued_seq = next(s.seq)
        heapq.heappush(s.queued, (ts.priority, ts.queued_seq, ts))
        s.n_queued += 1
        s.blocks.add(ts, s.total_nthreads)

    def queue_head(self) -> TaskState | None:
        """The best queued task (stale heap entries are dropped on the way)."""
        s = self.s
        queued = s.queued
        while queued:
            _, seq, ts = queued[0]
            if ts.state == "queued" and ts.queued_seq == seq and s.tasks.get(ts.key) is ts:
                return ts
            heapq.heappop(queued)
        return None
