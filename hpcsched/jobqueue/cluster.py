"""``JobQueueCluster``: a scheduler in the client process, workers as batch jobs.

The cluster owns what is the same on every batch system; the per-system adapter
(:class:`hpcsched.jobqueue.base.BatchSystem`) owns commands and formats.

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
  have their workers retired gracefully first. Jobs whose workers retired at
  walltime are replaced while the target asks for them.
* **Nothing leaks** (:mod:`hpcsched.jobqueue.cleanup`).
* **A journaled scheduler outlives its process** (``scheduler_journal=J``,
  :mod:`hpcsched.jobqueue.adoption`): the jobs the cluster owns are in the journal; a
  process that ends without ``close()`` (killed, a kernel restart, interpreter exit)
  leaves them running, their workers waiting for the scheduler, and a cluster made again
  with the same journal adopts those still queued or running. ``close()`` cancels them.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import re
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import hpcsched.jobqueue.cleanup as cleanup
import hpcsched.jobqueue.runner as runner
from hpcsched.core import config
from hpcsched.core.comm.base import Security
from hpcsched.core.comm.hosts import describe_interfaces, routable_addresses
from hpcsched.core.comm.scheduler_file import write_secret_file
from hpcsched.jobqueue.adoption import (
    ClusterJournal,
    adoptable,
    check_section,
    cluster_section,
    job_from_record,
)
from hpcsched.jobqueue.base import BatchSystem
from hpcsched.jobqueue.job import Job, JobState, parse_memory
from hpcsched.jobqueue.submissions import SubmissionBackoff
from hpcsched.launchers.address import choose_scheduler_host
from hpcsched.launchers.cluster import Cluster

if TYPE_CHECKING:
    from hpcsched.launchers.adaptive import Adaptive

logger = logging.getLogger(__name__)
WAIT_REPORT_EVERY = 5.0  # seconds: wait_for_workers prints the jobs' states this often

LOG_TAIL_LINES = 20
GONE_AFTER = 5.0  # seconds without status or accounting record before a job counts as gone


class JobFailedError(RuntimeError):
    """A batch job ended before its workers connected."""


class SchedulerUnreachableError(ConnectionError):
    """Jobs run, but their workers' logs say they cannot reach the scheduler."""


#: what a worker logs when it cannot connect (core/worker/parts/link.py, SchedulerLink._connect)
UNREACHABLE = re.compile(r"(?:cannot|could not) reach the scheduler at .*")


