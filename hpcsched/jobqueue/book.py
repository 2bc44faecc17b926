"""The book of a batch cluster: its jobs, its target, and what to do about the difference.

Plain data and decisions, in the style of :mod:`hpcsched.launchers.adaptive_policy`: no
thread, lock, clock, file or batch command here. :class:`JobBook` is told what happened
(jobs submitted, workers joined or left, the states a poll found, at a time passed in)
and answers what to do (:meth:`JobBook.adjustment`: how many jobs to submit, which to
cancel; :meth:`JobBook.settle`: whether a job that ended is a failure to report).
:class:`~hpcsched.jobqueue.cluster.JobQueueCluster` is the threaded shell that holds one
book under its lock, runs the commands and reads the logs. Tests drive a book with
:class:`~hpcsched.jobqueue.job.Job` records and :class:`~hpcsched.jobqueue.base.JobStatus`
values, no process.

Rules the book keeps:

* a job counts towards the target while it is *active*: not ended, not being cancelled;
* a job missing from the status output is *gone* only after three polls and
  ``GONE_AFTER`` seconds (time for an accounting record such as SGE's ``qacct`` to
  appear), or at once when we cancelled it;
* excess jobs are cancelled pending and newest first, then running ones with the
  fewest connected workers;
* a job that ends before any of its workers connected, and that we did not cancel, is
  a failure (:attr:`JobBook.failed_jobs`);
* each job template (:mod:`hpcsched.jobqueue.templates`) has a target of its own, met by
  jobs of that template only; names share one counter, so no two jobs share a name.
* a job is *replaced* ahead of its end (:meth:`JobBook.replace_ahead`, the rule of
  :mod:`hpcsched.jobqueue.succession`): it stops counting towards the target, so the
  next adjustment submits its replacement, and its workers retire at their lifetime.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hpcsched.jobqueue.base import JobStatus
from hpcsched.jobqueue.job import DEFAULT_TEMPLATE as DEFAULT
from hpcsched.jobqueue.job import Job, JobState
from hpcsched.jobqueue.succession import QueueWait, Succession

GONE_AFTER = 5.0  # seconds without status or accounting record before a job counts as gone
MISSING_POLLS = 3  # polls without a status (not a race right after submission)


@dataclass(frozen=True)
class Adjustment:
    """What meets the target: submit ``submit`` jobs, or cancel ``cancel`` (never both)."""

    submit: int = 0
    cancel: tuple[Job, ...] = ()
    template: str = DEFAULT


class Ending(enum.Enum):
    """How a job's end reads to the cluster."""

    CANCELLED = "cancelled"  # we asked for it
    FINISHED = "finished"  # its workers had connected: walltime, retirement, a crash late
    FAILED = "failed"  # it ended before any worker connected: report it, back off


