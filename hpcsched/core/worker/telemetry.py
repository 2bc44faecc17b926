"""What a worker tells the scheduler about itself with each heartbeat, beyond its state.

CPU use of its process, the batch job it runs in, the transfers it made and the
log records written since the last heartbeat: the scheduler's recorder keeps
them for the dashboard, the performance report and ``client.get_worker_logs()``.
Everything is bounded (a worker that cannot send keeps only the newest
entries) and costs nothing per task: one tuple per transfer, one per log record.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque

from hpcsched.core import seams

MAX_TRANSFERS = 1_000  # kept between two heartbeats
MAX_LOG_RECORDS = 200
_UNKNOWN = object()
_job_id: object = _UNKNOWN  # this process's batch job id, read once (None: not in a job)


def batch_job_id() -> str | None:
    """The id of the batch job this process runs in, as its batch system names it.

    Each batch system's module knows its own variables (the seam ``batch-job``); the
    answer is read once per process, at the first heartbeat.
    """
    global _job_id
    if _job_id is _UNKNOWN:
        try:
            job = seams.resolve("batch-job")(os.environ, socket.gethostname())
        except (ImportError, ValueError):  # a malformed variable must not stop heartbeats
            job = None
        _job_id = job.job_id if job is not None else None
    return _job_id  # type: ignore[return-value]


class _LogBuffer(logging.Handler):
    def __init__(self, size: int):
        super().__init__(logging.INFO)
        self.records: deque = deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append((record.created, record.levelname, self.format(record)))
            # with no other handler anywhere, logging would have printed warnings to stderr
            # (its last resort): being a handler must not silence that
            last = logging.lastResort
            if last is not None and record.levelno >= last.level and not self._others(record):
                last.handle(record)
        except Exception:  # a log call must never fail the worker
            pass

    def _others(self, record: logging.LogRecord) -> bool:
        lg: logging.Logger | None = logging.getLogger(record.name)
        while lg is not None:
            buffers = [h for h in lg.handlers if isinstance(h, _LogBuffer)]
            if len(buffers) < len(lg.handlers) or (buffers and buffers[0] is not self):
                return True  # a real handler, or another buffer that forwards
            if not lg.propagate:
                return False
            lg = lg.parent
        return False


class ProcessCPU:
    """This process's CPU use in % of a core (every thread's, as psutil's ``cpu_percent``),
    shared by the workers it runs (hundreds in a benchmark or on a big node): measured from
    ``time.process_time`` at most once a second, over the time since the last measure."""

    def __init__(self, every: float = 1.0):
        self._every = every
        self._lock = threading.Lock()
        self._at = time.monotonic()
        self._cpu = time.process_time()
        self._value: float | None = None

    def percent(self) -> float:
        now = time.monotonic()
        with self._lock:
            if self._value is None or now - self._at >= self._every:
                cpu = time.process_time()
                elapsed = now - self._at
                if elapsed > 0 or self._value is None:
                    self._value = 100.0 * (cpu - self._cpu) / max(elapsed, 1e-9)
                    self._at, self._cpu = now, cpu
            return self._value


#: this process's CPU meter
PROCESS_CPU = ProcessCPU()


class WorkerTelemetry:
    """Collects a worker's news; :meth:`add_to` moves it into a heartbeat's metrics."""

    def __init__(self, logger_name: str = "hpcsched"):
        self.transfers: deque = deque(maxlen=MAX_TRANSFERS)
        self._logs = _LogBuffer(MAX_LOG_RECORDS)
        self._logs.setFormatter(logging.Formatter("%(name)s - %(levelname)s - %(message)s"))
        self._logger = logging.getLogger(logger_name)
        self._logger.addHandler(self._logs)

    def transfer(self, peer: str, started_monotonic: float, nbytes: int) -> None:
        """A fetch from ``peer`` that began at ``started_monotonic`` just ended."""
        now = time.time()
        self.transfers.append((peer, now - (time.monotonic() - started_monotonic), now,
                               int(nbytes)))

    def add_to(self, metrics: dict) -> None:
        metrics["cpu"] = PROCESS_CPU.percent()
        job_id = batch_job_id()
        if job_id:
            metrics["job_id"] = job_id
        # other threads append while we read (fetch threads, any logger): popleft is atomic
        if self.transfers:
            metrics["transfers"] = _drain(self.transfers)
        if self._logs.records:
            metrics["logs"] = _drain(self._logs.records)

    def close(self) -> None:
        self._logger.removeHandler(self._logs)


def _drain(box: deque) -> list[list]:
    out = []
    while True:
        try:
            out.append(list(box.popleft()))
        except IndexError:
            return out
