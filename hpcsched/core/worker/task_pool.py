"""The worker's task threads: a pool that grows while tasks have seceded.

The worker's state machine decides how many tasks run at once (``nthreads``
holding a slot, plus any number that seceded: ``hpcsched.secede()``); this
pool only has to run every task it is given at once. A submission takes an
idle thread or starts a new one, so a task that secedes keeps its thread
while the next task gets another: the pool grows by one for as long as the
seceded task runs, as dask.distributed's thread pool does ("Launch Tasks
from Tasks" in its documentation). A thread that finds ``nthreads`` others
idle exits, so the pool shrinks back once seceded tasks end.

Idle threads wait on a condition, without timeout: :meth:`TaskPool.shutdown`
is their way out. Tasks still running at shutdown are not waited for (their
threads are daemons), as with ``ThreadPoolExecutor.shutdown(wait=False,
cancel_futures=True)``.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("hpcsched.worker")


class TaskPool:
    """Run each submitted call on a thread of its own while it runs.

    >>> pool = TaskPool(1, "doc")
    >>> done = threading.Event()
    >>> pool.submit(done.set)
    >>> done.wait(5)
    True
    >>> pool.shutdown()
    """

    def __init__(self, nthreads: int, name: str = "hpcsched-task"):
        self.keep_idle = max(int(nthreads), 1)  # idle threads kept for the next tasks
        self.name = name
        self._cond = threading.Condition()
        self._calls: deque[tuple[Callable, tuple]] = deque()
        self._idle = 0  # threads waiting for a call
        self._woken = 0  # ... of which were notified and have not taken theirs yet
        self._threads = 0
        self._ids = itertools.count()
        self._shutdown = False

    @property
    def nthreads(self) -> int:
        """Threads alive (busy or idle)."""
        return self._threads

    def submit(self, fn: Callable, *args: Any) -> None:
        with self._cond:
            if self._shutdown:
                raise RuntimeError(f"{self.name} pool is shut down")
            self._calls.append((fn, args))
            if self._idle > self._woken:
                self._woken += 1
                self._cond.notify()
                return
            self._threads += 1
        threading.Thread(target=self._run, daemon=True,
                         name=f"{self.name}-{next(self._ids)}").start()

    def shutdown(self) -> None:
        """Drop calls not started; idle threads exit; running calls finish on their own."""
        with self._cond:
            self._shutdown = True
            self._calls.clear()
            self._cond.notify_all()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._calls:
                    if self._shutdown or self._idle >= self.keep_idle:
                        self._threads -= 1
                        return
                    self._idle += 1
                    cond.wait()
                    self._idle -= 1
                    if self._woken:
                        self._woken -= 1
                fn, args = self._calls.popleft()
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a task's own errors are caught inside fn
                logger.exception("%s: uncaught error in a task thread", self.name)
            del fn, args
