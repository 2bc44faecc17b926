"""What a batch cluster says about its jobs: failures, silent jobs, an unreachable scheduler.

:class:`Diagnosis` owns the cluster's notes (``get_logs()["Cluster"]``), its events in
the scheduler (topic ``jobqueue``) and the one standing diagnosis, :attr:`unreachable`.
It is handed jobs and reads their logs; it never changes a job nor runs a command.

* A job that ends before any of its workers connected is reported with the tail of its
  log (:meth:`Diagnosis.failure`).
* Jobs that run for ``jobqueue.connect-timeout`` seconds while none of their workers
  connects are reported with what their logs say; when that is "cannot reach the
  scheduler", :attr:`Diagnosis.unreachable` names the address tried, how it was chosen
  and this host's interfaces, until a worker connects.
"""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import hpcsched.jobqueue.runner as runner
from hpcsched.core.comm.hosts import describe_interfaces
from hpcsched.jobqueue.job import Job, JobState

logger = logging.getLogger("hpcsched.jobqueue.cluster")
LOG_TAIL_LINES = 20

#: what a worker logs when it cannot connect (core/worker/parts/link.py, SchedulerLink._connect)
UNREACHABLE = re.compile(r"(?:cannot|could not) reach the scheduler at .*")


class JobFailedError(RuntimeError):
    """A batch job ended before its workers connected."""


class SchedulerUnreachableError(ConnectionError):
    """Jobs run, but their workers' logs say they cannot reach the scheduler."""


def read_tail(
    path: str, lines: int = LOG_TAIL_LINES, clean: Callable[[str], str] | None = None
) -> str:
    """The last ``lines`` of a job's log; ``clean`` drops what the batch system appended."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-256 * 1024 :]
    except FileNotFoundError:
        return f"(log file {path} does not exist)"
    except OSError as e:
        return f"(cannot read log file {path}: {e})"
    if clean is not None:
        text = clean(text)
    return runner.tail(text, lines) or f"(log file {path} is empty)"


class Diagnosis:
    """The cluster's notes and events, and what its jobs' logs say when workers are missing.

    ``recorder`` returns the scheduler's event recorder (or None while there is none);
    ``job_output`` drops what the batch system appended to a job's log.
    """

    def __init__(
        self,
        cluster: str,
        address_how: str,
        connect_timeout: float,
        job_output: Callable[[str], str],
        recorder: Callable[[], Any],
    ) -> None:
        self.cluster = cluster
        self.address_how = address_how
        self.connect_timeout = connect_timeout
        self.scheduler_address = "?"
        self._job_output = job_output
        self._recorder = recorder
        self.notes: collections.deque[str] = collections.deque(maxlen=1000)
        #: why the workers cannot reach the scheduler ("" while nothing says so)
        self.unreachable = ""

    def note(self, level: int, msg: str, *args: Any) -> None:
        """Log, and keep the line for ``get_logs()``."""
        logger.log(level, msg, *args)
        self.notes.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg % args}")

    def event(self, text: str) -> None:
        """Show ``text`` in the scheduler's events (dashboard, performance reports)."""
        recorder = self._recorder()
        if recorder is not None:
            recorder.event("jobqueue", text, time.time())  # a deque append: thread-safe

    def log_tail(self, job: Job, lines: int = LOG_TAIL_LINES) -> str:
        return read_tail(job.log_file, lines, clean=self._job_output)

    def worker_connected(self, name: str) -> None:
        if self.unreachable:
            self.note(logging.INFO, "worker %s connected: the scheduler is reachable", name)
            self.unreachable = ""

    def failure(self, job: Job) -> str:
        """Why ``job`` ended before any of its workers connected, with its log's tail."""
        how = (
            "vanished from the queue"
            if job.gone and not job.state.terminal
            else f"ended {job.state.value} ({job.native_state or '?'}"
            + (f", exit code {job.exit_code})" if job.exit_code is not None else ")")
        )
        return (
            f"batch job {job.job_id} ({job.name}) {how} before any of its workers "
            f"connected to {self.scheduler_address}; tail of {job.log_file}:\n"
            f"{self.log_tail(job)}"
        )

    def read_silent(self, silent: list[Job]) -> list[tuple[Job, str, str]]:
        """(job, the last "cannot reach" line of its log or "", its log's tail) of each
        silent job. Without the cluster's lock: a shared file system may be slow."""
        said = []
        for job in silent:
            text = self.log_tail(job)
            found = UNREACHABLE.findall(text)
            said.append((job, found[-1] if found else "", text))
        return said

    def report_silent(self, said: list[tuple[Job, str, str]], now: float) -> None:
        """Report what :meth:`read_silent` found (under the cluster's lock: a worker that
        connected meanwhile is no longer silent). Each job is reported once."""
        if self.unreachable or not said:
            return
        cannot = [(job, line) for job, line, _ in said if line and not job.workers_seen]
        if cannot:
            job, line = cannot[0]
            since = min(j.running_since or now for j, _, _ in said)
            self.unreachable = self._unreachable_message(len(said), now - since, job, line)
            self.note(logging.ERROR, "%s", self.unreachable)
            self.event(self.unreachable)
            return
        for job, _, text in said:
            if not job.silence_reported and not job.workers_seen:
                job.silence_reported = True
                self.note(
                    logging.WARNING,
                    "batch job %s (%s) has run for %.0f s and none of "
                    "its workers has connected to %s yet; tail of %s:\n%s",
                    job.job_id,
                    job.name,
                    now - (job.running_since or now),
                    self.scheduler_address,
                    job.log_file,
                    text,
                )

    def _unreachable_message(self, jobs: int, seconds: float, job: Job, line: str) -> str:
        name = self.cluster
        return (
            f"{jobs} job{'s' * (jobs > 1)} running for {seconds:.0f} s, and no worker "
            f"connected: the workers cannot reach the scheduler at "
            f"{self.scheduler_address} (chosen as {self.address_how}). "
            f"Job {job.job_id}'s log ({job.log_file}) says: {line.strip()}\n"
            f"This host's interfaces: {describe_interfaces()}. If the compute nodes reach "
            f"this host on another network, name its interface: {name}(..., "
            f"scheduler_options={{'interface': '<name>'}}) (interface='<name>' sets the "
            f"workers' interface too), or its address: scheduler_options={{'host': "
            f"'<address>'}}."
        )

    def silent_log(self, jobs: list[Job]) -> str:
        """The tail of the log of a running job none of whose workers connected, if any."""
        silent = [j for j in jobs if j.state is JobState.RUNNING and not j.workers_seen]
        if not silent:
            return ""
        job = silent[0]
        return (
            f"; no worker of running job {job.job_id} connected to {self.scheduler_address}"
            f"; tail of {job.log_file}:\n{self.log_tail(job)}"
        )
