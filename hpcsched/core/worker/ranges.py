"""Ranges of bulk maps on a worker: run element after element, report them in batches.

The scheduler gives a worker a range of a bulk map's elements in one ``compute-range``
(:mod:`hpcsched.core.state.bulk`). At most ``nthreads`` ranges run at once, each on a
task thread, one element after the other, every element marked as the thread's task
(``get_worker()`` works inside it). The results go to the loop in batches (every
:data:`REPORT_EVERY` elements or :data:`REPORT_SECONDS`, whichever comes first), where
each is stored under its own key, as a task's result is, and one ``range-finished``
tells the scheduler of the batch; an element that raises is reported alone, with a
``task-erred`` for its key, and the range goes on. A range's elements are not tasks of
the worker's state machine: their results are plain entries of its data, which
``free-keys`` drops and peers fetch as any other.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from typing import Any

from hpcsched.core.protocol.messages import ComputeRange, RangeFinished, TaskErred
from hpcsched.core.protocol.serialize import loads_function, loads_object, sizeof
from hpcsched.core.worker.context import enter_task, hook_dask, leave_task
from hpcsched.core.worker.execution import pack_exception

logger = logging.getLogger("hpcsched.worker")

REPORT_EVERY = 512  # elements per report at most
REPORT_SECONDS = 0.005  # a report is due at least this often while a range runs
_SCALARS = frozenset({int, float, bool, type(None), complex, str, bytes})
getsizeof = sys.getsizeof


class Batch:
    """Finished elements of one map, on their way to the loop."""

    __slots__ = ("prefix", "indices", "values", "nbytes", "types", "starts", "stops",
                 "failures")

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.indices: list[int] = []
        self.values: list[Any] = []
        self.nbytes: list[int] = []
        self.types: list[str] = []
        self.starts: list[float] = []
        self.stops: list[float] = []
        self.failures: list[TaskErred] = []


class RangeRunner:
    """The ranges a worker was given (module docstring)."""

    def __init__(self, worker: Any):
        # the Worker (it imports this module): its loop, executor, nthreads, state, address
        self.worker = worker
        self._lock = threading.Lock()
        self._ranges: deque[ComputeRange] = deque()
        self._running = 0

    def submit(self, record: ComputeRange) -> None:
        """On the loop: run ``record``'s elements once a thread of the ranges is free."""
        with self._lock:
            self._ranges.append(record)
            if self._running >= self.worker.nthreads:
                return
            self._running += 1
        self.worker.executor.submit(self._run)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._ranges:
                    self._running -= 1
                    return
                record = self._ranges.popleft()
            try:
                self._run_range(record)
            except BaseException:  # noqa: BLE001 - the function itself cannot be loaded
                logger.exception("range of %s failed", record.prefix)

    def _run_range(self, record: ComputeRange) -> None:
        w = self.worker
        put = w.loop.put
        prefix = record.prefix
        batch = Batch(prefix)
        try:
            func = loads_function(record.function)
        except BaseException as e:  # noqa: BLE001 - every element errs with it
            packed, tb_text, text = pack_exception(e, e.__traceback__)
            now = time.time()
            batch.failures = [TaskErred(w.address, key=prefix + str(i), exception=packed, traceback=tb_text,
                                        exception_text=text, start=now, stop=now)
                              for i in record.indices]
            put(("ranges", batch))
            return
        hook_dask()
        clock = time.time
        due = clock() + REPORT_SECONDS
        for i, blob in zip(record.indices, record.args, strict=True):
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
                put(("ranges", batch))
                batch = Batch(prefix)
                due = stop + REPORT_SECONDS
        if batch.indices or batch.failures:
            put(("ranges", batch))

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
        if batch.indices:
            w.send_to_scheduler(RangeFinished(w.address, prefix=prefix, indices=batch.indices,
                                              nbytes=batch.nbytes, types=batch.types,
                                              starts=batch.starts, stops=batch.stops))
        for failure in batch.failures:
            w.send_to_scheduler(failure)
