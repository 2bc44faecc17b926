"""The workers the scheduler knows, their thread total and the measured bandwidth.

:class:`WorkerRegistry` owns the ``{address: WorkerInfo}`` table: a worker joins
and leaves, changes status (running, paused, closing_gracefully) and is looked
up here, so that the thread total and the list of running workers (rebuilt only
when a worker joins, leaves or changes status) stay right. It sends nothing and
decides nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from hpcsched.core.state.model import WorkerInfo


class WorkerRegistry:
    """The scheduler's workers by address (see the module's docstring)."""

    __slots__ = ("workers", "total_nthreads", "bandwidth", "removed_by", "_running", "_names",
                 "_by_last_seen", "_by_end", "_widest_job")

    def __init__(self, bandwidth: float):
        self.workers: dict[str, WorkerInfo] = {}
        self.total_nthreads = 0
        #: measured peer-to-peer transfer speed (bytes/s), a moving average over heartbeats
        self.bandwidth = bandwidth
        # address -> stimulus id of the event that removed the worker, for the server's
        # remove_worker hooks (it pops each entry; bounded for a state run without a server)
        self.removed_by: dict[str, str] = {}
        self._running: list[WorkerInfo] | None = None
        # the running workers, latest end first, and their ends negated (for bisect)
        self._by_end: tuple[list[WorkerInfo], list[float]] | None = None
        self._widest_job: tuple[int | None] | None = None  # cached with running()
        self._names: dict[Any, WorkerInfo] = {}  # name -> worker (the last one to take it)
        # the workers, least recently heard from first: the TTL check reads only the
        # silent ones, a heartbeat moves one to the end (both constant time). The order is
        # that of arrival: should the clock step back, a silent worker may wait behind one
        # heard from "later" until that one's next heartbeat
        self._by_last_seen: dict[str, WorkerInfo] = {}

    def add(self, ws: WorkerInfo) -> None:
        """``ws`` joined."""
        self.workers[ws.address] = ws
        self._names[ws.name] = ws
        self._by_last_seen[ws.address] = ws
        self.total_nthreads += ws.nthreads
        self._running = None

    def remove(self, ws: WorkerInfo, stimulus_id: str) -> None:
        """``ws`` left (``stimulus_id``: the event that removed it); it is marked closed, so
        that objects still pointing to it (a TaskGroup's last worker) skip it."""
        del self.workers[ws.address]
        del self._by_last_seen[ws.address]
        if self._names.get(ws.name) is ws:
            del self._names[ws.name]
        self.total_nthreads -= ws.nthreads
        self.removed_by[ws.address] = stimulus_id
        if len(self.removed_by) > 1000:
            del self.removed_by[next(iter(self.removed_by))]
        ws.status = "closed"
        self._running = None

    def set_status(self, ws: WorkerInfo, status: str) -> None:
        """``ws`` is running, paused or closing_gracefully from now on."""
        ws.status = status
        self._running = None

    def block_slot(self, ws: WorkerInfo, key: Any) -> None:
        """A thread of ``ws`` is lost to its part of the failed gang ``key``, which may wait
        forever in a collective: ``ws`` offers one thread fewer (its last: it is
        ``blocked``, given no work, whatever its memory monitor says)."""
        if key not in ws.blocked:
            full = ws.nthreads + sum(ws.blocked.values())
            ws.blocked[key] = False
            self._count_blocked(ws, full)

    def unblock_slot(self, ws: WorkerInfo, key: Any) -> bool:
        """``ws``'s part of the failed gang ``key`` ended after all: its thread is back.
        Whether it was blocked there."""
        if key not in ws.blocked:
            return False
        full = ws.nthreads + sum(ws.blocked.values())
        del ws.blocked[key]
        self._count_blocked(ws, full)
        return True

    def _count_blocked(self, ws: WorkerInfo, full: int) -> None:
        """``ws`` of ``full`` threads offers those its blocked parts leave (at least one
        counted: with none left it is ``blocked``)."""
        usable = full - len(ws.blocked)
        nthreads = max(usable, 1)
        taken = full - nthreads
        for i, key in enumerate(ws.blocked):
            ws.blocked[key] = i < taken
        self.total_nthreads += nthreads - ws.nthreads
        ws.nthreads = nthreads
        if usable <= 0 and ws.status in ("running", "paused"):
            ws.status = "blocked"
        elif usable > 0 and ws.status == "blocked":
            ws.status = "running"
        self._running = None

    def running(self) -> list[WorkerInfo]:
        """Running workers that take any new work: not those kept free for a wide task
        (:meth:`reserve`), nor those kept for tasks that ask for their resources
        (``resources_only``, found through ``valid_workers``). Cached; callers must not
        modify the list."""
        r = self._running
        if r is None:
            r = self._running = [ws for ws in self.workers.values()
                                 if ws.status == "running" and ws.reserved is None
                                 and not ws.resources_only]
            self._by_end = None
            self._widest_job = None
        return r

    def widest_job(self) -> int | None:
        """When the workers come from several batch jobs: how many running ones (kept for a
        wide task or not) the job with the most has, which a wide task's slots, all of
        one job, cannot outnumber. None when they are of one job or none. Cached with
        :meth:`running`."""
        self.running()
        cached = self._widest_job
        if cached is None:
            counts: dict[str | None, int] = {}
            for ws in self.workers.values():
                if ws.status == "running":
                    counts[ws.job] = counts.get(ws.job, 0) + 1
            cached = self._widest_job = (max(counts.values()) if len(counts) > 1 else None,)
        return cached[0]

    def by_end(self) -> tuple[list[WorkerInfo], list[float]]:
        """The running workers, those kept for their resources included, the one that stays
        longest first (no end: first of all), and their ends negated, ascending (``bisect``
        finds those that stay past a time). Cached with :meth:`running`: sorted when a
        worker joins, leaves or changes status."""
        self.running()  # drops the cache when the running workers changed
        cached = self._by_end
        if cached is None:
            taking = [ws for ws in self.workers.values()
                      if ws.status == "running" and ws.reserved is None]
            order = sorted(taking, key=lambda ws: -math.inf if ws.end is None else -ws.end)
            cached = self._by_end = (order, [-math.inf if ws.end is None else -ws.end
                                             for ws in order])
        return cached

    def latest_end(self) -> float:
        """When the running worker that stays longest leaves (``math.inf``: one has no end,
        or none runs)."""
        _, keys = self.by_end()
        return -keys[0] if keys else math.inf

    def reserve(self, ws: WorkerInfo, ts: Any) -> None:
        """``ws``'s slots are kept free for the wide task ``ts`` (None: no longer)."""
        ws.reserved = ts
        self._running = None

    def heard_from(self, ws: WorkerInfo, now: float) -> None:
        """``ws`` said it is alive at ``now`` (a heartbeat)."""
        ws.last_seen = now
        by_last_seen = self._by_last_seen
        del by_last_seen[ws.address]
        by_last_seen[ws.address] = ws

    def silent_since(self, since: float) -> list[WorkerInfo]:
        """The workers not heard from since ``since``, least recent first."""
        out = []
        for ws in self._by_last_seen.values():
            if ws.last_seen >= since:
                break
            out.append(ws)
        return out

    def named(self, name: Any) -> WorkerInfo | None:
        """The worker named ``name``, if one is registered."""
        return self._names.get(name)

    def is_current(self, ws: WorkerInfo) -> bool:
        """``ws`` is still the registered worker at its address."""
        return self.workers.get(ws.address) is ws

    def note_bandwidth(self, metrics: Any) -> None:
        """A heartbeat's metrics: fold a measured ``bandwidth`` into the average."""
        bw = metrics.get("bandwidth") if isinstance(metrics, dict) else None
        if isinstance(bw, (int, float)) and bw > 0:
            self.bandwidth = 0.8 * self.bandwidth + 0.2 * float(bw)

    def resolve(self, addresses: Iterable[str] | None, names: Iterable[Any] | None,
                n: int | None = None, load: Callable[[WorkerInfo], Any] | None = None
                ) -> list[str]:
        """The workers to retire: by address, by name, and ``n`` more (idle ones with the
        least data first; ``load`` orders them, default: tasks processing, then bytes
        held)."""
        out: list[str] = []
        if addresses:
            out += [a for a in addresses if a in self.workers]
        if names:
            wanted = set(map(str, names))
            out += [ws.address for ws in self.workers.values() if str(ws.name) in wanted]
        if n:
            cands = sorted((ws for ws in self.workers.values() if ws.address not in out),
                           key=load or (lambda ws: (len(ws.processing), ws.nbytes)))
            out += [ws.address for ws in cands[:n]]
        return out

    def validate(self) -> None:
        """The worker table agrees with the thread total and the running list."""
        total = 0
        for addr, ws in self.workers.items():
            assert ws.address == addr, (ws, addr)
            total += ws.nthreads
            # a thread off nthreads for each blocked part, but the last: then it is blocked
            usable = ws.nthreads - len(ws.blocked) + sum(ws.blocked.values())
            assert ws.nthreads >= 1 and (ws.status != "blocked" or usable <= 0), ws
        assert self._by_last_seen.keys() == self.workers.keys(), "stale last_seen order"
        for name, ws in self._names.items():  # (the server refuses a second worker's name)
            assert self.workers.get(ws.address) is ws and ws.name == name, ("stale name", ws)
        assert total == self.total_nthreads, (total, self.total_nthreads)
        if self._running is not None:
            assert self._running == [ws for ws in self.workers.values() if ws.status == "running"
                                     and ws.reserved is None and not ws.resources_only], \
                "stale running workers"
