"""A task's time limit: past it, the task fails and its worker's slot is free again.

``client.submit(f, ..., time_limit="1h")`` (and ``map``) runs ``f`` as a
:class:`TimeLimited` call: the task's thread starts ``f`` on a thread of its own and waits
for it at most the limit. Past it, the task fails with :class:`TaskTimeLimitExceeded`,
naming the limit, and its thread returns: the worker's slot (and the devices the task
held) is free for the next task at once, on both roads (a task, an element of a bulk map).
The limit is the call's (or that of a ``dask.annotate`` around the call); the tasks of a
dask collection's graph are not given one.

Python cannot stop a thread from outside, so the code that overran is not killed: it
goes on in the background of the worker's process until it returns, and what it returns
is dropped. The worker says so in its log (with the task's key) and goes on working; the
overrunning code shares the process's CPUs with what runs next, and a GPU it used with the
task given that device next. Work that must be stopped for good belongs in a program the
task runs with a timeout (``subprocess.run(cmd, timeout=...)``), or in a worker that can
be retired (``client.retire_workers``), whose process ends with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("hpcsched.worker")


class TaskTimeLimitExceeded(TimeoutError):
    """A task ran past its ``time_limit``."""


class TimeLimited:
    """``func`` called with a time limit of ``seconds`` (see the module's documentation).

    >>> TimeLimited(sum, 5.0)([1, 2])
    3
    """

    __slots__ = ("func", "seconds", "what")

    def __init__(self, func: Callable, seconds: float, what: str = ""):
        self.func = func
        self.seconds = float(seconds)
        self.what = what  # the limit as the user wrote it, for the error

    @property
    def __name__(self) -> str:  # keys and task groups are named after the function
        return getattr(self.func, "__name__", type(self.func).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outcome: list = []
        done = threading.Event()

        def run() -> None:
            try:
                outcome.append((True, self.func(*args, **kwargs)))
            except BaseException as e:  # noqa: BLE001 - raised again in the task's thread
                outcome.append((False, e))
            finally:
                done.set()

        from hpcsched.core.worker import context

        running = context.current()
        if running is not None and running.on_loop:
            context.off_loop(running, "a task with a time limit")
        thread = threading.Thread(target=self._in_task(run, running), daemon=True,
                                  name=f"hpcsched-time-limited-{self.__name__}")
        thread.start()
        if not done.wait(self.seconds):
            limit = f"time_limit={self.what!r} ({self.seconds:g} s)" if self.what \
                else f"time_limit={self.seconds:g} s"
            key = running.key if running is not None else self.__name__
            logger.warning("task %r ran past its %s: failed, its slot given to the next task; "
                           "its code goes on in the background (Python cannot stop a thread) "
                           "until it returns", key, limit)
            raise TaskTimeLimitExceeded(
                f"task {key!r} ran past its {limit}; its worker's slot is free again, and "
                "its code, which Python cannot stop, goes on in the background until it "
                "returns (its result is dropped)")
        ok, value = outcome[0]
        if ok:
            return value
        raise value

    @staticmethod
    def _in_task(run: Callable[[], None], running: Any) -> Callable[[], None]:
        """``run`` on a thread that is marked as running the same task (``get_worker()``,
        ``get_task_gpus()`` and the task's client work there as in the task)."""
        if running is None:
            return run
        from hpcsched.core.worker import context

        def marked() -> None:
            outer = context.enter_task(running.worker, running.key, False, running.start,
                                       running.gang, running.devices)
            try:
                run()
            finally:
                context.leave_task(outer)

        return marked