def read_tail(path: str, lines: int = LOG_TAIL_LINES,
              clean: Callable[[str], str] | None = None) -> str:
    """The last ``lines`` of a job's log; ``clean`` drops what the batch system appended."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-256 * 1024:]
    except FileNotFoundError:
        return f"(log file {path} does not exist)"
    except OSError as e:
        return f"(cannot read log file {path}: {e})"
    if clean is not None:
        text = clean(text)
    return runner.tail(text, lines) or f"(log file {path} is empty)"


class JobQueueCluster(Cluster):
    """Base of SLURMCluster, SGECluster, PBSCluster, LSFCluster (see module docstring)."""

    system_class: ClassVar[type[BatchSystem]]

    def __init__(self, n_workers: int = 0, security: Security | bool | None = None,
                 name: str | None = None, silence_logs: Any = None, asynchronous: bool = False,
                 loop: Any = None, scheduler_cls: Any = None,
                 job_cls: type[BatchSystem] | None = None, dashboard_address: Any = None,
                 host: str | None = None, scheduler_journal: str | None = None,
                 **kwargs: Any) -> None:
        """Take dask-jobqueue's cluster keywords, then the job parameters.

        The job parameters (``cores``, ``memory``, ...) are those of
        :mod:`hpcsched.jobqueue.params`. Keywords that mean nothing here (``loop``,
        ``scheduler_cls``, ``silence_logs``) are accepted and logged as ignored.
        ``scheduler_journal``: the scheduler keeps a journal there (``scheduler.journal``);
        made again with the same journal after its process died, the cluster takes up its
        graphs, its address and the jobs still queued or running
        (:mod:`hpcsched.jobqueue.adoption`).
        """
        # every check that can fail runs before anything is started or submitted
        for what, value in (("host", host), ("dashboard_address", dashboard_address)):
            if value is not None:
                raise ValueError(f"Please pass {what!r} through 'scheduler_options': use "
                                 f"{type(self).__name__}(..., scheduler_options="
                                 f"{{{what!r}: {value!r}}})")
        if asynchronous:
            raise ValueError(f"{type(self).__name__}(asynchronous=True): hpcsched's clusters "
                             "are synchronous objects (no 'await cluster'); run them from a "
                             "thread with loop.run_in_executor if an event loop needs one")
        for what, value, why in (
                ("loop", loop, "the scheduler runs its own event loop thread"),
                ("scheduler_cls", scheduler_cls, "an hpcsched scheduler is always started"),
                ("silence_logs", silence_logs, "hpcsched leaves logging to the application "
                 "(logging.getLogger('hpcsched').setLevel(...))")):
            if value is not None:
                logger.info("%s: %s=%r is ignored: %s", type(self).__name__, what, value, why)
        system_class = getattr(self, "system_class", None) if job_cls is None else job_cls
        if system_class is None:
            raise ValueError("JobQueueCluster needs a batch system: use SLURMCluster, SGECluster, "
                             "PBSCluster or LSFCluster, or pass job_cls=<a BatchSystem subclass>")
        if not (isinstance(system_class, type) and issubclass(system_class, BatchSystem)):
            raise TypeError(f"job_cls={job_cls!r}: hpcsched's clusters take a BatchSystem "
                            "subclass (dask-jobqueue's Job classes do not apply)")
        self.system = system_class(**kwargs)
        self.backoff = SubmissionBackoff.from_config()
        self._connect_timeout = float(config.get("jobqueue.connect-timeout"))
        #: why the workers cannot reach the scheduler ("" while nothing says so)
        self.unreachable = ""
        p = self.system.params
        self.name = name or type(self).__name__
        self.workers_per_unit = p["processes"]
        opts = p["scheduler_options"]
        # the dashboard's address, as dask-jobqueue takes it (else diagnostics.dashboard.address)
        dashboard = {"dashboard_address": opts["dashboard_address"]} \
            if opts.get("dashboard_address") is not None else None
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
        self.cluster_id = secrets.token_hex(3)
        self.jobs: dict[str, Job] = {}
        self.failed_jobs: list[Job] = []
        self._target_jobs = 0
        self._failed_since_scale = 0
        self._next_index = 0
        self._live_ids: set[str] = set()
        self._scripts: list[str] = []
        self._notes: collections.deque[str] = collections.deque(maxlen=1000)  # get_logs()
        self.security = security
        self._adapt_settings: dict[str, Any] | None = None  # what adapt() was called with
        os.makedirs(p["log_directory"], exist_ok=True)
        scheduler_kwargs = dict(dashboard or {})
        if scheduler_journal is not None:
            scheduler_kwargs["journal"] = scheduler_journal
        super().__init__(f"tcp://{host}:{int(opts.get('port') or 0)}", security,
                         scheduler_kwargs)
        self._journal = ClusterJournal(self.scheduler)
        try:
            saved = self._journal.load()
            if saved is not None:  # a restart: the jobs and names of the cluster that was
                saved = check_section(saved, self.system.system, type(self).__name__)
                self.cluster_id = str(saved["cluster_id"])
                self._next_index = int(saved["next_index"])
                self._target_jobs = int(saved["target_jobs"])
            # the scheduler's secret: a restored one when the journal had it
            self.secret_file = self._write_secret(self.security)
        except BaseException:
            self._stop_scheduler()
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
                                                    self._live_ids, self.secret_file,
                                                    self.scheduler)
        self._callback = _weak_callback(self)
        self.scheduler.add_worker_callback(self._callback)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=_poll_loop, args=(weakref.ref(self), self._stop),
                                        name=f"{type(self).__name__}-poll", daemon=True)
        if saved is not None:
            self._adopt(saved)
        self._poller.start()
        if n_workers:
            self.scale(n_workers)
        if saved is not None and saved.get("adapt") is not None and self.adaptive is None:
            self.adapt(**saved["adapt"])
        self._journal_jobs()

    def _stop_scheduler(self) -> None:
        """The constructor failed after the scheduler started: stop it.

        A journaled one stops without closing the workers that came back to it: a next
        attempt adopts them.
        """
        self._finalizer.detach()
        self.scheduler.close(timeout=2, detach=self.scheduler.journal is not None)

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
        with self._lock:
            for job in keep:
                self.jobs[job.job_id] = job
                self._live_ids.add(job.job_id)
        self._note(logging.INFO, "adopted %d job(s) of cluster %s from the journal %s: %s%s",
                   len(keep), self.cluster_id, self.scheduler.journal.path
                   if self.scheduler.journal is not None else "",
                   " ".join(j.job_id for j in keep) or "none",
                   f"; ended meanwhile: {' '.join(j.job_id for j in ended)}" if ended else "")
        self._event(f"adopted jobs {' '.join(j.job_id for j in keep) or 'none'} after a restart")
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
                self.system.system, self.cluster_id, self._next_index, self._target_jobs,
                [j for j in self.jobs.values() if not j.ended], adapt))

    # ------------------------------------------------------------ setup
    def _write_secret(self, security: Security) -> str:
        p = self.system.params
        directory = p["log_directory"]
        if p["shared_temp_directory"]:  # dask-jobqueue's place for files workers must read
            directory = os.path.abspath(os.path.expanduser(os.path.expandvars(
                p["shared_temp_directory"])))
            os.makedirs(directory, exist_ok=True)
        try:
            self._secret = write_secret_file(directory, self.cluster_id, security)
        except FileExistsError:
            raise RuntimeError(
                f"{type(self).__name__}: the secret file of cluster {self.cluster_id} in "
                f"{directory} is held by a live process: another cluster runs on this "
                "journal; close it first (one journal serves one cluster at a time)") from None
        return self._secret.path

    # ------------------------------------------------------------ scripts
    def _job_name(self, index: int) -> str:
        return f"{self.system.params['job_name']}-{self.cluster_id}-{index}"

    def job_script(self, array: int | None = None) -> str:
        """The script the next submission will use (``array=N``: an N-element job array)."""
        return self.system.render(self._job_name(self._next_index), self.scheduler_address,
                                  self.secret_file, array=array)

    @property
    def job_header(self) -> str:
        """The directive lines of :meth:`job_script` (dask-jobqueue's attribute)."""
        return "\n".join(self.system.header(self._job_name(self._next_index)))

    @property
    def job_name(self) -> str:
        """The prefix of this cluster's job names (``jobqueue.<system>.name``, ``job_name``).

        Each job adds ``-<cluster id>-<n>`` so that workers map to their job.
        """
        return self.system.params["job_name"]

    def _expected_workers(self, jobs: list[Job]) -> set[str]:
        return {n for j in jobs for n in j.worker_names()}

    @property
    def plan(self) -> set[str]:
        """Names of the workers the cluster aims for: those of jobs counted in its target."""
        with self._lock:
            return self._expected_workers([j for j in self.jobs.values() if j.active])

    @property
    def requested(self) -> set[str]:
        """Names of the workers of every job submitted and not yet ended.

        Jobs being cancelled are included.
        """
        with self._lock:
            return self._expected_workers([j for j in self.jobs.values() if not j.ended])

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
            logs["Cluster"] = "\n".join(self._notes)
        if workers:
            with self._lock:
                jobs = list(self.jobs.values())
            for job in jobs:
                logs[job.name] = read_tail(job.log_file, lines=10_000,
                                           clean=self.system.job_output)
        return logs

    def _note(self, level: int, msg: str, *args: Any) -> None:
        """Log, and keep the line for :meth:`get_logs`."""
        logger.log(level, msg, *args)
        self._notes.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg % args}")

    # ------------------------------------------------------------ submit / cancel
    def _submit(self, count: int) -> list[Job]:
        """Submit ``count`` jobs (one array if ``job_array``); caller holds the lock."""
        if count <= 0 or self._closed:
            return []
        arrays = [count] if self.system.params["job_array"] and count > 1 else [None] * count
        new: list[Job] = []
        for array in arrays:
            name = self._job_name(self._next_index)
            self._next_index += 1
            script = self.system.render(name, self.scheduler_address, self.secret_file, array)
            path = os.path.join(self.system.params["log_directory"], f"{name}.sh")
            with open(path, "w") as f:
                f.write(script)
            self._scripts.append(path)
            job_id = self.system.submit(path, script)
            if array:
                ids = self.system.array_element_ids(job_id, array)
                first = self.system.array_first_index
                jobs = [Job(i, self.system.element_name(name, first + k),
                            self.system.element_log_file(name, first + k),
                            self.system.params["processes"]) for k, i in enumerate(ids)]
            else:
                jobs = [Job(job_id, name, self.system.log_file(name),
                            self.system.params["processes"])]
            for job in jobs:
                self.jobs[job.job_id] = job
                self._live_ids.add(job.job_id)
            new += jobs
            self._note(logging.INFO, "submitted %s %s (%s)", type(self).__name__, job_id, name)
        return new

    def _cancel(self, jobs: list[Job], retire: bool) -> None:
        """Retire the workers of ``jobs`` (if asked), then cancel the jobs."""
        if not jobs:
            return
        with self._lock:
            self._drain_events()
            for job in jobs:
                job.cancel_requested = True
            names = [n for job in jobs for n in job.workers.values()]
        if retire and names:
            try:
                self.scheduler.retire_workers(names=names, close=True)
            except Exception as e:  # cancelling below still frees the allocation
                logger.warning("graceful retirement of %s failed (%s): cancelling anyway", names, e)
        ids = [j.job_id for j in jobs]
        self._note(logging.INFO, "cancelling %s", " ".join(ids))
        try:
            self.system.cancel(ids)
        except runner.BatchCommandError as e:
            logger.error("cancelling jobs %s failed: %s (will retry at close)", ids, e)
            return
        with self._lock:
            self._live_ids.difference_update(ids)

    # ------------------------------------------------------------ scaling
    def scale(self, n: int | None = None, jobs: int | None = None, memory: Any = None,
              cores: int | None = None) -> None:
        """Ask for ``n`` workers, or ``jobs`` jobs, or enough jobs for ``memory``/``cores``.

        Asking for more than are queued submits at once, whatever the backoff of failed
        submissions said, and raises the batch system's error if that submission fails.
        """
        p = self.system.params
        if jobs is None:
            if n is not None:
                jobs = math.ceil(n / p["processes"]) if n > 0 else 0
            elif memory is not None:
                jobs = math.ceil(parse_memory(memory, "memory") / self.system.memory_bytes)
            elif cores is not None:
                jobs = math.ceil(cores / p["cores"])
            else:
                raise TypeError("scale() needs n (workers), jobs, memory or cores")
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
            raise ValueError(f"scale: the number of jobs must be a non-negative integer, got {jobs!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} is closed")
            self._target_jobs = jobs
            self._failed_since_scale = 0
            if jobs > sum(1 for j in self.jobs.values() if j.active):
                self._resume_submissions("scale()")  # asked for more: try at once
        self._adjust(raise_errors=True)

    def scale_up(self, n: int, **kwargs: Any) -> None:
        """Bring the number of workers up to ``n`` (whole jobs); never lowers the target.

        Adaptive calls this every second: unlike :meth:`scale`, it keeps to the backoff
        of failing submissions.
        """
        jobs = math.ceil(n / self.system.params["processes"])
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} is closed")
            self._target_jobs = max(jobs, self._target_jobs)
        self._adjust()

    def adapt(self, minimum: int = 0, maximum: float = math.inf,
              minimum_jobs: int | None = None, maximum_jobs: int | None = None,
              **kwargs: Any) -> Adaptive:
        """Scale with the load from now on, between ``minimum`` and ``maximum`` workers.

        As dask-jobqueue's (``minimum_jobs``/``maximum_jobs`` count jobs); the keywords of
        :class:`~hpcsched.Adaptive` pass through. It also ends a pause of failing
        submissions: the user asks again.
        """
        with self._lock:
            self._resume_submissions("adapt()")
        adaptive = super().adapt(minimum, maximum, minimum_jobs, maximum_jobs, **kwargs)
        settings = {"minimum": minimum, "maximum": maximum, "minimum_jobs": minimum_jobs,
                    "maximum_jobs": maximum_jobs, **kwargs}
        self._adapt_settings = {k: v for k, v in settings.items() if v is not None}
        self._journal_jobs()
        return adaptive

    def _resume_submissions(self, why: str) -> None:
        if self.backoff.failing:
            self._note(logging.INFO, "%s: submitting again after %s", why,
                       self.backoff.describe(time.time()))
        self.backoff.reset()

    def scale_down(self, workers: list[str]) -> None:
        """Retire and cancel the jobs of these worker addresses (or names): whole jobs."""
        self._stop_workers(list(workers))

    # the Cluster base's hooks, in jobs
    def _requested(self) -> int:
        with self._lock:
            return sum(1 for j in self.jobs.values() if j.active) * self.workers_per_unit

    def _start_workers(self, count: int, **kwargs: Any) -> None:
        with self._lock:
            self._target_jobs += count
        self._adjust()

    def _stop_workers(self, names: list[str]) -> None:
        with self._lock:
            self._drain_events()
            wanted = set(names)
            jobs = [j for j in self.jobs.values() if not j.ended and not j.cancel_requested
                    and (wanted & set(j.workers) or wanted & set(j.workers.values()))]
            self._target_jobs = max(0, self._target_jobs - len(jobs))
        self._cancel(jobs, retire=True)
        self._journal_jobs()

    def _close_workers(self, timeout: float) -> None:
        if self._journal.enabled:
            # closed on purpose: the jobs are cancelled, and a restart has none to adopt
            self._journal.save(None)
            self._finalizer_jobs.detach()
            cleanup.unregister(self._finalizer_jobs)
            cleanup.cancel_all_live(self.system, self._live_ids, self.secret_file,
                                    self.scheduler)
            return
        self._finalizer_jobs()  # cancels live jobs, removes the secret, closes the scheduler
        cleanup.unregister(self._finalizer_jobs)

    def _adjust(self, raise_errors: bool = False) -> None:
        """Submit or cancel jobs to meet the target (see :meth:`_meet_target`).

        A job submitted is in the journal (if any) before this returns.
        """
        try:
            self._meet_target(raise_errors)
        finally:
            self._journal_jobs()

    def _meet_target(self, raise_errors: bool = False) -> None:
        """Submit or cancel jobs to meet the target.

        A failed submission is noted and shown (:meth:`problems`, the scheduler's events)
        and raised only for ``raise_errors`` (the user's own ``scale()``): adaptive and
        the poll thread retry on the backoff's schedule.
        """
        with self._lock:
            if self._closed:
                return
            self._drain_events()
            active = [j for j in self.jobs.values() if j.active]
            deficit = self._target_jobs - len(active)
            if deficit > 0:
                now = time.time()
                if not self.backoff.may_submit(now):
                    return  # failing submissions wait (jobqueue/submissions.py)
                try:
                    self._submit(deficit)
                except runner.BatchCommandError as e:
                    self.backoff.failed(now, str(e))
                    self._note(logging.ERROR, "submission failed: %s", self.backoff.describe(now))
                    self._event(f"submission failed: {self.backoff.describe(now)}")
                    if raise_errors:
                        raise
                    return
                if self.backoff.failures:
                    self._note(logging.INFO, "submission succeeded after %d failed",
                               self.backoff.failures)
                    self._event("submission succeeded: submitting as usual again")
                self.backoff.submitted(now)
                return
            excess = len(active) - self._target_jobs
            if excess <= 0:
                return
            # newest first among the pending, then running ones with the fewest workers
            order = sorted(active, key=lambda j: (j.state is JobState.RUNNING or bool(j.workers),
                                                  len(j.workers), -j.submit_time))
            victims = order[:excess]
            for job in victims:
                job.cancel_requested = True
        self._cancel(victims, retire=True)

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
        self._events.append((event, address, name))
        self._wake.set()

    def _drain_events(self) -> None:
        """Apply queued worker joins/leaves to the jobs; caller holds the lock."""
        while self._events:
            event, address, name = self._events.popleft()
            if event != "add":
                for job in self.jobs.values():
                    job.workers.pop(address, None)
                continue
            owner = self._job_of_worker(name)
            if owner is not None:
                self._connected(owner, address, name)

    def _connected(self, job: Job, address: str, name: str) -> None:
        """A worker of ``job`` is connected; caller holds the lock."""
        job.workers[address] = name
        job.workers_seen.add(name)
        self.backoff.worker_connected()
        if self.unreachable:
            self._note(logging.INFO, "worker %s connected: the scheduler is reachable", name)
            self.unreachable = ""

    def unit_of(self, worker_name: str) -> str:
        """The job a worker belongs to (Adaptive retires the workers of one job together)."""
        job = self._job_of_worker(worker_name)
        return job.job_id if job is not None else ""

    def _job_of_worker(self, name: str) -> Job | None:
        for job in list(self.jobs.values()):  # a snapshot: other threads may add jobs
            if job.owns_worker(name):
                return job
        return None

    def _sync_workers(self) -> None:
        try:
            info = self.scheduler.workers_info()
        except Exception:  # scheduler closing
            return
        with self._lock:
            for job in self.jobs.values():
                job.workers = {a: w for a, w in job.workers.items() if a in info}
            for address, winfo in info.items():
                name = str(winfo.get("name", ""))
                owner = self._job_of_worker(name)
                if owner is not None:
                    self._connected(owner, address, name)

    def poll(self) -> None:
        """Update every live job's state with one status command (the poll thread calls this)."""
        self._sync_workers()
        with self._lock:
            self._drain_events()
            ids = [j.job_id for j in self.jobs.values() if not j.ended]
        if not ids:
            self._adjust()  # submissions that failed are retried when the backoff allows
            return
        statuses = self.system.status(ids)
        ended: list[Job] = []
        with self._lock:
            for job_id in ids:
                job = self.jobs[job_id]
                status = statuses.get(job_id)
                if status is None:
                    job.missing_polls += 1
                    if job.missing_since is None:
                        job.missing_since = time.time()
                    # not a race right after submission, and time for the accounting record
                    # (SGE's qacct lags a second or more) to tell how it ended
                    job.gone = job.missing_polls >= 3 and (
                        job.cancel_requested or time.time() - job.missing_since >= GONE_AFTER)
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
                        job.running_since = time.time()
                if job.ended and job.end_time is None:
                    job.end_time = time.time()
                    self._live_ids.discard(job_id)
                    ended.append(job)
            for job in ended:
                self._job_ended(job)
        self._check_silent_jobs(time.time())
        if ended or self.unreachable:
            self._wake.set()
        stuck = [j for j in ended if self.system.stuck_in_queue(j.native_state)]
        if stuck:  # SGE's Eqw: failed, yet it would sit in the queue forever
            self._cancel(stuck, retire=False)
        self._adjust()  # replaces ended jobs; failed submissions retry when the backoff allows

    def _job_ended(self, job: Job) -> None:
        if job.cancel_requested:
            logger.debug("job %s ended after cancel (%s)", job.job_id, job.state.value)
            return
        if job.workers_seen:
            logger.info("job %s (%s) ended: %s; its workers had connected", job.job_id,
                        job.name, job.state.value)
            return
        self.failed_jobs.append(job)
        self._failed_since_scale += 1
        message = self._failure_message(job)
        self.backoff.job_died(time.time(), message)
        self._note(logging.ERROR, "%s", message)
        self._event(f"job {job.job_id} ended before a worker connected; "
                    f"{self.backoff.describe(time.time())}")

    def _check_silent_jobs(self, now: float) -> None:
        """Report jobs running ``jobqueue.connect-timeout`` s with no worker connected.

        What their logs say is logged once per job; when that is "cannot reach the
        scheduler", :attr:`unreachable` says why (until a worker connects). The logs are
        read without holding the lock: a shared file system may be slow.
        """
        with self._lock:
            if self.unreachable:
                return
            silent = [j for j in self.jobs.values()
                      if j.state is JobState.RUNNING and not j.workers_seen
                      and not j.cancel_requested and j.running_since is not None
                      and now - j.running_since >= self._connect_timeout]
        if not silent:
            return
        said = []
        for job in silent:
            text = read_tail(job.log_file, clean=self.system.job_output)
            found = UNREACHABLE.findall(text)
            said.append((job, found[-1] if found else "", text))
        with self._lock:
            cannot = [(job, line) for job, line, _ in said if line and not job.workers_seen]
            if cannot and not self.unreachable:
                job, line = cannot[0]
                since = min(j.running_since or now for j in silent)
                self.unreachable = self._unreachable_message(len(silent), now - since, job, line)
                self._note(logging.ERROR, "%s", self.unreachable)
                self._event(self.unreachable)
                return
            for job, _, text in said:
                if not job.silence_reported and not job.workers_seen:
                    job.silence_reported = True
                    self._note(logging.WARNING, "batch job %s (%s) has run for %.0f s and none "
                               "of its workers has connected to %s yet; tail of %s:\n%s",
                               job.job_id, job.name, now - (job.running_since or now),
                               self.scheduler_address, job.log_file, text)

    def _unreachable_message(self, jobs: int, seconds: float, job: Job, line: str) -> str:
        name = type(self).__name__
        return (f"{jobs} job{'s' * (jobs > 1)} running for {seconds:.0f} s, and no worker "
                f"connected: the workers cannot reach the scheduler at "
                f"{self.scheduler_address} (chosen as {self.address_choice.how}). "
                f"Job {job.job_id}'s log ({job.log_file}) says: {line.strip()}\n"
                f"This host's interfaces: {describe_interfaces()}. If the compute nodes reach "
                f"this host on another network, name its interface: {name}(..., "
                f"scheduler_options={{'interface': '<name>'}}) (interface='<name>' sets the "
                f"workers' interface too), or its address: scheduler_options={{'host': "
                f"'<address>'}}.")

    def _event(self, text: str) -> None:
        """Show ``text`` in the scheduler's events (dashboard, performance reports)."""
        recorder = getattr(getattr(self.scheduler, "state", None), "recorder", None)
        if recorder is not None:
            recorder.event("jobqueue", text, time.time())  # a deque append: thread-safe

    def _failure_message(self, job: Job) -> str:
        how = "vanished from the queue" if job.gone and not job.state.terminal else \
            f"ended {job.state.value} ({job.native_state or '?'}" + \
            (f", exit code {job.exit_code})" if job.exit_code is not None else ")")
        return (f"batch job {job.job_id} ({job.name}) {how} before any of its workers "
                f"connected to {self.scheduler_address}; tail of {job.log_file}:\n"
                f"{read_tail(job.log_file, clean=self.system.job_output)}")

    def wait_for_workers(self, n: int, timeout: float | None = 60.0) -> None:
        """Block until ``n`` workers are connected; JobFailedError if a job died first.

        ``timeout=None`` waits as long as it takes, as the base class does.
        """
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with self._lock:
            seen_failures = 0 if self._failed_since_scale else len(self.failed_jobs)
        said = time.monotonic()  # a long wait says, every few seconds, what the jobs do
        while True:
            with self._lock:
                self._drain_events()
                connected = sum(len(j.workers) for j in self.jobs.values())
                if connected >= n:
                    return
                if len(self.failed_jobs) > seen_failures:
                    raise JobFailedError(self._failure_message(self.failed_jobs[-1]))
                if self.unreachable:
                    raise SchedulerUnreachableError(self.unreachable)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{connected} of {n} workers connected after {timeout:g} s; "
                                   f"jobs: {self.job_summary()}{self._silent_log()}")
            if time.monotonic() - said >= WAIT_REPORT_EVERY:
                said = time.monotonic()
                print(f"waiting for workers: {connected} of {n} connected; jobs: "
                      f"{self.job_summary()}", file=sys.stderr, flush=True)
            self._wake.wait(min(left, 0.5))
            self._wake.clear()

    def _silent_log(self) -> str:
        """The tail of the log of a running job none of whose workers connected, if any."""
        with self._lock:
            silent = [j for j in self.jobs.values()
                      if j.state is JobState.RUNNING and not j.workers_seen]
        if not silent:
            return ""
        job = silent[0]
        return (f"; no worker of running job {job.job_id} connected to {self.scheduler_address}"
                f"; tail of {job.log_file}:\n{read_tail(job.log_file, clean=self.system.job_output)}")

    def job_summary(self) -> str:
        """The jobs counted by state, e.g. ``"2 running, 1 pending"`` (``"none"``)."""
        with self._lock:
            counts: dict[str, int] = {}
            for j in self.jobs.values():
                key = "gone" if j.gone and not j.state.terminal else j.state.value
                counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none"

    def problems(self) -> list[str]:
        """What keeps this cluster from getting workers, one line each.

        Failing submissions, workers that cannot connect; the repr and the notebook
        widget show them.
        """
        out = []
        if getattr(self, "backoff", None) is not None and self.backoff.failing:
            out.append(self.backoff.describe(time.time()))
        if getattr(self, "unreachable", ""):
            out.append(self.unreachable.splitlines()[0])
        return out

    def __repr__(self) -> str:
        problems = "".join(f"; {p}" for p in self.problems())
        return (f"<{type(self).__name__} {getattr(self, 'scheduler_address', '?')} "
                f"jobs: {self.job_summary() if hasattr(self, 'jobs') else '?'}{problems}>")

    # ------------------------------------------------------------ close
    def close(self, timeout: float = 10) -> None:
        """Cancel every job this cluster submitted and stop the scheduler. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._target_jobs = 0
            for job in self.jobs.values():
                if not job.ended:
                    job.cancel_requested = True
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


def _weak_callback(cluster: JobQueueCluster) -> Any:
    ref = weakref.ref(cluster)

    def on_worker(event: str, address: str, info: dict | None = None) -> None:
        c = ref()
        if c is not None:
            c._worker_event(event, address, info)

    return on_worker


def _poll_loop(ref: weakref.ref, stop: threading.Event) -> None:
    """The polling thread: holds the cluster only weakly, so that it can be collected."""
    interval = float(config.get("jobqueue.poll-interval"))
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
