"""A worker's running tasks: where each runs, running it, and seceded tasks.

The state machine says which task to start (an ``Execute`` command); :class:`TaskRunner`
decides where: on a task thread of its :class:`~hpcsched.core.worker.task_pool.TaskPool`,
or, for a task of a group known to take well under :data:`INLINE_TASK` seconds, on the
loop's thread itself, whose result is handled at once (a thread hand-off each way would
cost more than the task). A task that must not run there (it asks for a client, or
secedes: :class:`~hpcsched.core.worker.context.TaskNeedsThread`) runs again on a thread,
as every task of its group does from then on. A gang member (a task holding many slots)
waits for the others in a collective, so it never runs on the loop.

Each run marks its thread with the task (:mod:`hpcsched.core.worker.context`) and puts
its result, an ``ExecuteSuccess`` or ``ExecuteFailure`` with a ``stimulus_id`` of its
own, on the loop. A seceded task that rejoins waits here for the state machine's
``Resume``.

What a run used travels with its result when the scheduler asked for it at
registration (it keeps a task history; :meth:`TaskRunner.want_usage`; else a result
carries neither figure, no clock or peak is read, and the scheduler has nothing more to
read): CPU seconds from ``time.thread_time()`` read around the call, on the task's own
thread, and as its peak memory the worker process's peak RSS from the task's start to
its end (:class:`~hpcsched.core.worker.memory.PeakMemory`: reset as the task starts, read
as it ends). With one task thread that is the task's own peak, the worker's own memory
included; threads share one address space, so with several it is the worker's peak
since the latest task start, never less than its RSS at the task's end. A task shorter
than :data:`PEAK_READ_AFTER`, one run on the loop's thread (neither reset nor read), or
where the peak cannot be read, reports the worker's RSS as the memory monitor last
sampled it (``rss()``): reading the peak costs several microseconds, a task that short
cannot fault in much memory, and no-op tasks are where a few microseconds count. A
command task runs its program in a child process and reports that process's own user +
system time and maximum RSS instead (:func:`~hpcsched.core.worker.context.report_usage`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from time import thread_time
from typing import Any

from hpcsched.core.comm.loop import Loop
from hpcsched.core.graph.dsk import key_split
from hpcsched.core.protocol.serialize import sizeof
from hpcsched.core.state import events as ev
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.worker.context import (
    TaskNeedsThread,
    TaskWorker,
    enter_task,
    leave_task,
    take_usage,
)
from hpcsched.core.worker.execution import load_call, pack_exception
from hpcsched.core.worker.memory import PEAK
from hpcsched.core.worker.parts.inbox import stimulus
from hpcsched.core.worker.task_pool import TaskPool
from hpcsched.core.worker.tasks import output

logger = logging.getLogger("hpcsched.worker")

INLINE_TASK = 0.0005  # seconds: tasks of a group averaging less run on the loop thread
PEAK_READ_AFTER = 0.001  # seconds: a shorter task's memory is the worker's last RSS sample


class TaskRunner:
    """The tasks of ``worker`` (what its tasks see of it, :class:`~hpcsched.core.worker.
    context.TaskWorker`): run on ``nthreads`` task threads (more while tasks have seceded),
    results put on ``loop``; ``after_flush((function, *args))`` starts a task that announces
    its start once the loop's batch left; ``closed``: set when the worker closes;
    ``on_gang(True)`` when a gang member starts running here and none was,
    ``on_gang(False)`` when the last one ends; ``rss()``: the worker's RSS in bytes as
    last sampled, each task's memory in its report."""

    def __init__(
        self,
        worker: TaskWorker,
        nthreads: int,
        loop: Loop,
        after_flush: Callable[[tuple], None],
        closed: threading.Event,
        on_gang: Callable[[bool], None] | None = None,
        rss: Callable[[], int] | None = None,
    ):
        self.worker = worker
        self.loop = loop
        output.install()  # what tasks print is kept with them (and forwarded if asked)
        #: the task threads (the ranges of bulk maps run on them too)
        self.executor = TaskPool(nthreads, "hpcsched-task")
        self._after_flush = after_flush
        self._closed = closed
        self._state: WorkerState | None = None
        self._resume: dict[Any, threading.Event] = {}  # seceded tasks waiting to rejoin
        # task groups that must not run on the loop thread: one of theirs asked for a client
        self._threaded_groups: set[str] = set()
        self._on_gang = on_gang
        self._rss = rss
        #: each run's CPU seconds and peak memory go with its result (:meth:`want_usage`)
        self.usage_wanted = False
        self._gang_lock = threading.Lock()
        self._gang_members = 0  # gang members running on this worker's threads

    def want_usage(self, wanted: bool) -> None:
        """Whether each run's CPU seconds and peak memory go with its result, as the
        scheduler's answer to the worker's registration says (its ranges' reports too)."""
        self.usage_wanted = wanted

    def use(self, state: WorkerState) -> None:
        """Tasks read their dependencies from ``state``'s data, and their group's duration."""
        self._state = state

    # ---------------------------------------------------------------- on the loop
    def place(self, cmd: ev.Execute) -> bool:
        """Start ``cmd``'s task on a thread; True: it is short, run it here
        (:meth:`run_inline`) once the other commands are carried out."""
        state = self._state
        assert state is not None
        ts = state.tasks.get(cmd.key)
        if (
            ts is not None
            and ts.duration < INLINE_TASK
            and not cmd.gang
            and not (self._threaded_groups and key_split(cmd.key) in self._threaded_groups)
        ):
            return True
        if cmd.announced:
            self._after_flush(
                (self.executor.submit, self._execute, cmd.key, cmd.run_spec, cmd.gang,
                 cmd.devices, cmd.lease)
            )
        else:
            self.executor.submit(self._execute, cmd.key, cmd.run_spec, cmd.gang, cmd.devices,
                                 cmd.lease)
        return False

    def run_inline(self, cmd: ev.Execute) -> Any:
        """Run ``cmd``'s task on the loop thread: its result event, or None if it needs a
        thread (then it, and its group from now on, runs on one)."""
        result = self._run(cmd.key, cmd.run_spec, on_loop=True, devices=cmd.devices)
        if result is None:
            self._threaded_groups.add(key_split(cmd.key))
            self.executor.submit(self._execute, cmd.key, cmd.run_spec, (), cmd.devices)
        return result

    def resume(self, key: Any) -> None:
        """The seceded task ``key`` has a slot again (a ``Resume`` command)."""
        event = self._resume.pop(key, None)
        if event is not None:
            event.set()

    # ---------------------------------------------------------------- on task threads
    def _execute(self, key: Any, run_spec: Any, gang: tuple = (),
                 devices: dict | None = None, lease: Any = None) -> None:
        """In a task thread: run the task, hand the result to the loop."""
        self.loop.put(self._run(key, run_spec, gang=gang, devices=devices, lease=lease))

    def _run(self, key: Any, run_spec: Any, on_loop: bool = False, gang: tuple = (),
             devices: dict | None = None, lease: Any = None) -> Any:
        """Run a task; its ExecuteSuccess / ExecuteFailure, or None if it ran on the loop
        thread and needs a task thread instead (see :mod:`~hpcsched.core.worker.context`).
        ``gang``: the members' addresses of a task holding many slots (``lease``: what
        they share, :class:`~hpcsched.core.state.events.GangLease`); ``devices``: the ids
        of the devices it holds."""
        start = time.time()
        state = self._state
        assert state is not None
        if gang:
            self._gang_running(1)
        outer = enter_task(self.worker, key, on_loop, start, gang, devices, lease)
        cpu = 0.0
        try:
            call = load_call(run_spec, state.data)
            start = time.time()  # the run, not the unpickling (execution.py)
            if self.usage_wanted:
                if not on_loop:  # a task of a group averaging well under PEAK_READ_AFTER
                    PEAK.reset()
                cpu = thread_time()
            value = call()
        except BaseException as e:  # noqa: BLE001 - reported to the scheduler
            if on_loop and type(e) is TaskNeedsThread:
                take_usage()
                return None
            stop = time.time()
            cpu, memory = self._usage(cpu, start, on_loop)
            packed, tb_text, text = pack_exception(e, e.__traceback__)
            logger.warning("task %r failed: %s", key, text)  # as dask's "Compute Failed"
            return ev.ExecuteFailure(
                key,
                packed,
                tb_text,
                text,
                start,
                stop,
                cpu,
                memory,
                now=stop,
                stimulus_id=stimulus("execute-failure"),
            )
        finally:
            leave_task(outer)
            if gang:
                self._gang_running(-1)
        stop = time.time()
        cpu, memory = self._usage(cpu, start, on_loop)
        try:
            nbytes = sizeof(value)
        except Exception:
            nbytes = 64
        return ev.ExecuteSuccess(
            key, value, nbytes, type(value).__name__, start, stop, stop,
            stimulus("execute-success"), cpu, memory,
        )

    def _usage(self, cpu_start: float, start: float, on_loop: bool) -> tuple[float, int]:
        """(CPU seconds, peak memory) of the run that began at thread time ``cpu_start``
        (0.0: it never began, or none is wanted: (0.0, 0), which the report leaves out) and
        wall time ``start``, on the loop's thread or not."""
        usage = take_usage()  # taken either way: the next run on this thread starts afresh
        if not self.usage_wanted:
            return 0.0, 0
        if usage is not None:  # a command: its process's own
            return usage
        cpu = thread_time() - cpu_start if cpu_start else 0.0
        # a task this short cannot have raised the worker's memory much above its last
        # sample (each page it touched is a fault of its thread): no read of the peak
        timed = cpu_start and not on_loop and time.time() - start >= PEAK_READ_AFTER
        peak = PEAK.peak() if timed else 0
        return cpu, peak or (self._rss() if self._rss is not None else 0)

    def _gang_running(self, delta: int) -> None:
        with self._gang_lock:
            before = self._gang_members
            self._gang_members += delta
            now = self._gang_members
        if self._on_gang is not None and (before == 0) != (now == 0):
            self._on_gang(now > 0)

    def secede(self, key: Any, compute_duration: float) -> None:
        """The task ``key`` (on the calling thread) leaves the pool."""
        self.loop.put(
            ev.Secede(key, compute_duration, now=time.time(), stimulus_id=stimulus("secede"))
        )

    def rejoin(self, key: Any) -> None:
        """Block until the seceded task ``key`` has a thread slot again (or the worker
        closes)."""
        event = self._resume[key] = threading.Event()
        self.loop.put(ev.Rejoin(key, now=time.time(), stimulus_id=stimulus("rejoin")))
        while not event.wait(1.0):
            if self._closed.is_set():
                break
        self._resume.pop(key, None)

    def close(self) -> None:
        """Start no more tasks; seceded tasks waiting to rejoin go on."""
        self.executor.shutdown()
        for event in list(self._resume.values()):
            event.set()
