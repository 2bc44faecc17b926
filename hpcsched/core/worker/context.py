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
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from hpcsched.core import seams
from hpcsched.core.comm.base import Security
from hpcsched.core.worker.tasks.gpus import Gpus


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
    gpus: Gpus | None

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
    on the worker's loop thread, (a task holding many slots) its members' addresses and
    what they share (:class:`~hpcsched.core.state.events.GangLease`), and the ids of the
    devices it holds, by resource (``{"GPU": ("1",)}``)."""

    worker: TaskWorker
    key: Any
    start: float
    on_loop: bool
    gang: tuple = ()
    devices: dict | None = None
    lease: Any = None


_local = threading.local()  # .task: Running or None; .seceded: bool; .cleanups: list
_running = tuple.__new__  # Running without its __new__'s call: this runs for every task


# ---------------------------------------------------------------- for the worker
def enter_task(worker: TaskWorker, key: Any, on_loop: bool, start: float,
               gang: tuple = (), devices: dict | None = None,
               lease: Any = None) -> Running | None:
    """Mark this thread as running ``key`` for ``worker`` since ``start`` (``gang``: as a
    member of a task holding many slots, every member's address in order; ``lease``:
    what they share, which also sets the task's MPI launcher environment; ``devices``:
    the ids of the devices it holds).

    Returns what to pass to :func:`leave_task`.
    """
    previous = getattr(_local, "task", None)
    _local.task = _running(Running, (worker, key, start, on_loop, gang, devices, lease))
    _local.seceded = False
    if lease is not None:  # its launcher's environment, undone when it ends
        seams.resolve("gang-environment")(gang, lease)
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


def report_usage(cpu: float, memory: int) -> None:
    """The current task ran its work in a child process that used ``cpu`` seconds (user +
    system) and ``memory`` bytes at its peak (a command task, from ``os.wait4``'s
    resource usage): what its report carries, instead of the worker thread's own CPU time
    and the worker's RSS. Several children (the elements of a bulk map's report) add
    their CPU time, and the largest peak counts."""
    usage = getattr(_local, "usage", None)
    if usage is not None:
        cpu, memory = cpu + usage[0], max(memory, usage[1])
    _local.usage = (cpu, memory)


def take_usage() -> tuple[float, int] | None:
    """What :func:`report_usage` said on this thread since the last call, then forget it
    (the runner of a task takes it when the task ends, a bulk map's range per report)."""
    usage = getattr(_local, "usage", None)
    if usage is not None:
        _local.usage = None
    return usage


def at_task_end(cleanup: Callable[[], Any]) -> None:
    """Call ``cleanup`` on this thread once the current task ends (freeing what the task
    made for itself alone, such as a gang's communicator)."""
    if not hasattr(_local, "cleanups"):
        _local.cleanups = []
    _local.cleanups.append(cleanup)


_interrupts: dict[Any, Callable[[], Any]] = {}  # running task's key -> what stops it


def on_interrupt(stop: Callable[[], Any]) -> None:
    """Inside a task: call ``stop()`` (from the worker's loop thread: it must not block)
    if the task's result stops being wanted while it runs (cancelled, released), until
    the task ends. A command task kills its program's process group so."""
    running = current()
    if running is None:
        return
    key = running.key
    _interrupts[key] = stop
    at_task_end(lambda: _interrupts.pop(key, None))


def still_wanted() -> bool:
    """Inside a task: False once its result is no longer wanted (its key was released or
    cancelled while it waited for a thread or ran). Call :func:`on_interrupt` first: then
    a release either shows here or reaches the callback."""
    running = current()
    if running is None:
        return True
    state = getattr(running.worker, "state", None)
    ts = None if state is None else state.tasks.get(running.key)
    return ts is None or not ts.release_after


def interrupt(keys: Any) -> None:
    """For the worker: the results of ``keys`` are no longer wanted; stop those of them
    running that asked to be told (:func:`on_interrupt`)."""
    if not _interrupts:
        return
    for key in keys:
        stop = _interrupts.pop(key, None)
        if stop is not None:
            try:
                stop()
            except Exception:  # noqa: BLE001 - the task's own outcome is what counts
                pass


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


def get_task_gpus() -> list[str]:
    """The ids of the GPUs the current task holds (``resources={"GPU": k}``: ``k`` of them,
    no other task's), in the worker's order; ``[]`` for a task that asked for none.

    Code in the task uses these devices alone; a library in this process numbers them
    ``get_worker().gpus.ordinal(id)``, a program the task starts sees them alone when
    started with :func:`task_env`. Raises ``ValueError`` outside a task.
    """
    running = current()
    if running is None:
        raise ValueError("get_task_gpus() works only inside a task running on an hpcsched "
                         "worker")
    return list((running.devices or {}).get("GPU", ()))


def task_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to start a program with from inside a task, so that it sees the
    task's devices alone: ``subprocess.run(cmd, env=hpcsched.task_env())``.

    ``environ`` (default ``os.environ``) with the vendor's variable
    (``CUDA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES``, ``ZE_AFFINITY_MASK``: the one the
    worker found its GPUs by) set to the task's GPUs; a task that holds none on a worker
    with GPUs is shown none. The process's own environment is left alone: it is every
    running task's.
    """
    import os

    running = current()
    if running is None:
        raise ValueError("task_env() works only inside a task running on an hpcsched worker")
    env = dict(os.environ if environ is None else environ)
    gpus = running.worker.gpus
    if gpus is not None:
        env.update(gpus.env(tuple((running.devices or {}).get("GPU", ()))))
    return env


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
