"""What the scheduler saw happen, kept in bounded memory for the dashboard and reports.

The :class:`Recorder` is handed to :class:`~hpcsched.core.state.scheduler_state.SchedulerState`
as its ``recorder`` and called from a few of its handlers (a task finished or
erred, a worker joined, left or sent a heartbeat, a retirement). Rules:

* It runs on the scheduler's thread, inside the handler: each call appends one
  tuple to a ring buffer (:class:`collections.deque` with ``maxlen``) and adds
  to a few per-:class:`TaskGroup` totals. No clock is read, nothing is
  formatted, nothing is sent: keys and exceptions are kept as they came and
  turned into text only when a page asks.
* Memory is bounded whatever the run's length: ring buffers drop their oldest
  entries; group totals keep at most ``max_groups`` groups.
* Readers (pages, reports, ``get_task_stream``) call :meth:`Recorder.task_stream`
  and friends on the scheduler's thread through ``scheduler.call`` (see
  :mod:`hpcsched.diagnostics.snapshot`), never holding it for long.

Task stream entries are ``(worker, lane, group, key, start, stop, kind)``:
``lane`` is the worker thread that ran it, rebuilt from the intervals (a worker
runs at most ``nthreads`` tasks at once, so packing each finished task into the
first thread free at its start gives a valid thread assignment without the
worker reporting thread ids); ``kind`` is ``"compute"``, ``"erred"`` or
``"transfer"`` (then ``group`` names the peer the data came from and ``key``
is the number of bytes).

A task that held many slots (``ranks=N``, a gang) is one task on N workers: an entry
on each member's lane, with the key and the times its first member reported, one task
in its group's count, and N times its duration in the compute seconds (the slots it
held, as a batch system charges core-hours).
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import sub
from typing import Any

from hpcsched.core.graph.dsk import key_split

STREAM_LENGTH = 100_000  # task stream entries kept (about 15 MB)
TRANSFERS_LENGTH = 20_000
EVENTS_LENGTH = 2_000
SAMPLES_LENGTH = 3_600  # cluster samples, one a second at most: an hour
LOG_LINES = 500  # per worker


class GroupTotals:
    """Cumulative figures of one task group (tasks done, seconds, bytes, failures)."""

    __slots__ = ("done", "seconds", "nbytes", "erred", "first_start", "last_stop")

    def __init__(self) -> None:
        self.done = 0
        self.seconds = 0.0
        self.nbytes = 0
        self.erred = 0
        self.first_start = 0.0
        self.last_stop = 0.0


class Recorder:
    def __init__(self, max_groups: int = 1_000, stream_length: int = STREAM_LENGTH):
        self.stream: deque = deque(maxlen=stream_length)
        self.transfers: deque = deque(maxlen=TRANSFERS_LENGTH)
        self.events: deque = deque(maxlen=EVENTS_LENGTH)  # (time, topic, text)
        self.samples: deque = deque(maxlen=SAMPLES_LENGTH)  # see sample()
        self.groups: dict[str, GroupTotals] = {}
        self.max_groups = max_groups
        self.logs: dict[str, deque] = {}  # worker address -> recent log lines
        # entries ever appended: a page asks for those after the last it saw
        self.stream_count = 0
        self.transfer_count = 0
        self.n_finished = 0
        self.n_erred = 0
        self.bytes_transferred = 0
        self.compute_seconds = 0.0
        self.last_sample = 0.0
        self.rate_marks: deque = deque(maxlen=256)  # (time, n_finished) of recent snapshots
        self._lanes: dict[str, list[float]] = {}  # worker -> end time of each thread's last task
        self.history: Any = None  # a History (hpcsched.diagnostics.history) keeps them too

    # ------------------------------------------------------------ called by the scheduler
    def _lane(self, worker: str, nthreads: int, start: float, stop: float) -> int:
        lanes = self._lanes.get(worker)
        if lanes is None:
            lanes = self._lanes[worker] = [0.0] * max(nthreads, 1)
        best = -1
        best_end = -1.0
        for i, end in enumerate(lanes):
            # the thread free at ``start`` that freed up last (tightest fit)
            if end <= start + 1e-6 and end > best_end:
                best, best_end = i, end
        if best < 0:  # clocks disagree a little: the thread that frees first
            best = lanes.index(min(lanes))
        lanes[best] = stop
        return best

    def _group(self, name: str) -> GroupTotals:
        g = self.groups.get(name)
        if g is None:
            if len(self.groups) >= self.max_groups:
                del self.groups[next(iter(self.groups))]  # the oldest group goes
            g = self.groups[name] = GroupTotals()
        return g

    def _entries(self, key: Any, group: str, start: float, stop: float, kind: str,
                 ws: Any, members: Any) -> int:
        """Stream entries for a task run by ``ws`` (and the other ``members`` of a task
        holding many slots); how many workers it held."""
        n = 0
        for m in members or (ws,):
            lane = self._lane(m.address, m.nthreads, start, stop)
            self.stream.append((m.address, lane, group, key, start, stop, kind))
            n += 1
        self.stream_count += n
        return n

    def task_finished(self, e: Any, ts: Any, ws: Any, members: Any = ()) -> None:
        """``e``: the TaskFinished event; ``ts`` its TaskState (None when already forgotten);
        ``ws`` the WorkerInfo that ran it; ``members``: the workers of a task that held
        many slots, ``ws`` the first."""
        start, stop = e.start, e.stop
        if stop <= 0.0:  # a result that was already there (no run to show)
            return
        group = ts.group.name if ts is not None else key_split(e.key)
        if members:
            held = self._entries(e.key, group, start, stop, "compute", ws, members)
        else:  # one slot, nearly every task: no loop over members
            held = 1
            address = ws.address
            lane = self._lane(address, ws.nthreads, start, stop)
            self.stream.append((address, lane, group, e.key, start, stop, "compute"))
            self.stream_count += 1
        g = self._group(group)
        duration = (stop - start) * held if stop > start else 0.0
        g.done += 1
        g.seconds += duration
        g.nbytes += e.nbytes if e.nbytes > 0 else 0
        if not g.first_start or start < g.first_start:
            g.first_start = start
        if stop > g.last_stop:
            g.last_stop = stop
        self.n_finished += 1
        self.compute_seconds += duration
        if self.history is not None:
            self.history.task(e.key, group, ws.address, start, stop, "memory", e.nbytes,
                              e.cpu, e.memory)

    def elements_finished(self, group: str, ws: Any, keys: list, starts: list, stops: list,
                          nbytes: list, cpu: float = 0.0, memory: int = 0) -> None:
        """Elements of a bulk map ran on ``ws`` (one report of its worker): as many
        :meth:`task_finished` of the group ``group``, in one call (``cpu``, ``memory``:
        the report's, as ``range-finished`` carries them)."""
        n = len(keys)
        if not len(starts) == len(stops) == len(nbytes) == n:
            raise ValueError("elements_finished: keys, starts, stops and nbytes differ in length")
        if not n:
            return
        address, nthreads = ws.address, ws.nthreads
        g = self._group(group)
        lanes: Any
        if nthreads == 1:  # one thread, one lane: no search
            got = self._lanes.get(address)
            if got is None:
                got = self._lanes[address] = [0.0]
            got[0] = stops[-1]
            lanes = repeat(0, n)
        else:
            lane_of = self._lane
            lanes = [lane_of(address, nthreads, a, b) for a, b in zip(starts, stops, strict=True)]
        # the entries made by zip, the sums by C loops: a report holds hundreds of elements
        self.stream.extend(zip(repeat(address, n), lanes, repeat(group, n), keys, starts, stops,
                               repeat("compute", n), strict=True))
        seconds = sum([d for d in map(sub, stops, starts) if d > 0.0])
        g.nbytes += sum([x for x in nbytes if x > 0])
        first, last = g.first_start, g.last_stop
        low, high = min(starts), max(stops)
        if not first or low < first:
            first = low
        if high > last:
            last = high
        g.first_start, g.last_stop = first, last
        g.done += len(keys)
        g.seconds += seconds
        self.stream_count += len(keys)
        self.n_finished += len(keys)
        self.compute_seconds += seconds
        if self.history is not None:
            self.history.elements(group, address, keys, starts, stops, nbytes, cpu, memory)

    def task_erred(self, e: Any, ts: Any, ws: Any, members: Any = ()) -> None:
        """As :meth:`task_finished`, for a task that raised (``ws``: the worker it raised
        on; ``members``: all the workers of a task that held many slots)."""
        group = ts.group.name if ts is not None else key_split(e.key)
        if e.stop > 0.0:
            self._entries(e.key, group, e.start, e.stop, "erred", ws, members)
        self._group(group).erred += 1
        self.n_erred += 1
        if self.history is not None:
            self.history.task(e.key, group, ws.address, e.start, e.stop, "erred", 0, e.cpu,
                              e.memory)
        self.events.append((e.now, "task-erred", (e.key, ws.address, e.exception_text)))

    def worker_added(self, ws: Any, now: float) -> None:
        self.events.append((now, "worker-added", (ws.address, ws.name, ws.nthreads)))

    def worker_removed(self, address: str, reason: str, now: float) -> None:
        self._lanes.pop(address, None)
        self.events.append((now, "worker-removed", (address, reason)))

    def heartbeat(self, e: Any, ws: Any) -> None:
        """Takes the transfers and log lines out of a heartbeat's metrics (they are news,
        not state: ``WorkerInfo.metrics`` keeps the rest)."""
        metrics = e.metrics
        if not isinstance(metrics, dict):
            return
        transfers = metrics.pop("transfers", None)
        if transfers:
            self.transfers_done(ws.address, transfers)
        lines = metrics.pop("logs", None)
        if lines and isinstance(lines, list):
            box = self.logs.get(ws.address)
            if box is None:
                if len(self.logs) >= 2 * LOG_LINES:  # workers come and go: the oldest go
                    del self.logs[next(iter(self.logs))]
                box = self.logs[ws.address] = deque(maxlen=LOG_LINES)
            box.extend(lines[-LOG_LINES:])

    def transfers_done(self, worker: str, transfers: Any) -> None:
        """``transfers``: ``[(peer, start, stop, nbytes), ...]`` a worker fetched (sent in its
        heartbeat: untrusted, so malformed entries are skipped)."""
        if not isinstance(transfers, list):
            return
        for t in transfers[:10_000]:
            try:
                peer, start, stop, nbytes = str(t[0]), float(t[1]), float(t[2]), int(t[3])
            except (TypeError, ValueError, IndexError):
                continue
            self.transfers.append((worker, peer, start, stop, nbytes))
            self.transfer_count += 1
            self.bytes_transferred += nbytes if nbytes > 0 else 0

    def event(self, topic: str, what: Any, now: float) -> None:
        """Anything else worth showing (adaptive decisions, retirements)."""
        self.events.append((now, topic, what))

    def sample(self, now: float, values: tuple) -> None:
        """One cluster-wide sample, ``(memory, managed, executing, threads)``, taken with a
        status snapshot (at most once a second)."""
        self.last_sample = now
        self.samples.append((now, *values))
