"""Worker memory management: thresholds, and what one sample of process memory calls for.

The policy is dask.distributed's ("Worker Memory Management" in its
documentation), with its names and defaults, as fractions of the worker's
``memory_limit``:

* ``target`` (0.6): *managed* memory -- the results the worker holds, each
  measured with ``sizeof`` once, when it is stored -- above this spills the
  least recently used results to local disk. The spill buffer
  (:mod:`hpcsched.core.worker.spill`) does this itself as results are stored: no
  sampling, no cost per task beyond the bookkeeping of the store.
* ``spill`` (0.7): *process* memory (RSS, which also counts what ``sizeof``
  misses: fragmentation, libraries' caches, a task's temporaries) above this
  spills results until the process would be back under ``target``.
* ``pause`` (0.8): process memory above this pauses the worker: it starts no
  task and fetches no dependency, and tells the scheduler, which sends it no
  new work, until memory drops below the fraction again.
* ``terminate`` (0.95): process memory above this is about to meet the node's
  out-of-memory killer. A worker that can be restarted (a process of its own
  over TCP, under LocalCluster or ``hpcsched worker``) exits with
  :data:`EXIT_MEMORY` and is started anew; its tasks run elsewhere. An MPI rank
  cannot be restarted: it spills everything and pauses, and only if that is
  not enough ends the job with an error naming the rank.

:func:`plan` is the pure decision over one sample; the worker takes a sample
on its tick (``worker.memory.monitor-interval``), never per task.

>>> limits = MemoryLimits(1000, target=0.6, spill=0.7, pause=0.8, terminate=0.95)
>>> plan(limits, rss=750, spillable=400, paused=False)
MemoryPlan(evict_bytes=150, pause=None, terminate=False, fast_bytes=350.0)
>>> plan(limits, rss=850, spillable=0, paused=False).pause
True
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from msgspec.structs import force_setattr

from hpcsched.core import config
from hpcsched.core.protocol.records import Record
from hpcsched.core.settings import WorkerSettings

#: exit status of a worker process that passed the terminate fraction: EX_TEMPFAIL of
#: sysexits.h ("temporary failure; the user is invited to retry"): its supervisor restarts it
EXIT_MEMORY = 75

FRACTIONS = ("target", "spill", "pause", "terminate")
_DEFAULT = WorkerSettings()  # the fractions' defaults (worker.memory.*)


def _fraction(name: str, value: Any) -> float | None:
    """A fraction in (0, 1], or None for ``False`` / ``None`` (the step is off)."""
    if value is None or value is False:
        return None
    if isinstance(value, str) and value.strip().lower() in ("false", "none", "off", "no"):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"worker.memory.{name} must be a fraction of memory_limit in (0, 1] "
                         f"or false, not {value!r}") from None
    if not 0 < f <= 1 or math.isnan(f):
        raise ValueError(f"worker.memory.{name} must be a fraction of memory_limit in (0, 1] "
                         f"or false, not {value!r}")
    return f


class MemoryLimits(Record):
    """A worker's ``memory_limit`` (bytes; 0: unmanaged) and its four fractions."""

    limit: int
    target: float | None = _DEFAULT.memory_target
    spill: float | None = _DEFAULT.memory_spill
    pause: float | None = _DEFAULT.memory_pause
    terminate: float | None = _DEFAULT.memory_terminate

    def __post_init__(self) -> None:
        if not isinstance(self.limit, int) or self.limit < 0:
            raise ValueError(f"memory_limit must be a number of bytes >= 0, not {self.limit!r}")
        for name in FRACTIONS:
            # as it is built (msgspec's documented use of force_setattr), never after
            force_setattr(self, name, _fraction(name, getattr(self, name)))

    @classmethod
    def from_config(cls, limit: int, **overrides: Any) -> MemoryLimits:
        """Fractions from ``worker.memory.*`` unless given (``target=False`` turns one off)."""
        unknown = set(overrides) - set(FRACTIONS)
        if unknown:
            raise TypeError(f"unknown memory fractions {sorted(unknown)}")
        settings = config.read(WorkerSettings,
                               **{f"memory_{name}": v for name, v in overrides.items()})
        return cls.from_settings(limit, settings)

    @classmethod
    def from_settings(cls, limit: int, settings: WorkerSettings) -> MemoryLimits:
        """A worker's limits: ``limit`` bytes and the fractions of its ``settings``."""
        return cls(int(limit or 0), target=settings.memory_target,
                   spill=settings.memory_spill, pause=settings.memory_pause,
                   terminate=settings.memory_terminate)

    @property
    def managed(self) -> bool:
        return self.limit > 0

    def bytes_at(self, name: str) -> float:
        """The threshold ``name`` in bytes (infinite when off or unmanaged)."""
        f = getattr(self, name)
        return math.inf if f is None or not self.limit else f * self.limit


