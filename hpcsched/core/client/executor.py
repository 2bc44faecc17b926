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
from typing import Any

from hpcsched.core.client.futures import Future, FutureOwner, wait_futures


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
        return self._results(futures, deadline)

    def _results(self, futures: list[Future], deadline: float | None) -> Iterator[Any]:
        futures.reverse()  # popped from the end: each is dropped once its result is given
        try:
            while futures:
                fut = futures.pop()
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                with self._lock:
                    self._futures.discard(fut)
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
