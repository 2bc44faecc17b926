"""The next allocation ready in time: when to submit the replacement of a batch job.

A job's workers retire before its walltime (``--lifetime``, :func:`worker_lifetime`);
a replacement submitted only then waits in the queue while the campaign runs on fewer
workers, or on none (HyperQueue's automatic allocation and Parsl's block providers have
the same problem: https://github.com/It4innovations/hyperqueue/issues/1019). So the
cluster submits the replacement of a job *ahead* of its workers' retirement, by the time
the queue takes to start a job:

* the **wait** is measured: from a job's submission to its first worker connecting (the
  queue's wait plus the worker's start), the longest of the last few jobs; a job still
  waiting counts with its age so far, so the first jobs' replacements are not late when
  the queue is slower than a job's life;
* the **lead** is that wait plus a slack (polls and the worker's start vary), never more
  than ``jobqueue.replace-ahead-max``;
* a job is **due** for replacement once ``now >= start + life - lead``, where ``start``
  is when its first worker connected (or, still waiting, when it is expected to) and
  ``life`` the time its workers have until the earliest of them retires. A queue slower
  than a job's life thus has replacements of jobs that have not started yet: a campaign
  through a busy queue keeps a generation queued behind the one running.
* Each job has at most one replacement, and the jobs not yet connected are at most
  ``target * (1 + ceil(max_lead / life))``: a queue that starts nothing does not fill
  up with replacements.

Pure: no clock, thread or batch command (:meth:`Succession.for_jobs` reads the
settings once). :meth:`JobBook.replace_ahead <hpcsched.jobqueue.book.JobBook.replace_ahead>`
applies :meth:`Succession.due` to its jobs; the cluster passes the time in.

>>> policy = Succession(life=40.0, slack=10.0, max_lead=3600.0)
>>> policy.due(now=25.0, submitted=0.0, connected=5.0, wait=5.0)   # 5 + 40 - 15 = 30
False
>>> policy.due(now=30.0, submitted=0.0, connected=5.0, wait=5.0)
True
>>> policy.due(now=31.0, submitted=0.0, connected=None, wait=80.0)  # waits longer than it lives
True
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hpcsched.core import config
from hpcsched.core.settings import JobQueueSettings, WorkerSettings
from hpcsched.core.units import parse_interval
from hpcsched.jobqueue.job import worker_lifetime

#: the measured waits kept: the estimate follows the queue as it gets busier or quieter
WAIT_SAMPLES = 8


class QueueWait:
    """The queue's measured wait: submission to first worker connected, in seconds.

    >>> w = QueueWait()
    >>> w.estimate(pending_ages=[]) is None
    True
    >>> w.observe(30.0); w.observe(80.0)
    >>> w.estimate(pending_ages=[12.0]), w.estimate(pending_ages=[95.0])
    (80.0, 95.0)
    """

    def __init__(self, samples: int = WAIT_SAMPLES) -> None:
        self.samples: collections.deque[float] = collections.deque(maxlen=samples)

    def observe(self, seconds: float) -> None:
        self.samples.append(max(0.0, float(seconds)))

    def estimate(self, pending_ages: Iterable[float]) -> float | None:
        """The longest recent wait, or a job's wait so far if longer; None: nothing known."""
        known = [*self.samples, *pending_ages]
        return max(known) if known else None


@dataclass(frozen=True)
class Succession:
    """When a job's replacement is due; ``life``: seconds from a job's first worker
    connecting to the earliest retirement of its workers."""

    life: float
    slack: float
    max_lead: float

    @classmethod
    def for_jobs(cls, walltime: int | None, extra_args: Sequence[str]) -> Succession | None:
        """The rule for jobs of ``walltime`` seconds whose workers take ``extra_args``;
        None when their end is unknown or ``jobqueue.replace-ahead-max`` is 0."""
        queue = config.read(JobQueueSettings)
        if not walltime or not queue.replace_ahead_max:
            return None
        worker = config.read(WorkerSettings)
        lifetime, stagger = worker_lifetime(walltime, worker.walltime_margin,
                                            worker.walltime_stagger)
        # polls and a worker's start vary: a few polls and seconds more than the wait
        slack = 2 * queue.poll_interval + 5.0
        return cls(worker_life(lifetime, stagger, extra_args), slack, queue.replace_ahead_max)

    def lead(self, wait: float) -> float:
        return min(wait + self.slack, self.max_lead)

    def due(self, now: float, submitted: float, connected: float | None, wait: float) -> bool:
        """Whether the replacement of a job submitted at ``submitted`` (its first worker
        connected at ``connected``, None: not yet) should be submitted at ``now``."""
        start = connected if connected is not None else max(now, submitted + wait)
        return now >= start + self.life - self.lead(wait)

    def max_unconnected(self, target: int) -> int:
        """Jobs not yet connected that the cluster may hold for ``target`` jobs."""
        return target * (1 + math.ceil(self.max_lead / max(self.life, 1.0)))


def worker_life(lifetime: float, stagger: float, extra_args: Sequence[str]) -> float:
    """Seconds a job's workers have before the earliest of them retires: ``lifetime -
    stagger``, or what ``--lifetime`` / ``--lifetime-stagger`` among the workers' own
    arguments say (the last one wins, as on a command line).

    >>> worker_life(45, 7, [])
    38.0
    >>> worker_life(45, 7, ["--lifetime", "55m", "--lifetime-stagger=4m"])
    3060.0
    """
    values = {"--lifetime": float(lifetime), "--lifetime-stagger": float(stagger)}
    args = list(extra_args)
    for i, arg in enumerate(args):
        name, eq, value = str(arg).partition("=")
        if name in values and (eq or i + 1 < len(args)):
            text = value if eq else str(args[i + 1])
            values[name] = parse_interval(text, name.lstrip("-"), zero=name != "--lifetime")
    return max(1.0, values["--lifetime"] - values["--lifetime-stagger"])