class MemoryPlan(Record):
    evict_bytes: int = 0  # spill this many bytes of results (least recently used first)
    pause: bool | None = None  # True: pause; False: resume; None: no change
    terminate: bool = False  # past the terminate fraction with nothing left to spill
    # bytes of results the spill buffer may keep in memory until the next sample
    fast_bytes: float = math.inf


def plan(limits: MemoryLimits, rss: int, spillable: int, paused: bool,
         restartable: bool = False) -> MemoryPlan:
    """What a sample of process memory ``rss`` calls for, ``spillable`` bytes of results
    being in memory and the worker ``paused`` or not.

    ``restartable``: past terminate, a worker that can be restarted terminates at once
    (as dask's nanny does); one that cannot (an MPI rank) spills everything first and
    terminates only when nothing is left.
    """
    if not limits.managed:
        return MemoryPlan()
    # results are stored between samples, many per sample when tasks are short: the buffer
    # keeps at most target, and no more than leaves room for the memory sizeof does not
    # see (interpreter, libraries, fragmentation) below the spill fraction
    unmanaged = max(rss - spillable, 0)
    fast = min(limits.bytes_at("target"), max(limits.bytes_at("spill") - unmanaged, 0))
    evict = 0
    spill_at = limits.bytes_at("spill")
    if rss > spill_at:
        # down to target (or to the spill fraction when target is off), as dask does
        floor = limits.bytes_at("target") if limits.target is not None else spill_at
        evict = int(min(rss - floor, spillable))
    terminate = False
    if rss > limits.bytes_at("terminate"):
        if restartable or spillable <= 0:
            terminate = True
        else:
            evict = spillable
    want_pause = rss > limits.bytes_at("pause")
    if terminate and not restartable:
        want_pause = True
    change = want_pause if want_pause != paused else None
    return MemoryPlan(max(evict, 0), change, terminate, fast)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_memory() -> int:
    """This process's resident set size in bytes (0 where psutil cannot tell).

    On Linux read from ``/proc/self/statm`` (what psutil reads, without importing it:
    a worker samples this as it starts, before its first task)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - an unsupported platform: process memory unmanaged
        return 0


class PeakMemory:
    """The process's peak resident set size since the last :meth:`reset`, on Linux.

    Writing ``5`` to ``/proc/self/clear_refs`` resets the process's peak RSS to its
    current RSS, which ``/proc/self/status`` shows as ``VmHWM`` (proc(5), ``clear_refs``
    and ``status``). ``getrusage``'s ``ru_maxrss`` cannot serve: it never drops below the
    peak of the process image the worker was executed from (its parent's, for a process
    started by ``fork`` and ``exec``; kernel/sys.c). A reset is a write (under a
    microsecond); a read has the kernel format the whole status file (several
    microseconds), so a caller reads only where the figure can differ from what it knows
    (:mod:`hpcsched.core.worker.parts.running`: not after a task under a millisecond).

    Threads share one address space: a task resets the peak as it starts, so with
    several task threads a task's figure is the worker's peak since the latest task
    start, never less than its RSS at the task's end. Without ``clear_refs`` (another
    system, or no right to write it) :meth:`peak` is 0 and the caller uses its last RSS
    sample."""

    def __init__(self) -> None:
        self._fd = -1
        self._status = -1
        self._pid = 0
        #: (monotonic time, RSS in bytes) as the last :meth:`peak` read it
        self.sample: tuple[float, int] = (0.0, 0)

    def _open(self) -> int:
        self._pid = os.getpid()  # a forked child opens its own
        try:
            self._status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
            self._fd = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = -1
        return self._fd

    def reset(self) -> None:
        fd = self._fd if self._pid == os.getpid() else self._open()
        if fd >= 0:
            try:
                os.write(fd, b"5")
            except OSError:
                self._fd = -1

    def peak(self) -> int:
        """Bytes at the peak since the last reset; 0 when this cannot be told. The
        current RSS, read with it, is kept as :attr:`sample` (monotonic time, bytes)."""
        if self._fd < 0 or self._pid != os.getpid():
            return 0
        try:
            status = os.pread(self._status, 4096, 0)
            at = status.index(b"VmHWM:") + 6
            peak = int(status[at:status.index(b"kB", at)]) * 1024
            at = status.index(b"VmRSS:", at) + 6
            self.sample = (time.monotonic(), int(status[at:status.index(b"kB", at)]) * 1024)
        except (OSError, ValueError):
            return 0
        return peak


#: the worker process's (tasks reset it as they start, module docstring of ``running``)
PEAK = PeakMemory()


def format_bytes(n: float) -> str:
    """``n`` bytes for people to read.

    >>> format_bytes(1_500_000)
    '1.50 MB'
    """
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
