"""Tasks that submit tasks.

``get_worker``, ``get_client``, ``worker_client``, ``secede``, ``rejoin``, with
dask.distributed's names and meaning ("Launch Tasks from Tasks" in its
documentation)::

    from hpcsched import Client, worker_client

    def fib(n):
        if n < 2:
            return n
        with worker_client() as client:      # gives this task's thread back meanwhile
            a, b = client.submit(fib, n - 1), client.submit(fib, n - 2)
            return a.result() + b.result()

    with Client() as client:
        print(client.submit(fib, 10).result())

Inside a task, :func:`get_client` returns the client of the worker running it,
connected to that worker's scheduler with the worker's credentials (over TCP,
``inproc://`` or MPI alike); one per worker, made on first use, reused by every
task, closed with the worker. ``Client()`` without an address inside a task
connects to the same scheduler (a new client the caller owns).

A task waiting on tasks it submitted holds a thread slot of its worker; on a
worker with one thread, that wait would never end. :func:`secede` gives the
slot back (the worker starts the next task on another thread, and the
scheduler counts the task out of the worker's slots); :func:`rejoin` waits for
a slot again. ``worker_client()`` does both around its block.

The worker runs tasks known to take well under a millisecond on its event
loop's thread. Such a task must never block there: a call here that would
(making a client, seceding) stops it with :class:`TaskNeedsThread`, and the
worker runs the task again from the start on a task thread, as it does from
then on for every task of its group. Work a task does before its first call
here may thus run twice; call these first.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcsched.core.client.client import Client
    from hpcsched.core.comm.base import Security
    from hpcsched.core.worker.server import Worker


class TaskNeedsThread(BaseException):
    """Raised inside a task running on the worker's event loop that must not block it.

    A BaseException, so that a task's ``except Exception`` lets it through to the
    worker, which runs the task again on a task thread.
    """


_local = threading.local()  # .task: (worker, key, start time, on the loop thread?) or None


# ---------------------------------------------------------------- for the worker
def enter_task(worker: Worker, key: Any, on_loop: bool, start: float) -> Any:
    """Mark this thread as running ``key`` for ``worker`` since ``start``.

    Returns what to pass to :func:`leave_task`. (A tuple: this runs for every task, tiny
    ones included.)
    """
    previous = getattr(_local, "task", None)
    _local.task = (worker, key, start, on_loop)
    _local.seceded = False
    return previous


_dask_hooked = [False]


def hook_dask() -> None:
    """Have dask's ``.compute()`` inside tasks run on the cluster, once dask is loaded.

    Once dask is loaded in a worker's process (a task's function came from it),
    ``.compute()`` inside tasks goes through the worker's client, unless the process
    chose a dask scheduler itself. Called per task: cheap once done.
    """
    if _dask_hooked[0] or "dask.config" not in sys.modules:
        return
    import dask.config

    from hpcsched.core.client.collections import become_dask_scheduler

    _dask_hooked[0] = True
    if dask.config.get("scheduler", None) is None:
        become_dask_scheduler(None)


def in_task() -> bool:
    """Whether this thread is running a task of an hpcsched worker."""
    return getattr(_local, "task", None) is not None


def leave_task(previous: Any) -> None:
    """The task this thread ran is over: back to ``previous`` (from :func:`enter_task`)."""
    _local.task = previous


def _current() -> tuple[Worker, Any, float, bool] | None:
    return getattr(_local, "task", None)


def _off_loop(running: tuple, what: str) -> None:
    if running[3]:
        raise TaskNeedsThread(f"{what} inside task {running[1]!r} on the worker's loop thread")


def task_scheduler() -> tuple[str, Security | None] | None:
    """Inside a task: (address, security) of its worker's scheduler; else None.

    What ``Client()`` without an address connects to inside a task.
    """
    running = _current()
    if running is None:
        return None
    _off_loop(running, "connecting a client")
    return running[0].scheduler_address, running[0].security


# ---------------------------------------------------------------- public API
def get_worker() -> Worker:
    """The worker running the current task.

    Raises ``ValueError`` outside a task.
    """
    running = _current()
    if running is None:
        raise ValueError("No worker found: get_worker() works only inside a task running on "
                         "an hpcsched worker")
    return running[0]


def get_client(address: str | None = None, timeout: float | None = None) -> Client:
    """A client connected to the scheduler of the cluster this task runs on.

    Inside a task: the worker's own client (made on first use, then shared by
    every task of the worker). Outside a task: the default client (the last
    one created with ``set_as_default=True``), or a new client for ``address``.
    Raises ``ValueError`` when there is none and no address.

    A task that then waits for the futures it submits should :func:`secede`
    first (or use :func:`worker_client`), or it may wait forever for a thread
    slot it holds itself.
    """
    running = _current()
    if running is not None and (address is None or address == running[0].scheduler_address):
        _off_loop(running, "get_client()")
        return running[0].get_client(timeout=timeout)
    from hpcsched.core.client import client as client_mod

    default = client_mod.default_client()
    if default is not None and (address is None or address == default.scheduler_address):
        return default
    if address is not None:
        return client_mod.Client(address, timeout=timeout)
    raise ValueError("No global client found and no address provided: create a Client "
                     "first, or call get_client() inside a task")


def secede() -> None:
    """Have the current task leave its worker's thread pool.

    The worker may start another task on a new thread while this one goes on
    (typically waiting for tasks it submitted), and the scheduler no longer
    counts it among the worker's busy slots. See :func:`rejoin`.
    """
    running = _current()
    if running is None:
        raise ValueError("secede() works only inside a task running on an hpcsched worker")
    _off_loop(running, "secede()")
    worker, key, start, _ = running
    worker.secede_task(key, time.time() - start)  # a second call changes nothing
    _local.seceded = True


def rejoin() -> None:
    """Have the current (seceded) task take a thread slot of its worker again.

    Blocks until a slot is free (the next task to finish leaves its slot to
    this one). Returns at once if the task did not secede.
    """
    running = _current()
    if running is None:
        raise ValueError("rejoin() works only inside a task running on an hpcsched worker")
    if running[3]:
        return  # on the loop thread: it cannot have seceded (that moves it to a thread)
    running[0].rejoin_task(running[1])
    _local.seceded = False


def seceded() -> bool:
    """Whether the current task has seceded (and not rejoined since)."""
    return _current() is not None and bool(getattr(_local, "seceded", False))


@contextlib.contextmanager
def worker_client(timeout: float | None = None, separate_thread: bool = True
                  ) -> Iterator[Client]:
    """The worker's client for the block, with the task seceded meanwhile.

    ``separate_thread=False`` keeps the task in the thread pool (it may then
    deadlock a worker whose every thread waits so). Example::

        def total(parts):
            with worker_client() as client:
                futures = client.map(load, parts)
                return sum(client.gather(futures))
    """
    client = get_client(timeout=timeout)
    if separate_thread:
        secede()
    try:
        yield client
    finally:
        if separate_thread:
            rejoin()
