"""When a batch cluster may submit again after its submissions fail: a pure schedule.

A cluster that adapts asks for jobs every second. When ``sbatch`` fails (a partition
that does not exist, an account without hours, a job over the partition's limits) or
the jobs die before a worker connects (a broken environment in the job script),
asking again every second floods the batch system and the user's log and helps
nobody. So, as HyperQueue's automatic allocator does (it waits 60 s, 15 min, 30 min
and pauses a queue after 10 failed submissions or 3 allocations that fail to start,
https://it4innovations.github.io/hyperqueue/stable/deployment/allocation/):

* after the n-th failure in a row -- a submission that fails, or a job that ends
  before any of its workers connected -- the next submission waits ``delays[n-1]``
  seconds (the last delay repeats);
* after ``pause_after_failures`` failed submissions or ``pause_after_dead_jobs`` dead
  jobs in a row the cluster stops submitting on its own: only the user's
  ``cluster.scale(...)`` or ``cluster.adapt(...)`` (:meth:`SubmissionBackoff.reset`)
  tries again;
* a submission that succeeds ends the run of failed submissions, a worker that
  connects ends the run of dead jobs: the cluster submits as usual again.

The schedule is a plain object with the time passed in, so tests check it with a
fake clock; ``jobqueue.submit-retry-delays``, ``jobqueue.submit-pause-after`` and
``jobqueue.dead-jobs-pause-after`` configure it.

    >>> b = SubmissionBackoff(delays=(60.0, 900.0))
    >>> b.failed(now=0.0, error="sbatch: error: invalid partition specified: nosuch")
    >>> b.may_submit(30.0), b.may_submit(60.0)
    (False, True)
    >>> b.failed(now=60.0, error="sbatch: error: invalid partition specified: nosuch")
    >>> b.not_before
    960.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpcsched.core import config
from hpcsched.core.settings import JobQueueSettings
from hpcsched.core.units import parse_interval


@dataclass
class SubmissionBackoff:
    """The state of a cluster's failing submissions (see the module docstring)."""

    delays: tuple[float, ...] = (60.0, 900.0, 1800.0)
    pause_after_failures: int = 10
    pause_after_dead_jobs: int = 3
    failures: int = 0  # failed submissions in a row
    dead_jobs: int = 0  # jobs in a row that ended before any worker connected
    not_before: float = 0.0  # no submission before this time
    last_error: str = ""
    last_error_time: float | None = None
    history: list[tuple[float, str]] = field(default_factory=list)  # (time, "ok"/"failed"/...)

    def __post_init__(self) -> None:
        if not self.delays or any(d < 0 for d in self.delays):
            raise ValueError(f"submit retry delays must be non-negative seconds, at least "
                             f"one: {self.delays!r}")
        for name in ("pause_after_failures", "pause_after_dead_jobs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")

    @classmethod
    def from_config(cls) -> SubmissionBackoff:
        """The schedule the configuration sets (``jobqueue.submit-*``)."""
        settings = config.read(JobQueueSettings)
        raw: Any = settings.submit_retry_delays
        items = raw.split(",") if isinstance(raw, str) else list(raw)
        delays = tuple(parse_interval(d.strip() if isinstance(d, str) else d,
                                      "jobqueue.submit-retry-delays") for d in items)
        return cls(delays=delays,
                   pause_after_failures=int(settings.submit_pause_after),
                   pause_after_dead_jobs=int(settings.dead_jobs_pause_after))

    @property
    def paused(self) -> bool:
        """Too many failures in a row: nothing is submitted until :meth:`reset`."""
        return (self.failures >= self.pause_after_failures
                or self.dead_jobs >= self.pause_after_dead_jobs)

    @property
    def failing(self) -> bool:
        """Whether the last submissions or jobs failed (a delay or a pause is in force)."""
        return bool(self.failures or self.dead_jobs)

    def delay(self, n: int) -> float:
        """Seconds to wait after the ``n``-th failure in a row (n >= 1)."""
        return self.delays[min(n, len(self.delays)) - 1]

    def may_submit(self, now: float) -> bool:
        return not self.paused and now >= self.not_before

    def _failure(self, now: float, kind: str, error: str) -> None:
        self.last_error, self.last_error_time = error, now
        self.not_before = now + self.delay(self.failures + self.dead_jobs)
        self.history.append((now, kind))

    def failed(self, now: float, error: str) -> None:
        """A submission failed with ``error`` (the batch command's message)."""
        self.failures += 1
        self._failure(now, "failed", error)

    def job_died(self, now: float, error: str) -> None:
        """A job ended before any of its workers connected (``error`` says how)."""
        self.dead_jobs += 1
        self._failure(now, "died", error)

    def submitted(self, now: float) -> None:
        """A submission succeeded: the run of failed submissions is over."""
        self.failures = 0
        if not self.dead_jobs:
            self.not_before = 0.0
        self.history.append((now, "ok"))

    def worker_connected(self) -> None:
        """A worker of this cluster connected: jobs start as they should."""
        self.dead_jobs = 0
        if not self.failures:
            self.not_before = 0.0

    def reset(self, now: float = 0.0) -> str:
        """The user asked again (``scale``, ``adapt``): try at once. Returns what was
        failing (:meth:`describe`), "" when nothing was."""
        was = self.describe(now)
        self.failures = self.dead_jobs = 0
        self.not_before = 0.0
        return was

    def describe(self, now: float) -> str:
        """One line for a repr: empty when nothing failed."""
        if not self.failing:
            return ""
        what = []
        if self.failures:
            what.append(f"{self.failures} failed submission{'s' * (self.failures > 1)}")
        if self.dead_jobs:
            what.append(f"{self.dead_jobs} job{'s' * (self.dead_jobs > 1)} ended before a "
                        "worker connected")
        if self.paused:
            when = "submissions paused: call scale() or adapt() to try again"
        else:
            when = f"next submission in {max(0.0, self.not_before - now):.0f} s"
        error = self.last_error.strip().splitlines()
        return f"{' and '.join(what)} in a row ({when}); last error: " + \
            (error[-1] if error else "?")
