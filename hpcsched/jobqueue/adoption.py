"""What a batch cluster keeps in its scheduler's journal, to adopt its jobs after a restart.

A :class:`~hpcsched.jobqueue.cluster.JobQueueCluster` whose scheduler keeps a journal
(``scheduler_journal=J``, or ``scheduler.journal``) writes there, in a section of its own
(:meth:`hpcsched.core.scheduler.journal.Journal.set_section`), what the batch system cannot
tell a new process: which of the queue's jobs are its own (their ids, names, log files),
the cluster id its job and worker names carry, how many jobs it aims for and its adapt
settings. The section is rewritten as soon as a submission returns its job id, and when
that picture changes (a job's first worker connected, a job ended, ``scale``, ``adapt``).

The process holding the cluster dies (a notebook kernel restarted, a login session
dropped) and the batch jobs run on: their workers keep their results and look for the
scheduler for ``worker.scheduler-reconnect-timeout`` seconds. A new cluster made with the
same journal listens at the same address with the same secret, reads the section,
asks the batch system (one status command) which of those jobs are still queued or
running, and takes them as its own: they count toward ``scale`` and ``adapt``, their
workers register again under names that map to them, and none is cancelled while the
target asks for it. Jobs that ended meanwhile are replaced as any ended job is. A job
submitted in the instant the process died, before its id reached the journal, is not
adopted: its workers, if they connect, serve the scheduler, and close with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hpcsched.jobqueue.job import DEFAULT_TEMPLATE, Job

if TYPE_CHECKING:
    from hpcsched.core.scheduler.server import Scheduler

logger = logging.getLogger(__name__)

#: the journal section a batch cluster keeps
SECTION = "jobqueue"
#: what is recorded of each job (besides its id)
_JOB_FIELDS = ("name", "log_file", "expected_workers", "submit_time", "cancel_requested",
               "template", "replaced")


def job_record(job: Job) -> dict[str, Any]:
    """The plain data a journal keeps of ``job``."""
    rec = {f: getattr(job, f) for f in _JOB_FIELDS}
    rec["job_id"] = job.job_id
    rec["served"] = bool(job.workers_seen)  # its workers had connected before
    return rec


def job_from_record(rec: dict[str, Any]) -> Job:
    """The :class:`Job` a journal's record describes (its state comes from the next poll)."""
    job = Job(str(rec["job_id"]), str(rec["name"]), str(rec["log_file"]),
              int(rec["expected_workers"]), submit_time=float(rec["submit_time"]),
              cancel_requested=bool(rec["cancel_requested"]),
              template=str(rec.get("template", DEFAULT_TEMPLATE)),
              replaced=bool(rec.get("replaced", False)))  # its replacement was submitted
    if rec.get("served"):
        # it served the scheduler before the restart: not a job whose workers never came
        job.workers_seen.update(job.worker_names())
    return job


def cluster_section(system: str, cluster_id: str, next_index: int, target_jobs: int,
                    jobs: list[Job], adapt: dict[str, Any] | None,
                    targets: dict[str, int] | None = None) -> dict[str, Any]:
    """The section of a cluster with these fields; ``jobs``: those not ended;
    ``targets``: the job templates' own targets (besides the default's ``target_jobs``)."""
    return {"system": system, "cluster_id": cluster_id, "next_index": next_index,
            "target_jobs": target_jobs, "jobs": [job_record(j) for j in jobs],
            "adapt": adapt, "targets": dict(targets or {})}


def check_section(saved: Any, system: str, cluster: str) -> dict[str, Any]:
    """``saved`` if it is a section this ``system``'s cluster can take up, else an error
    naming what is wrong (another batch system's journal, a damaged section)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("jobs"), list):
        raise ValueError(f"{cluster}: the journal's {SECTION!r} section is not a cluster's "
                         f"({type(saved).__name__}); start with a new journal")
    if saved.get("system") != system:
        raise ValueError(f"{cluster}: the journal holds the jobs of a "
                         f"{saved.get('system')!r} cluster, not of a {system!r} one; restart "
                         "the cluster class that wrote it, or start with a new journal")
    return saved


def adoptable(jobs: list[Job], states: dict[str, Any] | None) -> tuple[list[Job], list[Job]]:
    """(jobs to adopt, jobs that ended) given the batch system's ``states`` (job id ->
    :class:`~hpcsched.jobqueue.base.JobStatus`; None: it could not be asked, and every job
    is adopted for the polls to sort out)."""
    if states is None:
        return list(jobs), []
    keep, ended = [], []
    for job in jobs:
        status = states.get(job.job_id)
        if status is None or status.state.terminal:
            ended.append(job)
            continue
        job.state, job.native_state = status.state, status.native
        keep.append(job)
    return keep, ended


class ClusterJournal:
    """Reads and writes a cluster's section of its scheduler's journal (from any thread:
    the journal itself is the scheduler loop's, so every access runs there)."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.enabled = scheduler.journal is not None
        self._last: Any = None

    def load(self) -> Any:
        """The section as the journal holds it (None: none, or no journal)."""
        if not self.enabled:
            return None
        self._last = self.scheduler.call(lambda s: s.journal.sections.get(SECTION))
        return self._last

    def save(self, section: dict[str, Any] | None) -> None:
        """Write ``section`` (None: remove it) and sync, unless the journal holds it already."""
        if not self.enabled or section == self._last:
            return

        def write(s: Any) -> None:
            if s.journal is not None:
                s.journal.set_section(SECTION, section)
                s.journal.sync()

        try:
            self.scheduler.call(write)
        except Exception as e:  # noqa: BLE001 - the scheduler is closing: nothing to keep
            logger.debug("could not journal the cluster's jobs: %s", e)
            return
        self._last = section
