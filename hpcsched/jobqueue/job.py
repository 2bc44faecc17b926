"""Batch job bookkeeping: the ``JobState`` enum, one ``Job`` record per submitted job,
and the parsers of the two quantities every batch system asks for (memory, walltime).

A ``Job`` is one schedulable unit of the batch system: a plain job, or one element
of a job array (``42_3`` on SLURM, ``7.2`` on SGE). Its ``state`` comes from the
status poller; ``gone`` means the batch system no longer knows it and no
accounting command could say how it ended.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from datetime import timedelta

from hpcsched.core.units import parse_bytes, parse_interval

#: the job template of the cluster's own parameters (:mod:`hpcsched.jobqueue.templates`)
DEFAULT_TEMPLATE = "default"


class JobState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def terminal(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


@dataclass
class Job:
    """One submitted job (or job-array element) of a cluster."""

    job_id: str
    name: str  # worker names are this, or this + "-<k>" (several per job)
    log_file: str
    expected_workers: int
    submit_time: float = field(default_factory=time.time)
    state: JobState = JobState.PENDING
    native_state: str = ""
    exit_code: int | None = None
    gone: bool = False  # vanished from the batch system with no accounting record
    missing_polls: int = 0
    missing_since: float | None = None  # when the status command first lost sight of it
    cancel_requested: bool = False
    workers: dict[str, str] = field(default_factory=dict)  # connected: address -> worker name
    workers_seen: set[str] = field(default_factory=set)  # names that ever connected
    end_time: float | None = None
    running_since: float | None = None  # when a poll first saw it running
    silence_reported: bool = False  # its workers' silence was logged once
    template: str = DEFAULT_TEMPLATE  # the job template it was submitted from
    connected_at: float | None = None  # when its first worker connected
    replaced: bool = False  # a replacement was submitted ahead of its end (succession.py)

    @property
    def ended(self) -> bool:
        return self.state.terminal or self.gone

    @property
    def active(self) -> bool:
        """Counts towards the cluster's target: not ended, not being cancelled, not
        replaced by a job submitted ahead of its end."""
        return not self.ended and not self.cancel_requested and not self.replaced

    def worker_names(self) -> list[str]:
        """The names its workers take: the job's name, or name-0 .. name-(P-1)."""
        if self.expected_workers == 1:
            return [self.name]
        return [f"{self.name}-{k}" for k in range(self.expected_workers)]

    def owns_worker(self, worker_name: str) -> bool:
        return worker_name == self.name or worker_name.rsplit("-", 1)[0] == self.name

    def __repr__(self) -> str:
        return (f"<Job {self.job_id} {self.name} {self.state.value}"
                f"{'' if self.template == DEFAULT_TEMPLATE else ' ' + self.template}"
                f"{' gone' if self.gone else ''} workers={len(self.workers)}/{self.expected_workers}>")


# ---------------------------------------------------------------- memory

def parse_memory(value: str | int | float, what: str = "memory", zero: bool = False) -> int:
    """Bytes in ``"16GB"``, ``"1.5 GiB"``, ``"500MB"``, ``2**30``; errors name ``what``.

    The units are those of :func:`hpcsched.core.units.parse_bytes` (the project's one
    size parser: decimal kB/MB/GB, binary KiB/MiB/GiB); batch systems' own ``G`` means
    GiB, which the per-system renderers handle. ``zero``: 0 is allowed (a scale to none).
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"{what} must be a size such as '16GB', got {type(value).__name__} "
                        f"{value!r}")
    try:
        n = parse_bytes(value)
    except ValueError as e:
        raise ValueError(f"{what}={value!r} is not a size: {e}") from None
    if n < 0 or (n == 0 and not zero):
        raise ValueError(f"{what}={value!r} must be positive")
    return n


def format_memory(nbytes: int) -> str:
    """Exact and short: 16000000000 -> '16GB', 2**31 -> '2GiB', else plain bytes."""
    for suffix, factor in (("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2),
                           ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("kB", 1000)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{suffix}"
    return f"{nbytes}B"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- walltime

def parse_walltime(value: str | int | float | timedelta, what: str = "walltime",
                   two_fields: str | None = None) -> int:
    """Whole seconds (rounded up) in ``"01:30:00"``, ``"2-00:00:00"``, ``"90m"``, ``5400``.

    Read by :func:`hpcsched.core.units.parse_interval`. Two fields are read as the batch
    system reads them, since dask-jobqueue hands the walltime on as written:
    ``two_fields="hh:mm"`` (LSF's ``-W``, OAR's ``walltime=``) or ``"mm:ss"`` (SLURM's
    ``--time``, PBS's and Moab's ``walltime``, Grid Engine's ``h_rt``); ``None`` refuses
    them as ambiguous (a system with no clock format of its own).

    >>> parse_walltime("00:02", two_fields="hh:mm"), parse_walltime("00:02", two_fields="mm:ss")
    (120, 2)
    """
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a duration such as '01:00:00', got {value!r}")
    if not isinstance(value, (str, int, float, timedelta)):
        raise TypeError(f"{what} must be a duration such as '01:00:00', got "
                        f"{type(value).__name__} {value!r}")
    if two_fields not in (None, "hh:mm", "mm:ss"):
        raise ValueError(f"two_fields={two_fields!r}: 'hh:mm', 'mm:ss' or None")
    return int(math.ceil(parse_interval(value, what, hh_mm=two_fields == "hh:mm",
                                        mm_ss=two_fields == "mm:ss")))


def format_hms(seconds: int) -> str:
    """``5400`` -> ``"01:30:00"`` (hours may exceed 24)."""
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


def worker_lifetime(walltime: int, margin: float, stagger: float) -> tuple[int, int]:
    """(``--lifetime``, ``--lifetime-stagger``) for workers of a job with ``walltime`` s.

    Workers retire at lifetime +- stagger; both shrink for short walltimes so that the
    latest retirement still leaves half the margin before the batch system kills the job.
    """
    margin = min(float(margin), walltime / 4)
    stagger = min(float(stagger), margin / 2)
    return max(1, int(walltime - margin)), int(stagger)
