"""What a batch system is, and how a job script is rendered: the base of every adapter.

A :class:`BatchSystem` holds the validated job parameters (dask-jobqueue's names:
``cores``, ``memory``, ``processes``, ``walltime``, ``queue``, ...) merged from
configuration (``jobqueue.<system>.<param>``, YAML or ``HPCSCHED_JOBQUEUE__SLURM__QUEUE``)
and keyword arguments (which win), renders job scripts, and submits, polls and
cancels jobs -- every shell call through ``self.run_command``
(:func:`hpcsched.jobqueue.runner.run_command` unless a test replaces it).

A subclass per system declares only data and small hooks: its commands, directive
prefix, job-id pattern, native-state table, the directives for cores / memory /
walltime / arrays, how to parse its status output, and what its jobs' environment says
(:meth:`BatchSystem.in_job`). It never touches the scheduler or the cluster:
:class:`hpcsched.jobqueue.cluster.JobQueueCluster` does.

What is submitted is a *job file*: the job's requests (directives) and the commands
it runs. Most systems take a shell script whose ``#DIRECTIVE`` lines ask for resources
(the base's :meth:`BatchSystem.job_file`); a system that submits a description file
instead (HTCondor's ``key = value`` lines naming an executable and its arguments)
overrides :meth:`BatchSystem.directive_line`, :meth:`BatchSystem.job_file` and, when
its extra directives are not a list of lines, :meth:`BatchSystem.extra_directive_lines`
-- the parameters, the worker's command line and the commands around it stay the base's.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import hpcsched.jobqueue.params as params
import hpcsched.jobqueue.runner as runner
from hpcsched.core import config
from hpcsched.core.settings import JobQueueSettings, WorkerSettings
from hpcsched.core.units import parse_interval
from hpcsched.jobqueue.job import (
    JobState,
    ceil_div,
    format_memory,
    parse_memory,
    parse_walltime,
    worker_lifetime,
)
from hpcsched.jobqueue.launch import LAUNCHERS, launch_command, shell_literal
from hpcsched.launchers import resources
from hpcsched.launchers.resources import JobEnvironment, first_env_int, worker_memory_limit

logger = logging.getLogger(__name__)

_LIST_PARAMS = ("job_extra_directives", "job_directives_skip", "job_script_prologue",
                "job_script_epilogue", "submit_command_extra", "worker_extra_args")
#: scheduler_options the cluster uses; dask's other Scheduler options are logged and ignored
SCHEDULER_OPTIONS = ("host", "port", "interface", "dashboard_address", "protocol")
#: below this, a memory figure is surely a unit mistake (memory=16 meaning 16 GB)
MIN_MEMORY = 2**20


#: options of dask.distributed's Scheduler that mean nothing to hpcsched's (logged, ignored)
_DASK_SCHEDULER_OPTIONS = ("dashboard", "http_prefix", "security", "services", "service_kwargs",
                           "allowed_failures", "extensions", "validate", "scheduler_file",
                           "worker_ttl", "idle_timeout", "preload", "preload_argv", "plugins",
                           "contact_address", "transition_counter_max", "jupyter",
                           "blocked_handlers", "loop")


def check_scheduler_options(opts: Any) -> dict[str, Any]:
    """``scheduler_options`` as the cluster uses them: host, port, interface (and
    dashboard_address, protocol, checked by the cluster); dask's other Scheduler options
    are logged and dropped, anything else is an error naming the key."""
    if opts is None:
        return {}
    if not isinstance(opts, Mapping):
        raise TypeError(f"scheduler_options must be a dict, got {opts!r}")
    out = {str(k).replace("-", "_"): v for k, v in opts.items()}
    bad = sorted(set(out) - set(SCHEDULER_OPTIONS) - set(_DASK_SCHEDULER_OPTIONS))
    if bad:
        raise ValueError(f"scheduler_options: unknown key(s) {', '.join(bad)} "
                         f"(known: {', '.join(SCHEDULER_OPTIONS)})")
    for k in sorted(set(out) & set(_DASK_SCHEDULER_OPTIONS)):
        logger.info("scheduler_options[%r] is ignored: an option of dask.distributed's "
                    "Scheduler that hpcsched's scheduler does not have", k)
        del out[k]
    return out


@dataclass(frozen=True)
class JobStatus:
    """What the batch system says about one job id."""

    state: JobState
    native: str = ""
    exit_code: int | None = None


def default_log_directory() -> str:
    return os.path.join(os.path.expanduser("~"), ".hpcsched", "jobqueue")


class BatchSystem:
    """Job parameters + the commands and formats of one batch system.

    >>> s = SLURMSystem(cores=8, memory="16GB", walltime="01:00:00")   # doctest: +SKIP
    >>> print(s.render("job-0", "tcp://10.0.0.1:8786", "/home/u/.secret"))  # doctest: +SKIP
    """

    system: ClassVar[str] = ""  # config section: jobqueue.<system>
    directive_prefix: ClassVar[str] = ""
    submit_command: ClassVar[list[str]] = []
    script_on_stdin: ClassVar[bool] = False
    cancel_command: ClassVar[list[str]] = []
    job_id_regex: ClassVar[str] = r"(?P<job_id>\S+)"
    states: ClassVar[dict[str, JobState]] = {}
    array_index_var: ClassVar[str] = ""  # env var holding the element index inside a job
    array_first_index: ClassVar[int] = 0
    extra_params: ClassVar[dict[str, Any]] = {}
    #: the variables holding the job's id inside a job, first set wins (see :meth:`in_job`)
    job_id_variables: ClassVar[tuple[str, ...]] = ()
    #: the file name's ending of the script (or description) written for each submission
    script_suffix: ClassVar[str] = "sh"
    #: how the system reads a walltime of two fields: "hh:mm", "mm:ss", or None (refused)
    walltime_two_fields: ClassVar[str | None] = None

    #: dask-jobqueue deprecated ``project`` in favour of ``account`` here (SLURM, PBS);
    #: elsewhere (SGE, LSF) ``project`` is the system's own word and ``account`` its alias
    project_is_deprecated: ClassVar[bool] = False

    def __init__(self, **kwargs: Any) -> None:
        if not self.system:  # its configuration section would be "jobqueue."
            raise ValueError(
                f"{type(self).__name__} has no 'system' class variable (dask-jobqueue's "
                f"config_name): name the section jobqueue.<system> its settings come from, "
                f"as in: class {type(self).__name__}(...): system = 'slurm'")
        self.run_command: Callable[..., str] | None = None  # tests may replace
        self.params = params.resolve(type(self).__name__, self.system, self.param_defaults(),
                                     kwargs, deprecated_project=self.project_is_deprecated)
        self._validate()

    # ------------------------------------------------------------ parameters
    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {**params.COMMON, **cls.extra_params}

    def _validate(self) -> None:
        p = self.params
        p["job_extra_directives"] = self.extra_directive_lines(p["job_extra_directives"])
        for k in _LIST_PARAMS:
            v = p[k]
            if v is None:
                p[k] = []
                continue
            if isinstance(v, str) or not isinstance(v, (list, tuple, set)) \
                    or not all(isinstance(x, str) for x in v):
                raise TypeError(f"{k} must be a list of strings, got {v!r}")
            p[k] = list(v)
        if isinstance(p["cores"], bool) or not isinstance(p["cores"], int) or p["cores"] < 1:
            raise ValueError(f"cores must be a positive integer, got {p['cores']!r}")
        if p["processes"] is None:
            p["processes"] = params.default_processes(p["cores"])
        if isinstance(p["processes"], bool) or not isinstance(p["processes"], int) \
                or p["processes"] < 1:
            raise ValueError(f"processes must be a positive integer, got {p['processes']!r}")
        if p["processes"] > p["cores"]:
            raise ValueError(f"processes={p['processes']} > cores={p['cores']}: each worker "
                             "process needs at least one core")
        if p["nthreads"] is None:
            p["nthreads"] = p["cores"] // p["processes"]
        elif isinstance(p["nthreads"], bool) or not isinstance(p["nthreads"], int) \
                or p["nthreads"] < 1:
            raise ValueError(f"nthreads must be a positive integer, got {p['nthreads']!r}")
        self.memory_bytes = parse_memory(p["memory"], "memory")
        if self.memory_bytes < MIN_MEMORY:
            raise ValueError(
                f"memory={p['memory']!r} is {self.memory_bytes} bytes, less than 1 MiB: a number "
                "means bytes (as dask's parse_bytes reads it); did you mean "
                f"'{p['memory']}GB'?")
        self.walltime_seconds = (parse_walltime(p["walltime"],
                                                two_fields=self.walltime_two_fields)
                                 if p["walltime"] not in (None, "") else None)
        if self.walltime_two_fields == "mm:ss" and isinstance(p["walltime"], str) \
                and p["walltime"].count(":") == 1 and self.walltime_seconds is not None \
                and self.walltime_seconds < 60:  # "00:02" meant as 2 minutes, most likely
            logger.warning("walltime=%r is %d seconds as %s reads it (minutes:seconds): "
                           "write %r for %s minutes", p["walltime"], self.walltime_seconds,
                           self.system, f"{p['walltime']}:00", p["walltime"].split(":")[1])
        if not self.project_is_deprecated:
            if p["account"] and p["project"] and p["account"] != p["project"]:
                raise ValueError(f"account={p['account']!r} and project={p['project']!r} "
                                 "disagree: pass one of them")
            p["account"] = p["project"] or p["account"]
        if p["launcher"] not in LAUNCHERS:
            raise ValueError(f"launcher={p['launcher']!r} is not one of {', '.join(LAUNCHERS)}")
        if not isinstance(p["job_name"], str) \
                or not re.match(r"^[A-Za-z][A-Za-z0-9_.-]*$", p["job_name"]):
            raise ValueError(f"job_name={p['job_name']!r}: use letters, digits, '_', '.', '-', "
                             "starting with a letter")
        if not isinstance(p["shebang"], str) or not p["shebang"].startswith("#!"):
            raise ValueError(f"shebang={p['shebang']!r} must start with '#!'")
        self.worker_program = params.worker_program(p["worker_command"])
        p["resources"] = params.check_resources(p["resources"])
        self.worker_resources = params.split_resources(p["resources"], p["processes"])
        if not isinstance(p["resources_only"], (bool, type(None))):
            raise TypeError(f"resources_only must be True or False, got {p['resources_only']!r}")
        p["resources_only"] = bool(p["resources_only"])
        p["scheduler_options"] = check_scheduler_options(p["scheduler_options"])
        if p["protocol"] not in (None, "tcp", "tcp://"):
            raise ValueError(f"protocol={p['protocol']!r}: hpcsched's batch clusters speak tcp:// "
                             "(authenticated by the cluster's secret); for TLS set comm.tls.cert "
                             "/ comm.tls.key / comm.tls.ca in the configuration")
        if p["python"] is None:
            p["python"] = sys.executable
        p["death_timeout"] = float(config.read(WorkerSettings,
                                               death_timeout=p["death_timeout"]).death_timeout)
        if p["log_directory"] is None:
            p["log_directory"] = default_log_directory()
        p["log_directory"] = os.path.abspath(os.path.expanduser(p["log_directory"]))
        self.validate_system()

    def validate_system(self) -> None:
        """Hook: system-specific checks of ``self.params``."""

    def __getattr__(self, name: str) -> Any:  # s.cores, s.queue, ...
        values = self.__dict__.get("params")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    # ------------------------------------------------------------ inside a job
    #: what a job's environment says as whole numbers: a field of
    #: :class:`~hpcsched.launchers.resources.JobEnvironment` -> the variables that may hold
    #: it, the first one set winning (``{"node_cpus": ("PBS_NUM_PPN", "NCPUS")}``)
    job_counts: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: the variable holding the job's walltime as a duration, counted from about when this
    #: process started (workers start with their job); None: the system does not say
    walltime_variable: ClassVar[str | None] = None

    @classmethod
    def in_job(cls, env: Mapping[str, str], hostname: str) -> JobEnvironment | None:
        """What a job of this system tells the processes inside it, or None outside one:
        its id (:attr:`job_id_variables`), the numbers of :attr:`job_counts`, the end of
        :attr:`walltime_variable`'s walltime, and what :meth:`job_details` adds."""
        job_id = next((env[v] for v in cls.job_id_variables if env.get(v, "").strip()), None)
        if job_id is None:
            return None
        said: dict[str, Any] = {field: first_env_int(env, variables)
                                for field, variables in cls.job_counts.items()}
        walltime = env.get(cls.walltime_variable, "").strip() if cls.walltime_variable else ""
        if walltime:
            said["walltime_end"] = resources.process_start() + parse_interval(
                walltime, f"walltime {cls.walltime_variable}")
        said.update((k, v) for k, v in cls.job_details(env, hostname).items() if v is not None)
        return JobEnvironment(cls.system, job_id.strip(), **said)

    @classmethod
    def ask_walltime_end(cls, job_id: str, timeout: float) -> float | None:
        """Hook: when job ``job_id`` ends (epoch seconds), asked of the system's commands
        (with ``timeout``) when its environment did not say; None: the system cannot say.
        Raises :class:`~hpcsched.jobqueue.runner.BatchCommandError` when the command
        fails."""
        return None

    @classmethod
    def job_details(cls, env: Mapping[str, str], hostname: str) -> dict[str, Any]:
        """Hook: the fields of :class:`~hpcsched.launchers.resources.JobEnvironment` a job's
        environment gives otherwise than as a number of :attr:`job_counts` (a None is not
        said: a count of the same field stands)."""
        return {}

    # ------------------------------------------------------------ rendering
    #: the system's flags for the queue (partition) and the account (project) to charge
    queue_flag = "-q"
    account_flag = "-A"

    def queue_account_directives(self) -> list[str]:
        p = self.params
        return ([f"{self.queue_flag} {p['queue']}"] if p["queue"] else []) + \
            ([f"{self.account_flag} {p['account']}"] if p["account"] else [])

    def resource_directives(self, ntasks: int) -> list[str]:
        """Directives (without prefix) for queue, account, cores, memory, walltime."""
        raise NotImplementedError

    def name_directives(self, job_name: str, log_file: str, array: int | None) -> list[str]:
        """Job name and output file (stderr joined to it: one log to show on failure)."""
        raise NotImplementedError

    def array_directive(self, job_name: str, count: int) -> list[str]:
        raise NotImplementedError

    def array_log_token(self) -> str:
        """The placeholder the system substitutes by the element index in ``-o`` paths."""
        raise NotImplementedError

    def log_file(self, job_name: str, array: int | None = None) -> str:
        """Log path written in the script (with the array placeholder for arrays)."""
        stem = f"{job_name}.{self.array_log_token()}" if array else job_name
        return os.path.join(self.params["log_directory"], f"{stem}.out")

    def element_log_file(self, job_name: str, index: int) -> str:
        return os.path.join(self.params["log_directory"], f"{job_name}.{index}.out")

    def element_name(self, job_name: str, index: int) -> str:
        """Worker-name prefix of array element ``index`` (as the script expands it)."""
        return f"{job_name}.{index}"

    def directives(self, job_name: str, array: int | None = None) -> list[str]:
        """The job's requests, without prefix: name and log, array, resources."""
        p = self.params
        ntasks = p["processes"] if p["launcher"] != "fork" else 1
        out = self.name_directives(job_name, self.log_file(job_name, array), array)
        if array:
            out += self.array_directive(job_name, array)
        return out + self.resource_directives(ntasks)

    def directive_line(self, directive: str) -> str:
        """Hook: one directive as a line of the job file (``#SBATCH -n 1``)."""
        return f"{self.directive_prefix} {directive}"

    def skips(self, line: str, skip: str) -> bool:
        """Hook: whether ``job_directives_skip`` entry ``skip`` removes ``line``
        (dask-jobqueue's rule: any line containing it)."""
        return skip in line

    def extra_directive_lines(self, extra: Any) -> Any:
        """Hook: ``job_extra_directives`` as a list of directives (a system whose extras
        are not lines, such as HTCondor's dict of attributes, turns them into lines)."""
        return extra

    def header(self, job_name: str, array: int | None = None) -> list[str]:
        """Directive lines, minus those matching ``job_directives_skip``, plus extras."""
        p = self.params
        lines = [self.directive_line(d) for d in self.directives(job_name, array)]
        skip = p["job_directives_skip"]
        lines = [ln for ln in lines if not any(self.skips(ln, s) for s in skip)]
        lines += [self.directive_line(d) for d in p["job_extra_directives"]]
        return lines

    def worker_command(self, scheduler_address: str, worker_name: str) -> list[str]:
        p = self.params
        nthreads = p["nthreads"]
        # the job is the machine its workers share
        mem = worker_memory_limit("auto", workers=p["processes"], total=self.memory_bytes,
                                  machine=self.memory_bytes)
        cmd = [p["python"], "-m", *self.worker_program, scheduler_address,
               "--name", worker_name, "--nthreads", str(nthreads)]
        # each worker's share of the job's memory, unless the worker's own option says
        # otherwise (it means what memory_limit means everywhere: "0.5", "auto", ...)
        if not any(a.split("=")[0] == "--memory-limit" for a in p["worker_extra_args"]):
            cmd += ["--memory-limit", format_memory(mem)]
        cmd += ["--death-timeout", f"{p['death_timeout']:g}"]
        if self.walltime_seconds:
            worker = config.read(WorkerSettings)
            life, stagger = worker_lifetime(self.walltime_seconds, worker.walltime_margin,
                                            worker.walltime_stagger)
            cmd += ["--lifetime", str(life), "--lifetime-stagger", str(stagger)]
        if self.worker_resources:
            cmd += ["--resources", ",".join(f"{k}={v:g}"
                                            for k, v in self.worker_resources.items())]
            if p["resources_only"]:
                cmd.append("--resources-only")
        if p["local_directory"]:
            cmd += ["--local-directory", p["local_directory"]]
        if p["interface"]:  # as dask-jobqueue: workers listen on the same interface
            cmd += ["--interface", p["interface"]]
        return cmd + p["worker_extra_args"]

    def commands(self, scheduler_address: str, worker_name: str,
                 secret_file: str | None) -> list[str]:
        """The shell commands the job runs: prologue, the workers, epilogue."""
        p = self.params
        lines = list(p["job_script_prologue"])
        if secret_file:
            lines.append(f"export HPCSCHED_SECRET_FILE={shell_literal(secret_file)}")
        launch = launch_command(self.worker_command(scheduler_address, worker_name),
                                p["processes"], p["launcher"])
        if p["job_script_epilogue"]:
            # the shell stays to run the epilogue once the worker exits; the job still ends
            # with the worker's status, which tells a failed worker from a finished one
            return [*lines, launch, "worker_status=$?", *p["job_script_epilogue"],
                    "exit $worker_status"]
        return [*lines, "exec " + launch]

    def job_file(self, header: list[str], commands: list[str], array: int | None) -> str:
        """Hook: the file submitted, from its directive lines and the commands it runs
        (here a shell script: shebang, directives, commands)."""
        return "\n".join([self.params["shebang"], "", *header, "", *commands]) + "\n"

    def array_worker_name(self, job_name: str) -> str:
        """Hook: the worker name of an array element, as the job expands it (its index)."""
        return f"{job_name}.${{{self.array_index_var}}}"

    def render(self, job_name: str, scheduler_address: str, secret_file: str | None,
               array: int | None = None) -> str:
        """The complete job file; ``array=N`` renders one submission of N elements."""
        worker_name = self.array_worker_name(job_name) if array else job_name
        return self.job_file(self.header(job_name, array),
                             self.commands(scheduler_address, worker_name, secret_file), array)

    #: what :meth:`job_script` names in place of the scheduler's address
    SCHEDULER_PLACEHOLDER: ClassVar[str] = "SCHEDULER_ADDRESS"

    def job_script(self) -> str:
        """The script of one job of these parameters, before any cluster exists: the
        scheduler's address is :attr:`SCHEDULER_PLACEHOLDER` and the job's name its
        ``job_name`` (a cluster's ``job_script()`` shows what it submits).

        >>> from hpcsched.jobqueue.systems.slurm import SLURMSystem
        >>> print(SLURMSystem(cores=2, memory="4GB").job_script())  # doctest: +ELLIPSIS
        #!/usr/bin/env bash
        <BLANKLINE>
        #SBATCH -J hpcsched
        ...
        """
        return self.render(self.params["job_name"], self.SCHEDULER_PLACEHOLDER, None)

    # ------------------------------------------------------------ commands
    def _run(self, cmd: list[str], input: str | None = None,  # noqa: A002
             timeout: float | None = None) -> str:
        run = self.run_command or runner.run_command
        timeout = config.read(JobQueueSettings, command_timeout=timeout).command_timeout
        return run(cmd, timeout=float(timeout), input=input)

    def has_command(self, executable: str) -> bool:
        """Is an (optional) command such as ``sacct`` available? (Always, for a test runner.)"""
        return self.run_command is not None or shutil.which(executable) is not None

    def check_commands(self) -> None:
        """Raise :class:`~hpcsched.jobqueue.runner.BatchCommandNotFound` before submitting
        (only submitting needs the batch system's commands, never rendering a script)."""
        if self.run_command is None:  # a replaced runner needs no executables
            runner.require_executable(self.submit_command[0])

    def submit(self, script_path: str, script: str) -> str:
        """Submit; return the job id (the parent id for arrays). Everything the job asks
        for is in the script's directives, where ``job_directives_skip`` and
        ``job_extra_directives`` act; only ``submit_command_extra`` goes on the command line."""
        self.check_commands()
        extra = self.params["submit_command_extra"]
        if self.script_on_stdin:
            out = self._run([*self.submit_command, *extra], input=script)
        else:
            out = self._run([*self.submit_command, *extra, script_path])
        return self.parse_job_id(out)

    @classmethod
    def parse_job_id(cls, output: str) -> str:
        for line in output.splitlines():
            m = re.search(cls.job_id_regex, line.strip())
            if m:
                return m.group("job_id")
        raise runner.BatchCommandError(
            f"could not find a job id in the output of {cls.submit_command[0]} "
            f"(expected pattern {cls.job_id_regex!r}):\n{runner.tail(output) or '(empty)'}",
            cmd=cls.submit_command, stdout=output)

    def array_element_ids(self, parent: str, count: int) -> list[str]:
        raise NotImplementedError

    def cancel(self, job_ids: Iterable[str]) -> None:
        """Cancel jobs with one command; on error retry one by one, log what still fails."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return
        cancel = [*self.cancel_command, *self.params.get("cancel_command_extra", [])]
        try:
            self._run([*cancel, *ids])
            return
        except runner.BatchCommandError as e:
            if len(ids) == 1:
                if not self.already_gone(e):
                    raise
                return
        errors = []
        for job_id in ids:  # one bad id (already finished) must not protect the others
            try:
                self._run([*cancel, job_id])
            except runner.BatchCommandError as e:
                if not self.already_gone(e):
                    errors.append(e)
        if errors:
            raise errors[0]

    def node_addresses(self) -> list[str]:
        """Hook: addresses of the compute nodes the jobs may run on ([]: unknown).

        The cluster names the address this host reaches them from
        (:mod:`hpcsched.launchers.address`). A failure only means "unknown".
        """
        return []

    def already_gone(self, error: runner.BatchCommandError) -> bool:
        """Hook: the cancel failed only because the job no longer exists."""
        return False

    # ------------------------------------------------------------ status
    def status_command(self, job_ids: list[str]) -> list[str]:
        raise NotImplementedError

    def parse_status(self, output: str) -> dict[str, tuple[str, int | None]]:
        """job id -> (native state, exit code or None) for every job in the output."""
        raise NotImplementedError

    def status_error_ok(self, error: runner.BatchCommandError) -> bool:
        """Hook: a non-zero status exit that only means 'some ids are unknown'."""
        return False

    def to_state(self, native: str, exit_code: int | None) -> JobState:
        """The job's state from its native one; a job done with a non-zero exit code failed
        (the systems whose "done" says nothing of the exit: Flux, HTCondor, OAR, PBS; a job
        PBS's qdel ended exits with 256+signal: see Job.cancel_requested)."""
        state = self.states.get(native, JobState.UNKNOWN)
        if state is JobState.DONE and exit_code not in (None, 0):
            return JobState.FAILED
        return state

    def job_output(self, log_text: str) -> str:
        """Hook: the job's own output in its log file, without what the system added."""
        return log_text

    def stuck_in_queue(self, native: str) -> bool:
        """Hook: a failed state in which the job stays queued until deleted (SGE's Eqw)."""
        return False

    def finished_status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """Hook: ask accounting about jobs missing from the status output."""
        return {}

    def query_ids(self, job_ids: list[str]) -> list[str]:
        """Ids to name on the status command line (array parents instead of elements)."""
        return job_ids

    def status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """States of ``job_ids`` with one status command (plus accounting for the missing)."""
        if not job_ids:
            return {}
        try:
            out = self._run(self.status_command(self.query_ids(job_ids)))
        except runner.BatchCommandError as e:
            if isinstance(e, runner.BatchCommandTimeout) or not self.status_error_ok(e):
                raise
            out = e.stdout
        found = self.parse_status(out)
        result = {}
        for job_id in job_ids:
            if job_id in found:
                native, code = found[job_id]
                result[job_id] = JobStatus(self.to_state(native, code), native, code)
        missing = [j for j in job_ids if j not in result]
        if missing:
            result.update(self.finished_status(missing))
        return result


def mib(nbytes: int) -> int:
    """Whole MiB, rounded up (batch systems' ``M``/``mb`` are binary)."""
    return ceil_div(nbytes, 2**20)


def system_class_of(cls: type, job_cls: Any) -> type[BatchSystem]:
    """The batch system of cluster class ``cls``: ``job_cls=`` (dask-jobqueue's keyword),
    else the nearest class's ``job_cls`` or ``system_class``; an error unless it is a
    :class:`BatchSystem` subclass."""
    system_class = job_cls
    for klass in cls.__mro__ if job_cls is None else ():  # the nearest class naming one
        system_class = klass.__dict__.get("job_cls") or klass.__dict__.get("system_class")
        if system_class is not None:
            break
    if system_class is None:
        raise ValueError(
            "You need to specify a Job type (the batch system): a 'job_cls' class variable "
            f"of {cls.__name__}, a BatchSystem subclass such as "
            "hpcsched.jobqueue.systems.slurm.SLURMSystem, or job_cls=... when making it; or "
            "use one of the clusters (SLURMCluster, PBSCluster, ...)")
    if not (isinstance(system_class, type) and issubclass(system_class, BatchSystem)):
        raise TypeError(f"job_cls={system_class!r}: hpcsched's clusters take a BatchSystem "
                        "subclass (dask-jobqueue's Job classes do not apply)")
    return system_class
