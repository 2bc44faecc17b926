"""A worker's memory: its limits, its spill buffer, and the monitor that samples process
memory and carries out the plan.

Called on the worker's loop thread every ``worker.memory.monitor-interval``
seconds (its tick), never per task. It sizes the spill buffer's share of memory
and spills (:mod:`hpcsched.core.worker.spill`), says when to pause or resume (the
worker turns that into a ``PauseWorker`` event), and past the terminate
fraction calls ``on_terminate(reason)``: the CLI's exits for its supervisor to
restart the worker, an MPI rank's ends the job naming the rank. The decisions
themselves are :func:`hpcsched.core.worker.memory.plan`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from hpcsched.core.worker.memory import PEAK, MemoryLimits, format_bytes, plan, process_memory
from hpcsched.core.worker.spill import SpillBuffer, configured_directory, local_directory

logger = logging.getLogger("hpcsched.worker")


class MemoryMonitor:
    """A worker's memory part: ``limits``, the :class:`SpillBuffer` its results live in
    when they are managed (:meth:`open`), and one :meth:`sample` per tick."""

    def __init__(self, limits: MemoryLimits, on_terminate: Callable[[str], None] | None = None,
                 restartable: bool = False):
        self.limits = limits
        self.on_terminate = on_terminate
        self.restartable = restartable
        self.spill_buffer: SpillBuffer | None = None  # made by open()
        self.last_sample = (0.0, 0)  # (monotonic time, rss)
        self._terminating = False

    def open(self, directory: str | None) -> SpillBuffer | None:
        """The data store of the worker's results: a spill buffer under ``directory``
        (the worker's ``local_directory``) when a target or spill fraction manages them,
        else None (a plain dict will do). ``OSError`` names the directory it cannot use."""
        limits = self.limits
        if limits.managed and (limits.target or limits.spill):
            try:
                self.spill_buffer = SpillBuffer(configured_directory(directory),
                                                limits.bytes_at("target"))
            except OSError as e:
                raise OSError(f"worker cannot spill to local_directory "
                              f"{local_directory(directory)!r}: {e}") from e
        return self.spill_buffer

    def close(self) -> None:
        """The worker closed: so does its spill buffer (its files go)."""
        if self.spill_buffer is not None:
            self.spill_buffer.close()

    def sample(self, who: str, paused: bool) -> bool | None:
        """Take one sample; True: pause, False: resume, None: no change."""
        limits = self.limits
        rss = process_memory()
        self.last_sample = (time.monotonic(), rss)
        buf = self.spill_buffer
        spillable = buf.memory_bytes if buf is not None else 0
        p = plan(limits, rss, spillable, paused, self.restartable)
        if buf is not None and p.fast_bytes != buf.target:
            buf.target = p.fast_bytes
        if p.evict_bytes and buf is not None:
            done = buf.evict(p.evict_bytes)
            logger.debug("worker %s: process memory %s > spill fraction: spilled %s", who,
                         format_bytes(rss), format_bytes(done))
        on_disk = buf.disk_bytes if buf is not None else 0
        if p.pause:
            logger.warning(
                "worker %s paused: process memory %s is above %.0f%% of memory_limit %s "
                "(worker.memory.pause); results in memory %s, spilled %s", who,
                format_bytes(rss), 100 * (limits.pause or 1), format_bytes(limits.limit),
                format_bytes(spillable), format_bytes(on_disk))
        elif p.pause is False:
            logger.warning("worker %s resumed: process memory %s", who, format_bytes(rss))
        if p.terminate and not self._terminating:
            self._terminating = True
            why = (f"process memory {format_bytes(rss)} is above "
                   f"{100 * (limits.terminate or 1):.0f}% of memory_limit "
                   f"{format_bytes(limits.limit)} (worker.memory.terminate)"
                   + ("" if self.restartable else
                      f" with nothing left to spill ({format_bytes(on_disk)} on disk)"))
            logger.error("worker %s: %s", who, why)
            if self.on_terminate is not None:
                if buf is not None:  # the process ends: so do its spilled results
                    buf.close()
                self.on_terminate(why)
        elif not p.terminate:
            self._terminating = False
        return p.pause

    def latest_rss(self) -> int:
        """The process's RSS in bytes as last sampled (each tick when memory is managed,
        else each heartbeat, and as the last task of a millisecond or more ended:
        :class:`~hpcsched.core.worker.memory.PeakMemory`; sampled here the first time):
        read per task, it costs no system call (but the first)."""
        sampled, rss = self.last_sample
        if PEAK.sample[0] > sampled:  # read with the last task's peak: a newer sample
            self.last_sample = PEAK.sample
            return PEAK.sample[1]
        if not rss:
            rss = process_memory()
            self.last_sample = (time.monotonic(), rss)
        return rss

    def metrics(self) -> dict:
        """Memory figures for the heartbeat: process memory, results in memory and on disk."""
        sampled, rss = self.last_sample
        now = time.monotonic()
        if now - sampled >= 1.0:
            rss = process_memory()
            self.last_sample = (now, rss)
        m = {"memory": rss}
        if self.spill_buffer is not None:
            m["managed"] = self.spill_buffer.memory_bytes
            m["spilled"] = self.spill_buffer.disk_bytes
        return m
