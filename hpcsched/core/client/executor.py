"""The standard library's ``Executor`` over a client (``Client.get_executor()``).

Code written to :class:`concurrent.futures.Executor` runs its calls as tasks of the
cluster: ``submit`` gives the client's futures (which are ``concurrent.futures``
futures, and which ``submit`` takes as arguments), ``map`` yields the results in order,
``shutdown`` waits for or cancels what is left, as the standard library's executors do.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Iterator
from itertools import islice, takewhile
from operator import attrgetter
from typing import Any

from hpcsched.core.client.futures import CancelledError, Future, FutureOwner, wait_futures

BATCH = 10_000  # results of Executor.map gathered at once at most
_done, _status = attrgetter("state._is_done"), attrgetter("state.status")


class ClientExecutor(cf.Executor):
    """``concurrent.futures`` on top of a Client."""

    def __init__(self, client: FutureOwner, **submit_kwargs: Any):
        self.client = client
        self.kwargs = submit_kwargs
        self._futures: set[Future] = set()
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        """``fn(*args, **kwargs)`` as a task: its :class:`Future`.

        A ``concurrent.futures.Future`` that ``submit`` also takes as an argument (a
        dependency), as dask's executor returns the client's futures."""
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        fut = self.client.submit(fn, *args, **self.kwargs, **kwargs)
        with self._lock:
            self._futures.add(fut)
        fut.add_done_callback(self._forget)
        return fut

    def _forget(self, fut: Future) -> None:
        with self._lock:
            self._futures.discard(fut)

    def map(self, fn: Callable, *iterables: Any, timeout: float | None = None,
            chunksize: int = 1, **ignored: Any) -> Iterator[Any]:
        """``fn`` over ``iterables`` as one ``Client.map`` (a bulk map when large).

        The results in order, as ``concurrent.futures.Executor.map``; ``chunksize`` is
        accepted and not needed (the scheduler sizes the ranges it gives each worker)."""
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1")
        futures = self.client.map(fn, *iterables, **self.kwargs)
        with self._lock:
            self._futures.update(futures)
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._results(futures, deadline, timeout)

    def _results(self, futures: list[Future], deadline: float | None,
                 timeout: float | None) -> Iterator[Any]:
        """The results of ``futures`` in order, a batch at a time: once the next future is
        done, the run of those after it done too is gathered with it (one request, no
        call per element), as ``client.gather`` does; the batch's results are yielded and
        its futures dropped. A batch with an erred or cancelled future gives its results
        one by one, so that the error is raised at its element, as the standard library's
        ``Executor.map`` raises it."""
        futures.reverse()  # taken from the end: each batch is dropped once it is given
        table = self.client.future_table
        try:
            while futures:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                table.wait([futures[-1].state], deadline, timeout)
                n = len(futures)
                run = len(list(takewhile(_done, islice(reversed(futures), BATCH))))
                batch = futures[n - run:]
                batch.reverse()
                del futures[n - run:]
                with self._lock:
                    self._futures.difference_update(batch)
                if set(map(_status, batch)) == {"finished"}:  # a look at each, in C
                    try:
                        values = self.client.gather(batch, timeout=left)
                    except CancelledError:  # cancelled since: raised at its element below
                        values = None
                    if values is not None:
                        del batch
                        yield from values
                        continue
                for fut in batch:
                    yield fut.result(timeout=left)
        finally:
            with self._lock:
                self._futures.difference_update(futures)
            if futures:
                self.client.cancel(futures)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more submissions; wait for (or cancel) the tasks submitted."""
        self._shutdown = True
        with self._lock:
            fs = list(self._futures)
        if cancel_futures and fs:
            self.client.cancel(fs)
        elif wait:
            wait_futures(fs)