class JobBook:
    """The jobs of one cluster, by id, and the number of jobs it aims for.

    >>> book = JobBook(workers_per_job=2, job_name="hpcsched", cluster_id="ab12")
    >>> book.set_target(2)
    True
    >>> book.adjustment()
    Adjustment(submit=2, cancel=(), template='default')
    >>> book.take_name()
    'hpcsched-ab12-0'
    >>> book.add_template("gpu", "hpcsched-gpu")
    >>> book.set_target(1, "gpu")
    True
    >>> [(a.template, a.submit) for a in book.adjustments()]
    [('default', 2), ('gpu', 1)]
    >>> book.take_name("gpu")
    'hpcsched-gpu-ab12-1'
    """

    def __init__(self, workers_per_job: int, job_name: str, cluster_id: str) -> None:
        self.workers_per_job = workers_per_job
        self.job_name = job_name
        self.cluster_id = cluster_id
        self.jobs: dict[str, Job] = {}
        self.failed_jobs: list[Job] = []
        #: template -> jobs aimed for; the default template's is :attr:`target_jobs`
        self.targets: dict[str, int] = {DEFAULT: 0}
        #: template -> the job name its jobs start with
        self.job_names: dict[str, str] = {DEFAULT: job_name}
        self.next_index = 0
        #: failures since the last scale(): wait_for_workers counts only newer ones
        self.failed_since_scale = 0
        #: ids submitted and not known to be cancelled: what must be cancelled at exit
        self.live_ids: set[str] = set()
        #: the queue's measured wait, submission to first worker (succession.py)
        self.waits = QueueWait()

    @property
    def target_jobs(self) -> int:
        """Jobs aimed for of the default template."""
        return self.targets[DEFAULT]

    @target_jobs.setter
    def target_jobs(self, jobs: int) -> None:
        self.targets[DEFAULT] = jobs

    def add_template(self, template: str, job_name: str) -> None:
        """A job template whose jobs take names starting with ``job_name``."""
        self.job_names[template] = job_name
        self.targets.setdefault(template, 0)

    def _known(self, template: str) -> str:
        if template not in self.targets:
            raise ValueError(f"no job template {template!r} (known: "
                             f"{', '.join(self.targets)})")
        return template

    # ------------------------------------------------------------ names
    def next_name(self, template: str = DEFAULT) -> str:
        """The name the next job will take: ``<job_name>-<cluster id>-<index>``."""
        return f"{self.job_names[self._known(template)]}-{self.cluster_id}-{self.next_index}"

    def take_name(self, template: str = DEFAULT) -> str:
        name = self.next_name(template)
        self.next_index += 1
        return name

    # ------------------------------------------------------------ jobs
    def add(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self.jobs[job.job_id] = job
            self.live_ids.add(job.job_id)

    def active(self, template: str | None = None) -> list[Job]:
        """Jobs counted in the target (of ``template`` only, if given)."""
        return [j for j in self.jobs.values()
                if j.active and (template is None or j.template == template)]

    def live(self) -> list[Job]:
        """Jobs not ended (those being cancelled included)."""
        return [j for j in self.jobs.values() if not j.ended]

    def cancelled(self, job_ids: Iterable[str]) -> None:
        """The batch system took the cancel of these ids: nothing left to cancel at exit."""
        self.live_ids.difference_update(job_ids)

    @staticmethod
    def worker_names(jobs: Iterable[Job]) -> set[str]:
        return {n for j in jobs for n in j.worker_names()}

    def summary(self) -> str:
        """The jobs counted by state, e.g. ``"2 running, 1 pending"`` (``"none"``)."""
        if len(self.targets) > 1:  # per template: "default: 2 running; gpu: 1 pending"
            return "; ".join(f"{t}: {self._count(t)}" for t in self.targets)
        return self._count(None)

    def _count(self, template: str | None) -> str:
        counts: dict[str, int] = {}
        for j in self.jobs.values():
            if template is not None and j.template != template:
                continue
            key = "gone" if j.gone and not j.state.terminal else j.state.value
            counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none"

    # ------------------------------------------------------------ targets
    def set_target(self, jobs: int, template: str = DEFAULT) -> bool:
        """The user's own ``scale()``; True when it asks for more jobs than are active."""
        self.targets[self._known(template)] = jobs
        self.failed_since_scale = 0
        return jobs > len(self.active(template))

    def raise_target(self, jobs: int, template: str = DEFAULT) -> None:
        self.targets[self._known(template)] = max(jobs, self.targets[template])

    def add_target(self, jobs: int) -> None:
        self.target_jobs += jobs

    def stop(self, names: Iterable[str]) -> list[Job]:
        """The jobs of these worker addresses or names, marked for cancelling; the target
        drops by as many jobs."""
        wanted = set(names)
        jobs = [
            j
            for j in self.jobs.values()
            if not j.ended
            and not j.cancel_requested
            and (wanted & set(j.workers) or wanted & set(j.workers.values()))
        ]
        for job in jobs:
            job.cancel_requested = True
            if job.template in self.targets and not job.replaced:
                # a replaced job no longer counted: its replacement stays
                self.targets[job.template] = max(0, self.targets[job.template] - 1)
        return jobs

    def stop_all(self) -> None:
        """Closing: no target, every live job to be cancelled."""
        self.targets = dict.fromkeys(self.targets, 0)
        for job in self.live():
            job.cancel_requested = True

    def adjustments(self) -> list[Adjustment]:
        """What meets each template's target, for the templates whose target is not met."""
        out = [self.adjustment(t) for t in self.targets]
        return [a for a in out if a.submit or a.cancel]

    def adjustment(self, template: str = DEFAULT) -> Adjustment:
        """Jobs of ``template`` to submit or to cancel to meet its target; those to cancel
        are marked."""
        active = self.active(template)
        deficit = self.targets[self._known(template)] - len(active)
        if deficit > 0:
            return Adjustment(submit=deficit, template=template)
        if deficit == 0:
            return Adjustment(template=template)
        # newest first among the pending, then running ones with the fewest workers
        order = sorted(
            active,
            key=lambda j: (
                j.state is JobState.RUNNING or bool(j.workers),
                len(j.workers),
                -j.submit_time,
            ),
        )
        victims = tuple(order[:-deficit])
        for job in victims:
            job.cancel_requested = True
        return Adjustment(cancel=victims, template=template)

    # ------------------------------------------------------------ workers
    def job_of_worker(self, name: str) -> Job | None:
        """The job whose worker takes the name ``name`` (its name, or name + ``-<k>``)."""
        for job in self.jobs.values():
            if job.owns_worker(name):
                return job
        return None

    def worker_joined(self, address: str, name: str, now: float | None = None) -> Job | None:
        """A worker connected (at ``now``, if known); its job, if it is one of ours.

        The first worker of a job measures the queue's wait, and the job is running from
        then on, whatever the batch system's last poll said.
        """
        job = self.job_of_worker(name)
        if job is not None:
            job.workers[address] = name
            job.workers_seen.add(name)
            if job.state in (JobState.PENDING, JobState.UNKNOWN):
                job.state = JobState.RUNNING  # its worker runs: the poll may not know yet
            if now is not None and job.connected_at is None:
                job.connected_at = now
                self.waits.observe(now - job.submit_time)
        return job

    def worker_left(self, address: str) -> None:
        for job in self.jobs.values():
            job.workers.pop(address, None)

    def sync_workers(self, connected: Mapping[str, str]) -> list[str]:
        """Make the jobs' workers those connected now (address -> name); the names of
        ours among them."""
        for job in self.jobs.values():
            job.workers = {a: w for a, w in job.workers.items() if a in connected}
        return [
            name
            for address, name in connected.items()
            if self.worker_joined(address, name) is not None
        ]

    def connected(self) -> int:
        return sum(len(j.workers) for j in self.jobs.values())

    # ------------------------------------------------------------ succession
    def replace_ahead(self, now: float, succession: Succession) -> list[Job]:
        """Mark the jobs whose replacement is due now (:mod:`.succession`) as replaced
        and return them: the next :meth:`adjustments` submit as many new jobs, each of
        the template of the job it replaces.

        Only jobs counted towards their template's target, each once, oldest first, and
        never beyond :meth:`Succession.max_unconnected` jobs of a template still waiting
        for their first worker. The queue's wait is measured over every template's jobs.
        """
        live = self.live()
        waiting = [j for j in live if j.connected_at is None and not j.cancel_requested]
        wait = self.waits.estimate(now - j.submit_time for j in waiting)
        if wait is None:
            return []
        due = []
        for template, target in self.targets.items():
            active = self.active(template)
            if not active or target <= 0:
                continue
            room = succession.max_unconnected(target) - sum(
                j.template == template for j in waiting)
            # oldest first: they end first
            for job in sorted(active, key=lambda j: j.submit_time):
                if room <= 0:
                    break
                if succession.due(now, job.submit_time, job.connected_at, wait):
                    job.replaced = True
                    due.append(job)
                    room -= 1  # its replacement waits for its first worker
        return due

    def leaving(self) -> set[str]:
        """Names of the connected workers of replaced jobs: on their way out, covered by
        a replacement (adaptive scaling counts neither)."""
        return {n for j in self.jobs.values() if j.replaced and not j.ended
                for n in j.workers.values()}

    # ------------------------------------------------------------ status
    def apply_status(
        self, statuses: Mapping[str, JobStatus], job_ids: Iterable[str], now: float
    ) -> list[Job]:
        """What one poll said of ``job_ids`` (absent: the system no longer lists it);
        the jobs that ended with it."""
        ended: list[Job] = []
        for job_id in job_ids:
            job = self.jobs[job_id]
            status = statuses.get(job_id)
            if status is None:
                job.missing_polls += 1
                if job.missing_since is None:
                    job.missing_since = now
                job.gone = job.missing_polls >= MISSING_POLLS and (
                    job.cancel_requested or now - job.missing_since >= GONE_AFTER
                )
                if job.gone and job.cancel_requested:
                    job.state = JobState.CANCELLED
            else:
                job.missing_polls = 0
                job.missing_since = None
                state = status.state
                if state is JobState.FAILED and job.cancel_requested:
                    state = JobState.CANCELLED  # killed by our own cancel
                job.state, job.native_state, job.exit_code = state, status.native, status.exit_code
                if state is JobState.RUNNING and job.running_since is None:
                    job.running_since = now
            if job.ended and job.end_time is None:
                job.end_time = now
                self.live_ids.discard(job_id)
                ended.append(job)
        return ended

    def settle(self, job: Job) -> Ending:
        """How ``job``'s end reads; a failure is booked in :attr:`failed_jobs`."""
        if job.cancel_requested:
            return Ending.CANCELLED
        if job.workers_seen:
            return Ending.FINISHED
        self.failed_jobs.append(job)
        self.failed_since_scale += 1
        return Ending.FAILED

    def silent(self, now: float, after: float) -> list[Job]:
        """Jobs running for ``after`` seconds that none of their workers connected from."""
        return [
            j
            for j in self.jobs.values()
            if j.state is JobState.RUNNING
            and not j.workers_seen
            and not j.cancel_requested
            and j.running_since is not None
            and now - j.running_since >= after
        ]
