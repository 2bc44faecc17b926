"""Adaptive scaling: the scheduler decides when to grow and shrink, a cluster carries it out.

Three parts, each usable alone -- as in dask's adaptive deployments
(https://docs.dask.org/en/stable/adaptive.html), where the scheduler recommends and the
cluster object only starts and stops workers:

* :func:`snapshot_state` reads a :class:`~hpcsched.core.state.scheduler_state.SchedulerState`
  into a :class:`Snapshot` of plain dataclasses: workers (threads, memory, data held,
  tasks assigned) and *demand* -- tasks waiting to run, per TaskGroup, with their
  expected duration and their restrictions. The elements of a large ``Client.map`` (a
  bulk map, not tasks until they must be) count as tasks of their TaskGroup: queued,
  assigned to a worker, or results it holds. It runs on the scheduler's thread
  (``scheduler.call``) so the picture is consistent.
* :func:`recommend` is the policy, a pure function of a snapshot, a :class:`Policy`
  and the hysteresis counts of the previous call. It returns a
  :class:`Recommendation`: grow to a target, retire these workers, or nothing -- and
  why. Rules, in order:

  1. Never below ``minimum``, never above ``maximum``, always in whole units
     (``workers_per_unit``: a batch job runs ``processes`` workers).
  2. Grow by ``scale_factor`` (at least one unit) while tasks wait unclaimed -- the
     estimated backlog (ready tasks + tasks assigned beyond a worker's threads, times
     their TaskGroup's average duration, over all threads) exceeds
     ``target_duration`` -- or while stored data exceeds ``memory_high`` of the
     workers' memory limits. With no worker and tasks waiting: one unit. Never more
     workers than there are tasks to run (the memory rule aside).
  3. Workers requested but not yet connected (pending jobs) count as requested
     capacity: growth is measured from connected workers and only asks for what
     exceeds the requested total, so a slow queue does not trigger re-submission.
  4. Shrink by retiring idle units, least data first. Idle: nothing processing and no
     waiting task that could run there (restricted tasks, even those still waiting for
     their dependencies, keep the workers holding the resources they need). The
     survivors must hold all data below ``memory_high``, and a worker with data is
     never retired without a survivor to take it. Pending workers go first when
     capacity is idle. A unit is retired only after ``wait_count`` consecutive
     recommendations (hysteresis), so adaptive never loops submitting and cancelling.

* :class:`Adaptive` is the thread that, every ``interval``, takes a snapshot,
  applies the policy and calls ``cluster.scale_up(n, **self.get_scale_up_kwargs())``
  or ``cluster.scale_down(addresses)`` (plain functions or coroutines). Retirement is
  graceful: the scheduler's ``retire_workers`` copies results to surviving workers
  before a worker closes. Decisions are logged and kept in ``adaptive.log``.

Example::

    cluster = LocalCluster(n_workers=0)
    adaptive = cluster.adapt(minimum=0, maximum=4)
    ...
    for decision in adaptive.log:
        print(decision)
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any

from hpcsched.core import config
from hpcsched.core.settings import AdaptiveSettings
from hpcsched.core.units import parse_interval
from hpcsched.launchers.adaptive_policy import (
    Policy,
    Recommendation,
    Snapshot,
    recommend,
    snapshot_state,
)

logger = logging.getLogger("hpcsched.adaptive")


# ====================================================================== the thread
@dataclass(frozen=True)
class Decision:
    """One entry of ``Adaptive.log``."""

    time: float
    action: str
    target: int
    reason: str
    workers: tuple[str, ...] = ()
    error: str = ""
    kind: str = ""

    def __str__(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.time)) + \
            f".{int(self.time % 1 * 1000):03d}"
        text = f"{stamp} {self.action:<4} target={self.target}: {self.reason}"
        if self.workers:
            text += f" [{', '.join(self.workers)}]"
        if self.error:
            text += f" FAILED: {self.error}"
        return text


class Adaptive:
    """Grow and shrink ``cluster`` from ``scheduler``'s load, every ``interval`` seconds.

    ``cluster`` is anything with ``scale_up(n, **kwargs)`` and ``scale_down(workers)``
    (functions or coroutines). Optional: ``_requested()`` (workers asked for,
    connected or not), ``scale(n)`` (to drop pending workers), ``workers_per_unit``,
    ``unit_of(worker_name)`` or ``jobs`` (to retire whole jobs).

    Subclass and override :meth:`get_scale_up_kwargs` to pass, say, the largest memory
    restriction among waiting tasks (``self.last_snapshot.waiting_restrictions()``).
    """

    def __init__(self, scheduler: Any, cluster: Any, minimum: int = 0,
                 maximum: float = math.inf, interval: Any = None, wait_count: int | None = None,
                 target_duration: Any = None, scale_factor: float | None = None,
                 memory_high: float | None = None, history: int | None = None,
                 workers_per_unit: int | None = None, start: bool = True):
        for name in ("scale_up", "scale_down"):
            if not callable(getattr(cluster, name, None)):
                raise TypeError(f"Adaptive needs a cluster with {name}(); "
                                f"{type(cluster).__name__} has none")
        self.scheduler = scheduler
        self.cluster = cluster
        settings = config.read(AdaptiveSettings, interval=interval, wait_count=wait_count,
                               target_duration=target_duration, scale_factor=scale_factor,
                               memory_high=memory_high, history=history)
        self.interval = parse_interval(settings.interval)
        wpu = workers_per_unit if workers_per_unit is not None else \
            getattr(cluster, "workers_per_unit", 1)
        self.policy = Policy(
            minimum=minimum, maximum=maximum,
            target_duration=parse_interval(settings.target_duration, "target_duration"),
            scale_factor=float(settings.scale_factor),
            memory_high=float(settings.memory_high),
            wait_count=settings.wait_count,
            workers_per_unit=wpu)
        self.close_counts: dict[str, int] = {}
        self.log: collections.deque[Decision] = collections.deque(
            maxlen=int(settings.history))
        self.last_snapshot: Snapshot | None = None
        self.last_recommendation: Recommendation | None = None
        self._last_logged: tuple | None = None
        self._step_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop,
                                                           self.interval),
                                        name="hpcsched-adaptive", daemon=True)
        if start:
            self._thread.start()

    # ------------------------------------------------------------ bounds
    @property
    def minimum(self) -> int:
        """Fewest workers kept."""
        return self.policy.minimum

    @property
    def maximum(self) -> float:
        """Most workers run (``inf``: no bound)."""
        return self.policy.maximum

    @property
    def wait_count(self) -> int:
        """Consecutive recommendations to retire a worker before it is retired."""
        return self.policy.wait_count

    # ------------------------------------------------------------ hooks
    def get_scale_up_kwargs(self) -> dict:
        """Keyword arguments for ``cluster.scale_up``; subclasses add to them."""
        return {}

    def unit_of(self, worker_name: str) -> str:
        """The unit (batch job) a worker belongs to: workers of one unit retire together."""
        cluster = self.cluster
        fn = getattr(cluster, "unit_of", None)
        if callable(fn):
            return str(fn(worker_name) or "")
        if self.policy.workers_per_unit == 1:
            return ""
        for job in list(getattr(cluster, "jobs", {}).values()):
            owns = getattr(job, "owns_worker", None)
            if owns is not None and owns(worker_name):
                return f"job:{job.job_id}"
        return worker_name.rsplit("-", 1)[0]

    # ------------------------------------------------------------ one step
    def snapshot(self) -> Snapshot:
        """A consistent picture of the scheduler and of the workers the cluster asked for."""
        requested_fn = getattr(self.cluster, "_requested", None)
        requested = None
        if callable(requested_fn):
            try:
                requested = int(requested_fn())
            except NotImplementedError:
                requested = None
        snap = self.scheduler.call(lambda s: snapshot_state(s.state, requested, time.time()))
        # workers a replacement already covers retire by themselves: neither capacity to
        # count nor excess to retire (jobqueue/succession.py)
        leaving_fn = getattr(self.cluster, "leaving_workers", None)
        leaving = leaving_fn() if callable(leaving_fn) else ()
        if leaving:
            snap = replace(snap, workers=tuple(w for w in snap.workers
                                               if w.name not in leaving))
        if self.policy.workers_per_unit > 1 or callable(getattr(self.cluster, "unit_of", None)):
            snap = replace(snap, workers=tuple(replace(w, unit=self.unit_of(w.name))
                                               for w in snap.workers))
        return snap

    def recommendations(self, snap: Snapshot | None = None) -> Recommendation:
        """What the policy recommends now (does not act or change hysteresis counts)."""
        return recommend(snap or self.snapshot(), self.policy, self.close_counts)

    def adapt(self) -> Recommendation:
        """One step: snapshot, policy, act, record. The thread calls this every interval."""
        with self._step_lock:
            snap = self.snapshot()
            rec = recommend(snap, self.policy, self.close_counts)
            self.last_snapshot, self.last_recommendation = snap, rec
            if self._stop.is_set():
                return rec
            self.close_counts = dict(rec.close_counts)
            error = ""
            try:
                if rec.action == "up":
                    self._call(self.cluster.scale_up, rec.target, **self.get_scale_up_kwargs())
                elif rec.action == "down":
                    if rec.retire:
                        self._call(self.cluster.scale_down, list(rec.retire))
                    scale = getattr(self.cluster, "scale", None)
                    if rec.cancel_pending and callable(scale):
                        self._call(scale, rec.target)
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                logger.exception("adaptive: %s to %d workers failed", rec.action, rec.target)
            self._record(rec, snap, error)
            return rec

    @staticmethod
    def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            async def wait() -> Any:
                return await result

            result = asyncio.run(wait())
        return result

    def _record(self, rec: Recommendation, snap: Snapshot, error: str) -> None:
        signature = (rec.action, rec.kind, rec.target, rec.retire)
        if rec.action in ("none", "up") and signature == self._last_logged and not error:
            # the same no-op as last time, or the same growth the cluster could not carry
            # out yet (its submissions back off): keep the history and the events telling
            return
        self._last_logged = signature
        d = Decision(snap.now or time.time(), rec.action, rec.target, rec.reason, rec.retire,
                     error, rec.kind)
        self.log.append(d)
        level = logging.INFO if rec.action != "none" or error else logging.DEBUG
        logger.log(level, "adaptive %s", d)
        if level == logging.INFO:
            # the scheduler's recent events (dashboard, performance reports) show decisions
            # too; the scheduler runs in this process for every cluster that adapts
            recorder = getattr(getattr(self.scheduler, "state", None), "recorder", None)
            if recorder is not None:
                recorder.event("adaptive", str(d), d.time)  # a deque append: thread-safe

    # ------------------------------------------------------------ lifecycle
    def stop(self, timeout: float = 10.0) -> None:
        """Stop adapting (the workers stay as they are); joins the thread."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("adaptive thread still busy after %g s (a scale call is "
                               "running); it ends after that call", timeout)

    @property
    def running(self) -> bool:
        """Whether the adaptive thread is still deciding (false after :meth:`stop`)."""
        return self._thread.is_alive() and not self._stop.is_set()

    def __repr__(self) -> str:
        return (f"<Adaptive minimum={self.minimum} maximum={self.maximum:g} "
                f"interval={self.interval:g}s {'running' if self.running else 'stopped'}>")


def _run(ref: weakref.ref, stop: threading.Event, interval: float) -> None:
    """The adaptive thread.

    It holds its Adaptive weakly, so that an abandoned cluster can be collected (and its
    jobs cancelled by its finalizer).
    """
    while not stop.is_set():
        adaptive = ref()
        if adaptive is None:
            return
        try:
            adaptive.adapt()
        except Exception as e:
            if stop.is_set():
                return
            if getattr(adaptive.cluster, "_closed", False):
                logger.debug("adaptive: cluster closed (%s); stopping", e)
                return
            logger.exception("adaptive step failed")
        del adaptive
        if stop.wait(interval):
            return
