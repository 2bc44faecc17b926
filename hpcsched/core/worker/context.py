"""Which task the calling thread runs, for which worker: the tasks' side of a worker.

The worker marks a thread with the task it runs (:func:`enter_task` /
:func:`leave_task`); code inside the task reads it: :func:`get_worker`,
:func:`secede`, :func:`rejoin`, with dask.distributed's names and meaning
("Launch Tasks from Tasks" in its documentation), and the client inside
tasks (:mod:`hpcsched.core.client.worker_client`), which connects to the
worker's scheduler with the worker's credentials (:func:`task_scheduler`).

A task waiting on tasks it submitted holds a thread slot of its worker; on a
worker with one thread, that wait would never end. :func:`secede` gives the
slot back (the worker starts the next task on another thread, and the
scheduler counts the task out of the worker's slots); :func:`rejoin` waits for
a slot again.

The worker runs tasks known to take well under a millisecond on its event
loop's thread. Such a task must never block there: a call that would
(making a client, seceding) stops it with :class:`TaskNeedsThread`, and the
worker runs the task again from the start on a task thread, as it does from
then on for every task of its group. Work a task does before its first such
call may thus run twice; call these first.

Once dask is loaded in a worker's process (a task's function came from it),
:func:`hook_dask` has ``.compute()`` inside tasks go through the worker's
client (the client layer serves it, through :mod:`hpcsched.core.seams`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from hpcsched.core import seams
from hpcsched.core.comm.base import Security


class TaskNeedsThread(BaseException):
    """Raised inside a task running on the worker's event loop that must not block it.

    A BaseException, so that a task's ``except Exception`` lets it through to the
    worker, which runs the task again on a task thread.
    """


class TaskWorker(Protocol):
    """What the code here uses of the worker running a task (the
    :class:`~hpcsched.core.worker.server.Worker`, which imports this module)."""

    security: Security | None
    name: Any

    @property
    def scheduler_address(self) -> str:
        """The address of the worker's scheduler."""

    def secede_task(self, key: Any, compute_duration: float) -> None:
        """The task ``key`` leaves the worker's thread pool."""

    def rejoin_task(self, key: Any) -> None:
        """Block until the seceded task ``key`` has a thread slot again."""

    def task_client(self, make: Callable[[], Any]) -> Any:
        """The client the worker's tasks share, made by ``make`` on first use."""


class Running(NamedTuple):
    """The task a thread runs: its worker, its key, when it started, whether it runs
    on the worker's loop thread, and (a task holding many slots) its members' addresses."""

    worker: TaskWorker
    key: Any
    start: float
    on_loop: bool
    gang: tuple = ()


_local = threading.local()  # .task: Running or None; .seceded: bool; .cleanups: list
_running = tuple.__new__  # Running without its __new__'s call: this runs for every task


# ---------------------------------------------------------------- for the worker
def enter_task(worker: TaskWorker, key: Any, on_loop: bool, start: float,
               gang: tuple = ()) -> Running | None:
    """Mark this thread as running ``key`` for ``worker`` since ``start`` (``gang``: as a
    member of a task holding many slots, every member's address in order).

    Returns what to pass to :func:`leave_task`.
    """
    previous = getattr(_local, "task", None)
    _local.task = _running(Running, (worker, key, start, on_loop, gang))
    _local.seceded = False
    return previous


def leave_task(previous: Running | None) -> None:
    """The task this thread ran is over: back to ``previous`` (from :func:`enter_task`),
    after what the task left to do when it ends (:func:`at_task_end`)."""
    cleanups = getattr(_local, "cleanups", None)
    _local.task = previous
    if cleanups:
        _local.cleanups = []
        for cleanup in reversed(cleanups):
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - the task's own outcome is what counts
                pass


def at_task_end(cleanup: Callable[[], Any]) -> None:
    """Call ``cleanup`` on this thread once the current task ends (freeing what the task
    made for itself alone, such as a gang's communicator)."""
    if not hasattr(_local, "cleanups"):
        _local.cleanups = []
    _local.cleanups.append(cleanup)


_dask_hooked = [False]


def hook_dask() -> None:
    """Have dask's ``.compute()`` inside tasks run on the cluster, once dask is loaded.

    Unless the process chose a dask scheduler itself. Called per task: cheap once done.
    """
    if _dask_hooked[0] or "dask.config" not in sys.modules:
        return
    import dask.config

    _dask_hooked[0] = True
    if dask.config.get("scheduler", None) is None:
        seams.resolve("dask-scheduler")(None)


# ---------------------------------------------------------------- for the task
def current() -> Running | None:
    """The task this thread runs, if any."""
    return getattr(_local, "task", None)


def in_task() -> bool:
    """Whether this thread is running a task of an hpcsched worker."""
    return getattr(_local, "task", None) is not None


def off_loop(running: Running, what: str) -> None:
    """Stop a task on the loop thread (:class:`TaskNeedsThread`) before ``what`` blocks."""
    if running.on_loop:
        raise TaskNeedsThread(f"{what} inside task {running.key!r} on the worker's loop thread")


def task_scheduler() -> tuple[str, Security | None] | None:
    """Inside a task: (address, security) of its worker's scheduler; else None.

    What ``Client()`` without an address connects to inside a task.
    """
    running = current()
    if running is None:
        return None
    off_loop(running, "connecting a client")
    return running.worker.scheduler_address, running.worker.security


def get_worker() -> Any:
    """The :class:`~hpcsched.core.worker.server.Worker` running the current task.

    Raises ``ValueError`` outside a task.
    """
    running = current()
    if running is None:
        raise ValueError("No worker found: get_worker() works only inside a task running on "
                         "an hpcsched worker")
    return running.worker


def secede() -> None:
    """Have the current task leave its worker's thread pool.

    The worker may start another task on a new thread while this one goes on
    (typically waiting for tasks it submitted), and the scheduler no longer
    counts it among the worker's busy slots. See :func:`rejoin`.
    """
    running = current()
    if running is None:
        raise ValueError("secede() works only inside a task running on an hpcsched worker")
    off_loop(running, "secede()")
    running.worker.secede_task(running.key, time.time() - running.start)  # once is enough
    _local.seceded = True


def rejoin() -> None:
    """Have the current (seceded) task take a thread slot of its worker again.

    Blocks until a slot is free (the next task to finish leaves its slot to
    this one). Returns at once if the task did not secede.
    """
    running = current()
    if running is None:
        raise ValueError("rejoin() works only inside a task running on an hpcsched worker")
    if running.on_loop:
        return  # on the loop thread: it cannot have seceded (that moves it to a thread)
    running.worker.rejoin_task(running.key)
    _local.seceded = False


def seceded() -> bool:
    """Whether the current task has seceded (and not rejoined since)."""
    return current() is not None and bool(getattr(_local, "seceded", False))
