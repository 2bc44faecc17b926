"""``JobQueueCluster``: a scheduler in the client process, workers as batch jobs.

The cluster owns what is the same on every batch system; the per-system adapter
(:class:`hpcsched.jobqueue.base.BatchSystem`) owns commands and formats. The cluster
itself is a thin threaded shell over three parts, each owning its data:
:class:`~hpcsched.jobqueue.book.JobBook` (the jobs and the target, and the decisions
over them, pure), :class:`~hpcsched.jobqueue.diagnosis.Diagnosis` (what the cluster
says: notes, events, failures) and
:class:`~hpcsched.jobqueue.submissions.SubmissionBackoff`. The shell holds the lock,
runs the batch commands, polls, and carries worker events from the scheduler's thread.

* **Connecting back.** The scheduler listens on, and job scripts name, an address
  other nodes reach (:mod:`hpcsched.launchers.address`): ``scheduler_options["host"]``,
  else the IPv4 address of ``scheduler_options["interface"]`` or ``interface``, else
  this host's routable address; loopback only when the user asks for it. The
  secret goes to a 0600 file in ``shared_temp_directory`` or ``log_directory`` (a
  shared filesystem) named by ``HPCSCHED_SECRET_FILE`` in the job script -- never on
  a command line.
* **dask-jobqueue's interface.** The constructor takes dask-jobqueue's cluster
  keywords (``n_workers``, ``name``, ``security``, ``silence_logs``, ...; see
  :meth:`JobQueueCluster.__init__`) besides the job parameters of
  :mod:`hpcsched.jobqueue.params`; ``job_script()``, ``job_header``, ``job_name``,
  ``get_logs()``, ``dashboard_link``, ``plan`` / ``requested`` / ``observed`` are there.
* **Bookkeeping.** One :class:`~hpcsched.jobqueue.job.Job` per job or array
  element in ``cluster.jobs``; a thread polls all their states with ONE status
  command every ``jobqueue.poll-interval`` seconds. Workers are mapped to jobs by
  name (job name, or job name + ``-<k>``).
* **Failures are reported, not waited for.** A job that ends before any of its
  workers connected is logged with the tail of its log file, kept in
  ``cluster.failed_jobs``, and makes ``wait_for_workers`` raise
  :class:`JobFailedError`. Jobs that run for ``jobqueue.connect-timeout`` seconds
  while none of their workers connects are reported with what their logs say; when
  the logs say the scheduler is out of reach, :class:`SchedulerUnreachableError`
  names the address tried, how it was chosen and this host's interfaces.
* **Failing submissions back off** (:mod:`hpcsched.jobqueue.submissions`): after
  failed submissions or jobs that died before a worker connected, the next
  submission waits (60 s, 15 min, 30 min by default) and after many in a row the
  cluster stops submitting until ``scale()`` or ``adapt()`` is called again. The last
  error is in the cluster's repr and the scheduler's events (topic ``jobqueue``).
* **Scaling** counts whole jobs: ``scale(n=workers)`` asks for ``ceil(n /
  processes)`` jobs. Extra jobs are cancelled pending ones first; running ones
  have their workers retired gracefully first. A job is replaced ahead of its
  walltime, by the queue's measured wait (:mod:`hpcsched.jobqueue.succession`), so
  that a fixed target does not drop to no workers between allocations; the
  retiring workers' results move to the others.
* **Nothing leaks** (:mod:`hpcsched.jobqueue.cleanup`).
* **A journaled scheduler outlives its process** (``scheduler_journal=J``,
  :mod:`hpcsched.jobqueue.adoption`): the jobs the cluster owns are in the journal; a
  process that ends without ``close()`` (killed, a kernel restart, interpreter exit)
  leaves them running, their workers waiting for the scheduler, and a cluster made again
  with the same journal adopts those still queued or running. ``close()`` cancels them.
* **Job templates** (``job_templates={"gpu": dict(queue="gpu", resources={"GPU": 4})}``,
  :mod:`hpcsched.jobqueue.templates`): several kinds of jobs behind the one scheduler,
  each with its own target (``scale(jobs=n, template="gpu")``), its own script
  (``job_script(template="gpu")``) and, under ``adapt()``, grown from the tasks only its
  workers can run (:mod:`hpcsched.launchers.adaptive_pools`).
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import os
import secrets
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

import hpcsched.jobqueue.cleanup as cleanup
import hpcsched.jobqueue.runner as runner
from hpcsched.core import config
from hpcsched.core.comm.base import Security
from hpcsched.core.comm.hosts import routable_addresses
from hpcsched.core.settings import JobQueueSettings
from hpcsched.jobqueue import params
from hpcsched.jobqueue.adoption import (
    ClusterJournal,
    adoptable,
    check_section,
    cluster_section,
    job_from_record,
)
from hpcsched.jobqueue.base import BatchSystem, system_class_of
from hpcsched.jobqueue.book import Ending, JobBook
from hpcsched.jobqueue.diagnosis import (
    Diagnosis,
    JobFailedError,
    SchedulerUnreachableError,
    read_tail,
)
from hpcsched.jobqueue.job import Job, parse_memory
from hpcsched.jobqueue.submissions import SubmissionBackoff
from hpcsched.jobqueue.succession import Succession
from hpcsched.jobqueue.templates import DEFAULT, JobTemplates, TemplatePools
from hpcsched.launchers.address import choose_scheduler_host
from hpcsched.launchers.cluster import Cluster

if TYPE_CHECKING:
    from hpcsched.launchers.adaptive import Adaptive

__all__ = ["JobFailedError", "JobQueueCluster", "SchedulerUnreachableError", "read_tail"]

logger = logging.getLogger(__name__)
WAIT_REPORT_EVERY = 5.0  # seconds: wait_for_workers prints the jobs' states this often


class JobQueueCluster(Cluster):
    """Base of the batch clusters (SLURMCluster, PBSCluster, ...; see module docstring)."""

    system_class: ClassVar[type[BatchSystem]]

    def __init__(self, n_workers: int = 0, security: Security | bool | None = None,
                 name: str | None = None, silence_logs: Any = None, asynchronous: bool = False,
                 loop: Any = None, scheduler_cls: Any = None,
                 job_cls: type[BatchSystem] | None = None, dashboard_address: Any = None,
                 host: str | None = None, scheduler_journal: str | None = None,
                 job_templates: dict[str, dict[str, Any]] | None = None,
                 **kwargs: Any) -> None:
        """Take dask-jobqueue's cluster keywords, then the job parameters.

        The job parameters (``cores``, ``memory``, ...) are those of
        :mod:`hpcsched.jobqueue.params`. Keywords that mean nothing here (``loop``,
        ``scheduler_cls``, ``silence_logs``) are accepted and logged as ignored.
        ``scheduler_journal``: the scheduler keeps a journal there (``scheduler.journal``);
        made again with the same journal after its process died, the cluster takes up its
        graphs, its address and the jobs still queued or running
        (:mod:`hpcsched.jobqueue.adoption`). ``job_templates``: name -> job parameters
        that differ from the cluster's, one kind of job each
        (:mod:`hpcsched.jobqueue.templates`).
        """
        # every check that can fail runs before anything is started or submitted
        cls = type(self).__name__
        params.check_cluster_keywords(
            cls, asynchronous,
            {"loop": loop, "scheduler_cls": scheduler_cls, "silence_logs": silence_logs},
            {"host": host, "dashboard_address": dashboard_address})
        system_class = system_class_of(type(self), job_cls)
        self.system = system_class(**kwargs)
        self.templates = JobTemplates(system_class, kwargs, job_templates, default=self.system)
        self.backoff = SubmissionBackoff.from_config()
        p = self.system.params
        self.name = name or cls
        self.workers_per_unit = p["processes"]
        opts = p["scheduler_options"]
        # the dashboard's address, as dask-jobqueue takes it (else diagnostics.dashboard.address)
        scheduler_kwargs: dict[str, Any] = {"dashboard_address": opts["dashboard_address"]} \
            if opts.get("dashboard_address") is not None else {}
        if opts.get("protocol") not in (None, "tcp", "tcp://"):
            raise ValueError(f"scheduler_options['protocol']={opts['protocol']!r}: the scheduler "
                             "of a batch cluster speaks tcp://")
        interface, host = opts.get("interface") or p["interface"], opts.get("host")
        # the compute nodes' addresses matter only when this host has several networks
        # (a login node): ask the batch system then only, it may take seconds to answer
        ask = not (interface or host) and len(routable_addresses()) > 1
        self.address_choice = choose_scheduler_host(
            interface, host, self.system.node_addresses() if ask else ())
        host = self.address_choice.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        if security is True or security is None:
            security = Security.generate()
        elif not isinstance(security, Security):
            raise TypeError(f"security={security!r}: pass True, None or an "
                            "hpcsched.core.comm.base.Security (the cluster's secret, optional "
                            "TLS via comm.tls.*), not dask.distributed's Security")
        self.book = JobBook(p["processes"], p["job_name"], secrets.token_hex(3))
        for t in self.templates.names[1:]:
            self.book.add_template(t, self.templates.system(t).params["job_name"])
        self.jobs: dict[str, Job] = self.book.jobs  # the book's own dict and list
        self.failed_jobs: list[Job] = self.book.failed_jobs
        self.diagnosis = Diagnosis(
            cls, self.address_choice.how, float(config.get("jobqueue.connect-timeout")),
            self.system.job_output,
            lambda: getattr(getattr(getattr(self, "scheduler", None), "state", None),
                            "recorder", None))
        self._scripts: list[str] = []
        self.security = security
        self._adapt_settings: dict[str, Any] | None = None  # what adapt() was called with
        self._succession = Succession.for_jobs(self.system.walltime_seconds,
                                               p["worker_extra_args"])
        os.makedirs(p["log_directory"], exist_ok=True)
        if scheduler_journal is not None:
            scheduler_kwargs["journal"] = scheduler_journal
        super().__init__(f"tcp://{host}:{int(opts.get('port') or 0)}", security,
                         scheduler_kwargs)
        self.diagnosis.scheduler_address = self.scheduler_address
        #: names of workers on their way out whose jobs a replacement covers: Adaptive
        #: counts neither them nor their jobs
        self.leaving_workers = functools.partial(_locked, self._lock, self.book.leaving)
        self._journal = ClusterJournal(self.scheduler)
        try:
            saved = self._journal.load()
            if saved is not None:  # a restart: the jobs and names of the cluster that was
                saved = check_section(saved, self.system.system, cls)
                self.book.cluster_id = str(saved["cluster_id"])
                self.book.next_index = int(saved["next_index"])
                self.book.target_jobs = int(saved["target_jobs"])
                for t, n in (saved.get("targets") or {}).items():
                    if t in self.book.targets:
                        self.book.targets[t] = int(n)
            # the scheduler's secret: a restored one when the journal had it
            self.cluster_id = self.book.cluster_id
            self._secret = cleanup.write_secret(p, self.cluster_id, self.security, cls)
            self.secret_file = self._secret.path
        except BaseException:
            # a journaled scheduler stops without closing the workers that came back to
            # it: a next attempt adopts them
            self._finalizer.detach()
            self.scheduler.close(timeout=2, detach=self.scheduler.journal is not None)
            raise
        self._events: collections.deque = collections.deque()  # worker joins/leaves, not applied yet
        self._wake = threading.Event()  # set on worker events and ended jobs
        if self._journal.enabled:
            # ended without close(), the process leaves its jobs to a restart (their
            # workers wait worker.scheduler-reconnect-timeout for it, then exit)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, self.scheduler.close, 2.0, 0, True)
            self._finalizer_jobs = cleanup.register(self, cleanup.leave_for_restart,
                                                    self.scheduler)
        else:
            self._finalizer_jobs = cleanup.register(self, cleanup.cancel_all_live, self.system,
                                                    self.book.live_ids, self.secret_file,
                                                    self.scheduler)
        self._callback = _weak_callback(self)
        self.scheduler.add_worker_callback(self._callback)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=_poll_loop, args=(weakref.ref(self), self._stop),
                                        name=f"{cls}-poll", daemon=True)
        if saved is not None:
            self._adopt(saved)
        self._poller.start()
        if n_workers:
            self.scale(n_workers)
        if saved is not None and saved.get("adapt") is not None and self.adaptive is None:
            self.adapt(**saved["adapt"])
        self._journal_jobs()

    def _adopt(self, saved: dict[str, Any]) -> None:
        """Take the journal's jobs that the batch system still runs or queues as ours."""
        jobs = [job_from_record(r) for r in saved["jobs"]]
        states = None
        if jobs:
            try:
                states = self.system.status([j.job_id for j in jobs])
            except runner.BatchCommandError as e:
                logger.warning("cannot ask the batch system about the journal's jobs (%s): "
                               "adopting all of them; the next polls tell which still run", e)
        keep, ended = adoptable(jobs, states)
        for job in keep:
            if job.template not in self.book.targets:  # a template this cluster lacks now
                self.diagnosis.note(logging.WARNING, "job %s of template %r, which this "
                                    "cluster has not: cancelling it", job.job_id, job.template)
                job.cancel_requested = True
        with self._lock:
            self.book.add(keep)
        journal = self.scheduler.journal
        self.diagnosis.note(logging.INFO, "adopted %d job(s) of cluster %s from the journal "
                            "%s: %s%s", len(keep), self.cluster_id,
                            journal.path if journal is not None else "",
                            " ".join(j.job_id for j in keep) or "none",
                            f"; ended meanwhile: {' '.join(j.job_id for j in ended)}"
                            if ended else "")
        self.diagnosis.event(f"adopted jobs {' '.join(j.job_id for j in keep) or 'none'} "
                             "after a restart")
        # a cancel the process had asked for before it died is carried out
        self._cancel([j for j in keep if j.cancel_requested], retire=True)

    def _journal_jobs(self) -> None:
        """Write this cluster's jobs and settings to the journal, if they changed.

        Under the lock, so that the journal gets the pictures of several threads in the
        order they were taken (the scheduler's loop, which writes it, never takes it).
        """
        if not self._journal.enabled:
            return
        with self._lock:
            if self._closed:
                return
            adapt = self._adapt_settings if self.adaptive is not None \
                and self.adaptive.running else None
            self._journal.save(cluster_section(
                self.system.system, self.cluster_id, self.book.next_index,
                self.book.target_jobs, self.book.live(), adapt,
                {t: n for t, n in self.book.targets.items() if t != DEFAULT}))

    # ------------------------------------------------------------ scripts
    def job_script(self, array: int | None = None, template: str | None = None) -> str:
        """The script the next submission will use.

        ``array=N``: an N-element job array; ``template``: of that job template, else of
        the cluster's own parameters.
        """
        name = self.templates.check(template)
        return self.templates.system(name).render(self.book.next_name(name),
                                                  self.scheduler_address, self.secret_file,
                                                  array=array)

    @property
    def job_header(self) -> str:
        """The directive lines of :meth:`job_script` (dask-jobqueue's attribute)."""
        return "\n".join(self.system.header(self.book.next_name()))

    @property
    def job_name(self) -> str:
        """The prefix of this cluster's job names (``jobqueue.<system>.name``, ``job_name``).

        Each job adds ``-<cluster id>-<n>`` so that workers map to their job.
        """
        return self.system.params["job_name"]

    @property
    def plan(self) -> set[str]:
        """Names of the workers the cluster aims for: those of jobs counted in its target."""
        with self._lock:
            return self.book.worker_names(self.book.active())

    @property
    def requested(self) -> set[str]:
        """Names of the workers of every job submitted and not yet ended.

        Jobs being cancelled are included.
        """
        with self._lock:
            return self.book.worker_names(self.book.live())

    @property
    def observed(self) -> set[str]:
        """Names of the workers connected to the scheduler now."""
        return {str(w.get("name", "")) for w in self.scheduler_info_workers().values()}

    def get_logs(self, cluster: bool = True, scheduler: bool = True,
                 workers: bool = True) -> dict[str, str]:
        """``{"Cluster": what this cluster did, <job name>: that job's log file, ...}``.

        A job's log holds the output of all its workers (one file per job, stderr joined).
        ``scheduler`` is accepted for dask's signature: the scheduler runs in this process
        and logs through :mod:`logging`.
        """
        logs: dict[str, str] = {}
        if cluster:
            logs["Cluster"] = "\n".join(self.diagnosis.notes)
        if workers:
            with self._lock:
                jobs = list(self.jobs.values())
            for job in jobs:
                logs[job.name] = self.diagnosis.log_tail(job, lines=10_000)
        return logs

    # ------------------------------------------------------------ submit / cancel
    def _submit(self, count: int, template: str = DEFAULT) -> None:
        """Submit ``count`` jobs of ``template`` (one array if ``job_array``).

        The caller holds the lock.
        """
        if count <= 0 or self._closed:
            return
        s = self.templates.system(template)
        s.run_command = self.system.run_command  # one runner: a replacement serves every template
        arrays = [count] if s.params["job_array"] and count > 1 else [None] * count
        for array in arrays:
            name = self.book.take_name(template)
            script = s.render(name, self.scheduler_address, self.secret_file, array)
            path = os.path.join(s.params["log_directory"], f"{name}.{s.script_suffix}")
            with open(path, "w") as f:
                f.write(script)
            self._scripts.append(path)
            job_id = s.submit(path, script)
            if array:
                first = s.array_first_index
                self.book.add(Job(i, s.element_name(name, first + k),
                                  s.element_log_file(name, first + k), s.params["processes"],
                                  template=template)
                              for k, i in enumerate(s.array_element_ids(job_id, array)))
            else:
                self.book.add([Job(job_id, name, s.log_file(name), s.params["processes"],
                                   template=template)])
            self.diagnosis.note(logging.INFO, "submitted %s %s (%s)", type(self).__name__,
                                job_id, name)

    def _cancel(self, jobs: list[Job], retire: bool) -> None:
        """Retire the workers of ``jobs`` (if asked), then cancel the jobs."""
        if not jobs:
            return
        with self._lock:
            self._take_events()
            for job in jobs:
                job.cancel_requested = True
            names = [n for job in jobs for n in job.workers.values()]
        if retire and names:
            try:
                self.scheduler.retire_workers(names=names, close=True)
            except Exception as e:  # cancelling below still frees the allocation
                logger.warning("graceful retirement of %s failed (%s): cancelling anyway", names, e)
        ids = [j.job_id for j in jobs]
        self.diagnosis.note(logging.INFO, "cancelling %s", " ".join(ids))
        try:
            self.system.cancel(ids)
        except runner.BatchCommandError as e:
            logger.error("cancelling jobs %s failed: %s (will retry at close)", ids, e)
            return
        with self._lock:
            self.book.cancelled(ids)

    # ------------------------------------------------------------ scaling
    def scale(self, n: int | None = None, jobs: int | None = None, memory: Any = None,
              cores: int | None = None, template: str | None = None) -> None:
        """Ask for ``n`` workers, or ``jobs`` jobs, or enough jobs for ``memory``/``cores``.

        They are jobs of job template ``template``, else of the cluster's own parameters.
        Asking for more than are queued submits at once, whatever the backoff of failed
        submissions said, and raises the batch system's error if that submission fails.
        """
        template = self.templates.check(template)
        system = self.templates.system(template)
        p = system.params
        if jobs is None:
            if n is not None:
                jobs = math.ceil(n / p["processes"]) if n > 0 else 0
            elif memory is not None:  # "0GB" is none, as in dask's SpecCluster.scale
                nbytes = parse_memory(memory, "memory", zero=True)
                jobs = math.ceil(nbytes / system.memory_bytes)
            elif cores is not None:
                jobs = math.ceil(cores / p["cores"])
            else:
                raise TypeError("scale() needs n (workers), jobs, memory or cores")
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
            raise ValueError(f"scale: the number of jobs must be a non-negative integer, got {jobs!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} is closed")
            if self.book.set_target(jobs, template):  # asked for more: try at once
                was = self.backoff.reset(time.time())
                if was:
                    self.diagnosis.note(logging.INFO, "scale(): submitting again after %s", was)
        self._adjust(raise_errors=True)

    def scale_up(self, n: int, template: str | None = None, **kwargs: Any) -> None:
        """Bring the number of workers (of ``template``) up to ``n`` (whole jobs).

        It never lowers the target. Adaptive calls this every second: unlike :meth:`scale`, it keeps to the backoff
        of failing submissions.
        """
        template = self.templates.check(template)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} is closed")
            self.book.raise_target(math.ceil(n / self.templates.workers_per_job(template)),
                                   template)
        self._adjust()

    def adapt(self, minimum: int = 0, maximum: float = math.inf,
              minimum_jobs: int | None = None, maximum_jobs: int | None = None,
              templates: dict[str, dict[str, Any]] | None = None,
              **kwargs: Any) -> Adaptive:
        """Scale with the load from now on, between ``minimum`` and ``maximum`` workers.

        As dask-jobqueue's (``minimum_jobs``/``maximum_jobs`` count jobs; dask's
        ``minimum_cores``, ``maximum_cores``, ``minimum_memory``, ``maximum_memory`` bound
        the workers' threads and memory); the keywords of :class:`~hpcsched.Adaptive` pass
        through. It also ends a pause of failing submissions: the user asks again. With job
        templates, the bounds are the default template's and each template grows from the
        waiting tasks only its workers can run (:mod:`hpcsched.launchers.adaptive_pools`),
        between its own bounds of ``templates`` (``{"gpu": dict(maximum_jobs=2)}``; else none
        and as many jobs as the default template's maximum).
        """
        minimum, maximum = params.adapt_bounds(
            minimum, maximum, kwargs, self.system.params["nthreads"],
            self.system.memory_bytes // self.system.params["processes"])
        with self._lock:
            was = self.backoff.reset(time.time())
        if was:
            self.diagnosis.note(logging.INFO, "adapt(): submitting again after %s", was)
        adaptive: Adaptive
        if self.templates.named:
            from hpcsched.launchers.adaptive_pools import PooledAdaptive

            pools = TemplatePools(self.templates, self.book, self._lock)
            adaptive = self._replace_adaptive(
                lambda lo, hi: PooledAdaptive(self.scheduler, self, pools, lo, hi,
                                              pools=templates, pool_keyword="template",
                                              **kwargs),
                minimum, maximum, minimum_jobs, maximum_jobs)
        elif templates:
            raise ValueError(f"adapt(templates={templates!r}): this cluster has no "
                             "job_templates")
        else:
            adaptive = super().adapt(minimum, maximum, minimum_jobs, maximum_jobs, **kwargs)
        settings = {"minimum": minimum, "maximum": maximum, "minimum_jobs": minimum_jobs,
                    "maximum_jobs": maximum_jobs, "templates": templates, **kwargs}
        self._adapt_settings = {k: v for k, v in settings.items() if v is not None}
        self._journal_jobs()
        return adaptive

    def scale_down(self, workers: list[str]) -> None:
        """Retire and cancel the jobs of these worker addresses (or names): whole jobs."""
        self._stop_workers(list(workers))

    # the Cluster base's hooks, in jobs
    def _requested(self) -> int:
        with self._lock:
            return sum(j.expected_workers for j in self.book.active())

    def _start_workers(self, count: int, **kwargs: Any) -> None:
        with self._lock:
            self.book.add_target(count)
        self._adjust()

    def _stop_workers(self, names: list[str]) -> None:
        with self._lock:
            self._take_events()
            jobs = self.book.stop(names)
        self._cancel(jobs, retire=True)
        self._journal_jobs()

    def _close_workers(self, timeout: float) -> None:
        if self._journal.enabled:
            # closed on purpose: the jobs are cancelled, and a restart has none to adopt
            self._journal.save(None)
            self._finalizer_jobs.detach()
            cleanup.unregister(self._finalizer_jobs)
            cleanup.cancel_all_live(self.system, self.book.live_ids, self.secret_file,
                                    self.scheduler)
            return
        self._finalizer_jobs()  # cancels live jobs, removes the secret, closes the scheduler
        cleanup.unregister(self._finalizer_jobs)

    def _adjust(self, raise_errors: bool = False) -> None:
        """Submit or cancel jobs to meet the book's target.

        A failed submission is noted and shown (:meth:`problems`, the scheduler's events)
        and raised only for ``raise_errors`` (the user's own ``scale()``): adaptive and
        the poll thread retry on the backoff's schedule. A job submitted is in the journal
        (if any) before this returns.
        """
        try:
            with self._lock:
                if self._closed:
                    return
                self._take_events()
                now = time.time()
                if self._succession is not None:
                    for job in self.book.replace_ahead(now, self._succession):
                        self.diagnosis.note(logging.INFO, "job %s (%s) ends in about %.0f s: "
                                            "submitting its replacement", job.job_id, job.name,
                                            self._succession.life - now + (
                                                job.connected_at or now))
                todos = self.book.adjustments()
                submit = [t for t in todos if t.submit]
                if submit and self.backoff.may_submit(now):  # else: wait (submissions.py)
                    try:
                        for todo in submit:
                            self._submit(todo.submit, todo.template)
                    except runner.BatchCommandError as e:
                        self.backoff.failed(now, str(e))
                        why = f"submission failed: {self.backoff.describe(now)}"
                        self.diagnosis.note(logging.ERROR, "%s", why)
                        self.diagnosis.event(why)
                        if raise_errors:
                            raise
                        return
                    if self.backoff.failures:
                        self.diagnosis.note(logging.INFO, "submission succeeded after %d "
                                            "failed", self.backoff.failures)
                        self.diagnosis.event("submission succeeded: submitting as usual again")
                    self.backoff.submitted(now)
            self._cancel([j for t in todos for j in t.cancel], retire=True)
        finally:
            self._journal_jobs()

    # ------------------------------------------------------------ status
    def _worker_event(self, event: str, address: str, info: dict | None = None) -> None:
        """Scheduler callback, on its loop thread: queue the event.

        It never blocks on our lock, which a submission may hold for seconds.
        """
        name = ""
        if event == "add":
            if info is None:  # the callback gives only the address: read the name there
                ws = getattr(getattr(self.scheduler, "state", None), "workers", {}).get(address)
                info = {"name": getattr(ws, "name", "")}
            name = str(info.get("name", ""))
        self._events.append((event, address, name, time.time()))
        self._wake.set()

    def _take_events(self, connected: dict[str, str] | None = None) -> None:
        """Apply the queued worker joins and leaves to the book; caller holds the lock.

        ``connected``: the workers connected now (address -> name), to sync the book with.
        """
        joined: list[str] = []
        while self._events:
            event, address, name, when = self._events.popleft()
            if event != "add":
                self.book.worker_left(address)
            elif self.book.worker_joined(address, name, when) is not None:
                joined.append(name)
        if connected is not None:
            joined += self.book.sync_workers(connected)
        for name in joined:
            self.backoff.worker_connected()
            self.diagnosis.worker_connected(name)

    def unit_of(self, worker_name: str) -> str:
        """The job a worker belongs to (Adaptive retires the workers of one job together)."""
        with self._lock:
            job = self.book.job_of_worker(worker_name)
        return job.job_id if job is not None else ""

    def poll(self) -> None:
        """Update every live job's state with one status command (the poll thread calls this)."""
        try:
            info = self.scheduler.workers_info()
        except Exception:  # scheduler closing
            info = None
        with self._lock:
            self._take_events(None if info is None else
                              {a: str(w.get("name", "")) for a, w in info.items()})
            ids = [j.job_id for j in self.book.live()]
        if not ids:
            self._adjust()  # submissions that failed are retried when the backoff allows
            return
        statuses = self.system.status(ids)
        now = time.time()
        with self._lock:
            ended = self.book.apply_status(statuses, ids, now)
            for job in ended:
                ending = self.book.settle(job)
                if ending is Ending.FAILED:
                    message = self.diagnosis.failure(job)
                    self.backoff.job_died(now, message)
                    self.diagnosis.note(logging.ERROR, "%s", message)
                    self.diagnosis.event(f"job {job.job_id} ended before a worker connected; "
                                         f"{self.backoff.describe(now)}")
                else:
                    logger.log(logging.INFO if ending is Ending.FINISHED else logging.DEBUG,
                               "job %s (%s) ended: %s (%s)", job.job_id, job.name,
                               job.state.value, ending.value)
            silent = [] if self.diagnosis.unreachable else \
                self.book.silent(now, self.diagnosis.connect_timeout)
        if silent:
            said = self.diagnosis.read_silent(silent)  # logs read without the lock
            with self._lock:
                self.diagnosis.report_silent(said, now)
        if ended or self.diagnosis.unreachable:
            self._wake.set()
        stuck = [j for j in ended if self.system.stuck_in_queue(j.native_state)]
        if stuck:  # SGE's Eqw: failed, yet it would sit in the queue forever
            self._cancel(stuck, retire=False)
        self._adjust()  # replaces ended jobs; failed submissions retry when the backoff allows

    def wait_for_workers(self, n: int, timeout: float | None = 60.0) -> None:
        """Block until ``n`` workers are connected; JobFailedError if a job died first.

        ``timeout=None`` waits as long as it takes, as the base class does.
        """
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with self._lock:
            seen_failures = 0 if self.book.failed_since_scale else len(self.failed_jobs)
        said = time.monotonic()  # a long wait says, every few seconds, what the jobs do
        while True:
            with self._lock:
                self._take_events()
                connected = self.book.connected()
                if connected >= n:
                    return
                if len(self.failed_jobs) > seen_failures:
                    raise JobFailedError(self.diagnosis.failure(self.failed_jobs[-1]))
                if self.diagnosis.unreachable:
                    raise SchedulerUnreachableError(self.diagnosis.unreachable)
                jobs = list(self.jobs.values())
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{connected} of {n} workers connected after {timeout:g} s; "
                                   f"jobs: {self.job_summary()}"
                                   f"{self.diagnosis.silent_log(jobs)}")
            if time.monotonic() - said >= WAIT_REPORT_EVERY:
                said = time.monotonic()
                print(f"waiting for workers: {connected} of {n} connected; jobs: "
                      f"{self.job_summary()}", file=sys.stderr, flush=True)
            self._wake.wait(min(left, 0.5))
            self._wake.clear()

    def job_summary(self) -> str:
        """The jobs counted by state, e.g. ``"2 running, 1 pending"`` (``"none"``)."""
        with self._lock:
            return self.book.summary()

    def problems(self) -> list[str]:
        """What keeps this cluster from getting workers, one line each.

        Failing submissions, workers that cannot connect; the repr and the notebook
        widget show them.
        """
        out = []
        if getattr(self, "backoff", None) is not None and self.backoff.failing:
            out.append(self.backoff.describe(time.time()))
        diagnosis = getattr(self, "diagnosis", None)
        if diagnosis is not None and diagnosis.unreachable:
            out.append(diagnosis.unreachable.splitlines()[0])
        return out

    def __repr__(self) -> str:
        problems = "".join(f"; {p}" for p in self.problems())
        return (f"<{type(self).__name__} {getattr(self, 'scheduler_address', '?')} "
                f"jobs: {self.job_summary() if hasattr(self, 'book') else '?'}{problems}>")

    # ------------------------------------------------------------ close
    def close(self, timeout: float = 10) -> None:
        """Cancel every job this cluster submitted and stop the scheduler. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self.book.stop_all()
        self._stop.set()
        if self._poller is not threading.current_thread():
            self._poller.join(timeout)
        try:
            self.scheduler.remove_worker_callback(self._callback)
        except Exception:
            pass
        super().close(timeout)  # adaptive stops; _close_workers cancels; scheduler closes
        for path in self._scripts:
            try:
                os.unlink(path)
            except OSError:
                pass


def _locked(lock: Any, fn: Any) -> Any:
    with lock:
        return fn()


def _weak_callback(cluster: JobQueueCluster) -> Any:
    ref = weakref.ref(cluster)

    def on_worker(event: str, address: str, info: dict | None = None) -> None:
        c = ref()
        if c is not None:
            c._worker_event(event, address, info)

    return on_worker


def _poll_loop(ref: weakref.ref, stop: threading.Event) -> None:
    """The polling thread: holds the cluster only weakly, so that it can be collected."""
    interval = float(config.read(JobQueueSettings).poll_interval)
    while not stop.wait(interval):
        cluster = ref()
        if cluster is None:
            return
        try:
            cluster.poll()
        except runner.BatchCommandError as e:
            logger.warning("job status poll failed: %s", e)
        except Exception:
            logger.exception("job status poll failed")
        del cluster
