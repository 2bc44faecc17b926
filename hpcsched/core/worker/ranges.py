"""Ranges of bulk maps on a worker: run element after element, report them in batches.

The scheduler gives a worker a range of a bulk map's elements in one ``compute-range``
(:mod:`hpcsched.core.state.bulk`). Ranges run on the worker's task threads, one element
after the other, every element marked as the thread's task (``get_worker()`` works
inside it), and share the worker's ``nthreads`` slots with its tasks: the worker's state
machine starts a thread of ranges in a slot no ready task takes (``RunRanges``), and the
thread takes waiting ranges one after the other until none waits or a task waits for the
slot (``RangeThreadDone`` frees it). An element that secedes (``worker_client()``) gives
the slot up at once: its thread ends with that element, and the rest of its range waits
for a slot again. Its ``rejoin()`` goes on at once, unlike a task's, which waits for a
slot: the worker runs one thread over ``nthreads`` for at most the rest of that one
element. The results go to the loop in batches (every
:data:`REPORT_EVERY` elements or :data:`REPORT_SECONDS`, whichever comes first), where
each is stored under its own key, as a task's result is, and one ``range-finished``
tells the scheduler of the batch; an element that raises is reported alone, with a
``task-erred`` for its key, and the range goes on. A report carries what its elements
used together, not each one's (a clock read per element would cost a sweep of tiny
elements more than the element): the thread's CPU time between two reports plus its
command elements' processes', and as memory the largest peak of those processes, else
the worker's peak since the report began (:class:`~hpcsched.core.worker.memory.PeakMemory`;
its RSS as last sampled where that cannot be read), when the scheduler asked for them as
the worker's tasks' (``TaskRunner.usage_wanted``). A range's elements are not tasks of
the worker's state machine: their results are plain entries of its data, which
``free-keys`` drops and peers fetch as any other.

``release-range`` takes back elements that have not started, the last given first (the
scheduler moves them to idle workers, or off a paused or retiring one): a thread takes
its range's next element, and the loop cuts a range's end, under one lock, so that an
element is either started here or given up (``range-released``), never both.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from time import thread_time
from typing import Any, Protocol

from hpcsched.core.comm.base import Inbox
from hpcsched.core.protocol.records import replace
from hpcsched.core.protocol.serialize import loads_function, loads_object, sizeof
from hpcsched.core.protocol.worker import (
    ComputeRange,
    RangeFinished,
    RangeReleased,
    ReleaseRange,
    TaskErred,
)
from hpcsched.core.state import events as ev
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.worker.context import (
    TaskWorker,
    enter_task,
    hook_dask,
    leave_task,
    take_usage,
)
from hpcsched.core.worker.execution import pack_exception
from hpcsched.core.worker.memory import PEAK
from hpcsched.core.worker.memory_monitor import MemoryMonitor
from hpcsched.core.worker.parts.inbox import RangesDone, stimulus
from hpcsched.core.worker.parts.running import TaskRunner
from hpcsched.core.worker.task_pool import TaskPool

logger = logging.getLogger("hpcsched.worker")

REPORT_EVERY = 512  # elements per report at most
REPORT_SECONDS = 0.005  # a report is due at least this often while a range runs
_SCALARS = frozenset({int, float, bool, type(None), complex, str, bytes})
getsizeof = sys.getsizeof


class Batch:
    """Finished elements of one map, on their way to the loop."""

    __slots__ = ("prefix", "indices", "values", "nbytes", "types", "starts", "stops",
                 "failures", "cpu", "memory")

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.indices: list[int] = []
        self.values: list[Any] = []
        self.nbytes: list[int] = []
        self.types: list[str] = []
        self.starts: list[float] = []
        self.stops: list[float] = []
        self.failures: list[TaskErred] = []
        self.cpu = 0.0  # CPU seconds its elements used together (thread and children)
        self.memory = 0  # the largest peak of its elements' child processes (commands)


def _charge(batch: Batch, cpu_mark: float) -> float:
    """``batch`` used the thread's CPU time since ``cpu_mark`` and what its elements'
    child processes reported (command elements), else the worker's peak memory since the
    report began; the new mark, and the peak reset for the next report."""
    now = thread_time()
    usage = take_usage()
    if usage is not None:
        batch.cpu = now - cpu_mark + usage[0]
        batch.memory = usage[1]
    else:
        batch.cpu = now - cpu_mark
        batch.memory = PEAK.peak()
    PEAK.reset()
    return now


class Range:
    """A range given to the worker: its elements at positions ``[next, end)`` of the
    record have not started (``next`` moves as a thread starts them, ``end`` as the loop
    gives the tail up; both under the runner's lock)."""

    __slots__ = ("record", "next", "end")

    def __init__(self, record: ComputeRange):
        self.record = record
        self.next = 0
        self.end = len(record.indices)


class RangeHost(TaskWorker, Protocol):
    """What the runner uses of its worker (the :class:`~hpcsched.core.worker.server.
    Worker`, which imports this module)."""

    address: str
    nthreads: int
    executor: TaskPool
    state: WorkerState | None
    memory: MemoryMonitor
    tasks: TaskRunner  # its usage_wanted: whether reports carry cpu and memory

    @property
    def loop(self) -> Inbox:
        """Where range threads put their batches and events."""

    def send_to_scheduler(self, record: Any) -> None:
        """On the loop: ``record`` leaves with this iteration's batch to the scheduler."""


class RangeRunner:
    """The ranges a worker was given (module docstring)."""

    def __init__(self, worker: RangeHost):
        self.worker = worker
        self._lock = threading.Lock()
        self._ranges: deque[Range] = deque()  # waiting for a thread
        self._active: list[Range] = []  # running on a thread
        self._threads = 0  # threads that take waiting ranges (each holds a slot)
        self._local = threading.local()  # .seceded: this range thread gave its slot up
        # prefix -> indices of elements given here whose results are no longer wanted
        # (cancelled, released) before they started: skipped, not run
        self._dropped: dict[str, set[int]] = {}

    def _wanted(self) -> int:
        """Under the lock: more threads the waiting ranges want (``RangesWaiting``)."""
        return min(len(self._ranges), self.worker.nthreads - self._threads)

    def submit(self, record: ComputeRange) -> ev.RangesWaiting:
        """On the loop: queue ``record``'s elements; what to tell the state machine."""
        with self._lock:
            self._ranges.append(Range(record))
            return ev.RangesWaiting(self._wanted(), now=record.now,
                                    stimulus_id=record.stimulus_id)

    def start_thread(self) -> None:
        """On the loop: the state machine gave the ranges a slot (``RunRanges``)."""
        with self._lock:
            self._threads += 1
        self.worker.executor.submit(self._run)

    def release(self, count: int) -> dict[str, list[int]]:
        """On the loop: give up at most ``count`` elements not started, the last given
        first (the tails of the waiting ranges, then of the running ones); by prefix."""
        out: dict[str, list[int]] = {}
        with self._lock:
            for r in [*reversed(self._ranges), *reversed(self._active)]:
                if count <= 0:
                    break
                n = min(count, r.end - r.next)
                if n <= 0:
                    continue
                cut = r.end - n
                record = r.record
                out.setdefault(record.prefix, []).extend(record.indices[cut:r.end])
                r.end = cut
                count -= n
            if out:
                self._ranges = deque(r for r in self._ranges if r.next < r.end)
        return out

    def drop(self, keys: list) -> None:
        """On the loop: of ``keys`` (freed by the scheduler), the elements of ranges given
        here that have not started will not run: their results are no longer wanted."""
        with self._lock:
            if not self._ranges and not self._active:
                return
            prefixes = {r.record.prefix for r in (*self._ranges, *self._active)}
            for key in keys:
                if type(key) is not str:
                    continue
                head, _, tail = key.rpartition("-")
                if head + "-" in prefixes and tail.isdigit():
                    self._dropped.setdefault(head + "-", set()).add(int(tail))

    def answer_release(self, record: ReleaseRange) -> ev.RangesWaiting:
        """On the loop: ``release-range``, answered; what to tell the state machine."""
        w = self.worker
        w.send_to_scheduler(RangeReleased(w.address, released=self.release(record.count)))
        with self._lock:
            return ev.RangesWaiting(self._wanted(), now=record.now,
                                    stimulus_id=record.stimulus_id)

    def as_of_now(self, e: ev.RangesWaiting | ev.RangeThreadDone
                  ) -> ev.RangesWaiting | ev.RangeThreadDone:
        """On the loop: ``e``, made on a range thread, with the threads the waiting ranges
        want now.

        What the thread counted is stale once the loop handles ``e``: a ``compute-range``
        handled in between wanted a thread the state machine had no slot for yet (the
        ending thread still held it), and the thread's "none wanted" would then leave that
        range waiting, with no thread to run it, until the next range came.
        """
        with self._lock:
            wanted = self._wanted()
        return e if wanted == e.threads else type(e)(wanted, now=e.now,
                                                     stimulus_id=e.stimulus_id)

    def on_range_thread(self) -> bool:
        """Whether the calling thread runs ranges (and holds a slot for them)."""
        return getattr(self._local, "seceded", None) is False

    def secede(self) -> None:
        """On a range thread, from its element: give the thread's slot up (``secede()``);
        the thread ends with this element."""
        with self._lock:
            self._threads -= 1
            wanted = self._wanted()
        self._local.seceded = True
        self.worker.loop.put(_thread_done(wanted))

    def _run(self) -> None:
        lock = self._lock
        local = self._local
        local.seceded = False
        state = self.worker.state
        ran = False
        try:
            while True:
                with lock:
                    if not self._ranges or (ran and state is not None and (
                            state.ready or state.rejoining or state.status != "running")):
                        # nothing waits, or a task waits for this slot (or the worker
                        # paused): the ranges still waiting want a thread again
                        self._threads -= 1
                        wanted = self._wanted()
                        break
                    r = self._ranges.popleft()
                    self._active.append(r)
                ran = True
                try:
                    self._run_range(r)
                except BaseException:  # noqa: BLE001 - the function itself cannot be loaded
                    logger.exception("range of %s failed", r.record.prefix)
                finally:
                    with lock:
                        self._active.remove(r)
                        if local.seceded and r.next < r.end:
                            self._ranges.appendleft(r)  # the rest waits for a slot
                        wanted = self._wanted()
                if local.seceded:  # the slot is given up already
                    self.worker.loop.put(ev.RangesWaiting(
                        wanted, now=time.time(), stimulus_id=stimulus("ranges-waiting")))
                    return
            self.worker.loop.put(_thread_done(wanted))
        finally:
            local.seceded = None

    def _take(self, r: Range) -> int:
        """The position of ``r``'s next element to run, started from now on; -1: none."""
        with self._lock:
            j = r.next
            if j >= r.end:
                return -1
            r.next = j + 1
            return j

    def _run_range(self, r: Range) -> None:
        record = r.record
        w = self.worker
        put = w.loop.put
        prefix = record.prefix
        batch = Batch(prefix)
        try:
            func = loads_function(record.function)
        except BaseException as e:  # noqa: BLE001 - every element errs with it
            packed, tb_text, text = pack_exception(e, e.__traceback__)
            now = time.time()
            failed = []
            while (j := self._take(r)) >= 0:
                failed.append(record.indices[j])
            batch.failures = [TaskErred(w.address, key=prefix + str(i), exception=packed, traceback=tb_text,
                                        exception_text=text, start=now, stop=now)
                              for i in failed]
            put(RangesDone(batch))
            return
        hook_dask()
        clock = time.time
        due = clock() + REPORT_SECONDS
        cpu_mark = thread_time()  # a report's CPU time: two clock reads a report, not one an element
        PEAK.reset()  # and its peak memory (memory.PeakMemory)
        indices, all_args, lock, local = record.indices, record.args, self._lock, self._local
        dropped = self._dropped
        while True:
            if local.seceded:  # the last element seceded: the slot is given up
                break
            with lock:  # as _take, inline: once per element
                j = r.next
                if j >= r.end:
                    break
                r.next = j + 1
            i, blob = indices[j], all_args[j]
            if dropped and i in dropped.get(prefix, ()):
                continue
            key = prefix + str(i)
            start = clock()
            outer = enter_task(w, key, False, start)
            try:
                args, kwargs = loads_object(blob)
                value = func(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - reported to the scheduler
                stop = clock()
                packed, tb_text, text = pack_exception(e, e.__traceback__)
                logger.warning("task %r failed: %s", key, text)
                batch.failures.append(TaskErred(w.address, key=key, exception=packed, traceback=tb_text,
                                                 exception_text=text, start=start, stop=stop))
                continue
            finally:
                leave_task(outer)
            stop = clock()
            if value.__class__ in _SCALARS:  # the common result of a sweep: no dispatch
                nbytes = getsizeof(value)
            else:
                try:
                    nbytes = sizeof(value)
                except Exception:
                    nbytes = 64
            batch.indices.append(i)
            batch.values.append(value)
            batch.nbytes.append(nbytes)
            batch.types.append(type(value).__name__)
            batch.starts.append(start)
            batch.stops.append(stop)
            if len(batch.indices) >= REPORT_EVERY or stop >= due or batch.failures:
                cpu_mark = _charge(batch, cpu_mark)
                put(RangesDone(batch))
                batch = Batch(prefix)
                due = stop + REPORT_SECONDS
        if batch.indices or batch.failures:
            _charge(batch, cpu_mark)
            put(RangesDone(batch))
        if dropped:
            with lock:
                if not any(o.record.prefix == prefix and o.next < o.end
                           for o in (*self._ranges, *self._active)):
                    dropped.pop(prefix, None)

    def deliver(self, batch: Batch) -> None:
        """On the loop: hold a batch's results, tell the scheduler."""
        w = self.worker
        state = w.state
        if state is None:
            return
        data = state.data
        prefix = batch.prefix
        keys = [prefix + str(i) for i in batch.indices]
        store_many = getattr(data, "store_many", None)
        if store_many is not None:  # a spill buffer: the sizes are known already
            store_many(keys, batch.values, batch.nbytes)
        else:
            data.update(zip(keys, batch.values, strict=True))
        wanted = w.tasks.usage_wanted  # else both left out: (0.0, 0)
        cpu = batch.cpu if wanted else 0.0
        memory = (batch.memory or w.memory.latest_rss()) if wanted else 0
        if batch.indices:
            w.send_to_scheduler(RangeFinished(w.address, prefix=prefix, indices=batch.indices,
                                              nbytes=batch.nbytes, types=batch.types,
                                              starts=batch.starts, stops=batch.stops,
                                              cpu=cpu, memory=memory))
        for failure in batch.failures:  # their CPU time is in the report's; memory as its
            w.send_to_scheduler(replace(failure, memory=memory) if memory else failure)


def _thread_done(wanted: int) -> ev.RangeThreadDone:
    """A thread of ranges ended (or seceded), ``wanted`` more threads wanted."""
    return ev.RangeThreadDone(wanted, now=time.time(), stimulus_id=stimulus("range-thread-done"))
