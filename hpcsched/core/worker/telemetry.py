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
import time
from collections import deque
from typing import Any

MAX_TRANSFERS = 1_000  # kept between two heartbeats
MAX_LOG_RECORDS = 200
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID", "PBS_JOBID", "LSB_JOBID", "JOB_ID")


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


class WorkerTelemetry:
    """Collects a worker's news; :meth:`add_to` moves it into a heartbeat's metrics."""

    def __init__(self, logger_name: str = "hpcsched"):
        self.transfers: deque = deque(maxlen=MAX_TRANSFERS)
        self.job_id = next((os.environ[v] for v in JOB_ID_VARIABLES if os.environ.get(v)), None)
        self._process: Any = None  # psutil's, made at the first heartbeat (not at start-up)
        self._cpu_started = False
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
        if not self._cpu_started:
            self._cpu_started = True
            try:
                import psutil

                self._process = psutil.Process()
                self._process.cpu_percent()  # the first call starts the measurement
            except Exception:  # noqa: BLE001 - no CPU figure where psutil cannot tell
                self._process = None
        elif self._process is not None:
            try:
                metrics["cpu"] = self._process.cpu_percent()
            except Exception:  # noqa: BLE001
                pass
        if self.job_id:
            metrics["job_id"] = self.job_id
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
