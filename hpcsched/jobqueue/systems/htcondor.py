"""HTCondor as a batch system: a submit description, ``condor_submit``, ``condor_q``.

HTCondor does not run a ``#DIRECTIVE`` script: it is given a *submit description*
(``key = value`` lines, then ``Queue``) naming an executable and its arguments. Written
from the HTCondor manual (``condor_submit``, ``condor_q``, ``condor_history``,
``condor_rm``; "Job ClassAd Attributes") and rendered as dask-jobqueue 0.9's
HTCondorCluster renders it:

* the job's requests are ClassAd attributes: ``RequestCpus = MY.DaskWorkerCores``,
  ``RequestMemory`` (MiB), ``RequestDisk`` (KiB) computed from ``MY.DaskWorker*``;
  ``job_extra_directives`` is a dict of more attributes and ``job_directives_skip``
  names attributes to leave out;
* the commands run by ``/bin/sh -c`` (HTCondor sets an executable's ``argv[0]`` to
  ``condor_exec.exe``, which confuses Python), joined by ``;`` and quoted by the
  "new" argument rules (:func:`quote_arguments`);
* ``condor_submit`` prints ``N job(s) submitted to cluster C.``: the jobs are ``C.0`` ..
  ``C.(N-1)`` (an array is one ``Queue N``, each element's ``$(ProcId)`` given to its
  shell by ``Environment``);
* ``condor_q -af:j JobStatus ExitCode IDS`` lists queued jobs (``1`` idle, ``2`` running,
  ``5`` held, ...); jobs that left the queue are in ``condor_history`` with the same
  output. A held job (``5``: it failed to start, and stays held until removed) counts
  as failed and is removed.

Inside a job HTCondor writes the job's ClassAd to the file ``_CONDOR_JOB_AD`` names:
its ``ClusterId``, ``ProcId``, ``RequestCpus`` and ``RequestMemory``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from typing_extensions import override

import hpcsched.jobqueue.runner as runner
from hpcsched.jobqueue.base import BatchSystem, JobStatus
from hpcsched.jobqueue.job import JobState, parse_memory
from hpcsched.launchers.resources import JobEnvironment

#: condor_q's JobStatus numbers ("Job ClassAd Attributes" in the HTCondor manual)
STATES: dict[str, JobState] = {
    "1": JobState.PENDING,  # Idle
    "2": JobState.RUNNING,
    "3": JobState.CANCELLED,  # Removed
    "4": JobState.DONE,  # Completed: refined by the exit code (to_state)
    "5": JobState.FAILED,  # Held
    "6": JobState.RUNNING,  # Transferring Output
    "7": JobState.PENDING,  # Suspended
}


def _double_up_quotes(text: str) -> str:
    return text.replace("'", "''").replace('"', '""')


def quote_arguments(args: list[str]) -> str:
    """Arguments quoted by HTCondor's "new" rules (to go between double quotes).

    >>> quote_arguments(["one", "two with spaces", "it's"])
    "one 'two with spaces' 'it''s'"
    """
    out = []
    for arg in args:
        quoted = _double_up_quotes(arg)
        if " " in quoted or "'" in quoted or not quoted:
            quoted = f"'{quoted}'"
        out.append(quoted)
    return " ".join(out)


def read_classad(path: str) -> dict[str, str]:
    """``Attribute = value`` lines of a ClassAd file (values as written, quotes dropped)."""
    out: dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                key, eq, value = line.partition("=")
                if eq:
                    out[key.strip()] = value.strip().strip('"')
    except OSError:
        pass
    return out


class HTCondorSystem(BatchSystem):
    """HTCondor as a :class:`~hpcsched.jobqueue.base.BatchSystem`: a submit description."""

    system = "htcondor"
    script_suffix = "sub"
    submit_command = ["condor_submit"]
    cancel_command = ["condor_rm"]
    job_id_regex = r"submitted to cluster (?P<job_id>\d+)"
    states = STATES
    array_first_index = 0
    #: set from $(ProcId) by the description (HTCondor sets no variable of its own)
    array_index_var = "HPCSCHED_ARRAY_INDEX"
    #: dask-jobqueue's: disk per job (required), condor_rm's extra arguments; HTCondor has
    #: no walltime of its own (given, it removes the job after it and ends its workers
    #: before), and its extra directives are a dict of attributes
    extra_params = {
        "disk": None,
        "cancel_command_extra": [],
        "walltime": None,
        "job_extra_directives": {},
        "shebang": "#!/usr/bin/env condor_submit",
    }

    @classmethod
    @override
    def in_job(cls, env: Mapping[str, str], hostname: str) -> JobEnvironment | None:
        path = env.get("_CONDOR_JOB_AD", "")
        ad = read_classad(path) if path else {}
        if "ClusterId" not in ad:
            return None
        cpus = ad.get("RequestCpus", "")
        memory = ad.get("RequestMemory", "")
        return JobEnvironment(
            cls.system,
            f"{ad['ClusterId']}.{ad.get('ProcId', '0')}",
            node_cpus=int(cpus) if cpus.isdigit() and int(cpus) > 0 else None,
            node_memory=int(memory) * 2**20 if memory.isdigit() and int(memory) > 0 else None,
        )

    @override
    def validate_system(self) -> None:
        p = self.params
        if p["disk"] is None:
            raise ValueError("You must specify how much disk to use per job like ``disk='1 GB'``")
        self.disk_bytes = parse_memory(p["disk"], "disk")
        if p["queue"]:
            raise ValueError(
                "queue: HTCondor has no queues; select machines with "
                "job_extra_directives={'requirements': '...'}"
            )
        if p["launcher"] != "fork":
            raise ValueError(
                f"launcher={p['launcher']!r}: an HTCondor job is one process "
                "tree on one machine; use the default launcher 'fork'"
            )
        extra = p["cancel_command_extra"] or []
        if isinstance(extra, str) or not all(isinstance(x, str) for x in extra):
            raise TypeError(f"cancel_command_extra must be a list of strings, got {extra!r}")
        p["cancel_command_extra"] = list(extra)  # condor_rm's, after its name (cancel())

    @override
    def extra_directive_lines(self, extra: Any) -> Any:
        if isinstance(extra, Mapping):  # dask-jobqueue's form: attribute -> value
            return [f"{k} = {v}" for k, v in extra.items()]
        return extra

    @override
    def directive_line(self, directive: str) -> str:
        return directive

    @override
    def skips(self, line: str, skip: str) -> bool:
        return line.split("=", 1)[0].strip() == skip  # an attribute, by name

    @override
    def array_log_token(self) -> str:
        return "$(ProcId)"

    @override
    def array_directive(self, job_name: str, count: int) -> list[str]:
        return []  # the count goes on the Queue line

    @override
    def name_directives(self, job_name: str, log_file: str, array: int | None) -> list[str]:
        out = [
            f"batch_name = {job_name}",
            f"Output = {log_file}",
            f"Error = {log_file}",
            f"Log = {self.params['log_directory']}/{job_name}.condor.log",
            "Stream_Output = True",
            "Stream_Error = True",
        ]
        if array:  # each element's worker is named by its index
            out.append(f'Environment = "{self.array_index_var}=$(ProcId)"')
        return out

    @override
    def resource_directives(self, ntasks: int) -> list[str]:
        p = self.params
        out = [
            "RequestCpus = MY.DaskWorkerCores",
            "RequestMemory = floor(MY.DaskWorkerMemory / 1048576)",
            "RequestDisk = floor(MY.DaskWorkerDisk / 1024)",
            'MY.JobId = "$(ClusterId).$(ProcId)"',
            f"MY.DaskWorkerCores = {p['cores']}",
            f"MY.DaskWorkerMemory = {self.memory_bytes}",
            f"MY.DaskWorkerDisk = {self.disk_bytes}",
        ]
        if p["account"]:
            out.append(f"accounting_group = {p['account']}")
        if self.walltime_seconds:
            # JobStatus 2 is running; EnteredCurrentStatus is when it started to
            out.append(
                "periodic_remove = (JobStatus == 2) && "
                f"(time() - EnteredCurrentStatus > {self.walltime_seconds})"
            )
        return out

    @override
    def job_file(self, header: list[str], commands: list[str], array: int | None) -> str:
        lines = [
            self.params["shebang"],
            *header,
            f'Arguments = "{quote_arguments(["-c", "; ".join(commands)])}"',
            "Executable = /bin/sh",
            f"Queue {array}" if array else "Queue",
        ]
        return "\n".join(lines) + "\n"

    @classmethod
    @override
    def parse_job_id(cls, output: str) -> str:
        return f"{super().parse_job_id(output)}.0"  # the first job of the cluster

    @override
    def array_element_ids(self, parent: str, count: int) -> list[str]:
        cluster = parent.split(".", 1)[0]
        return [f"{cluster}.{i}" for i in range(count)]

    @override
    def already_gone(self, error: runner.BatchCommandError) -> bool:
        text = error.stderr + error.stdout
        return "not found" in text or "Couldn't find" in text or "already being removed" in text

    @override
    def status_command(self, job_ids: list[str]) -> list[str]:
        return ["condor_q", "-af:j", "JobStatus", "ExitCode", *job_ids]

    @override
    def parse_status(self, output: str) -> dict[str, tuple[str, int | None]]:
        out: dict[str, tuple[str, int | None]] = {}
        for line in output.splitlines():
            parts = line.split()
            if len(parts) >= 2 and re.fullmatch(r"\d+\.\d+", parts[0]):
                code = parts[2] if len(parts) > 2 else ""
                out[parts[0]] = (parts[1], int(code) if code.lstrip("-").isdigit() else None)
        return out


    @override
    def stuck_in_queue(self, native: str) -> bool:
        return native == "5"  # held: failed to start, and held until removed

    @override
    def finished_status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        try:
            out = self._run(["condor_history", "-af:j", "JobStatus", "ExitCode", *job_ids])
        except runner.BatchCommandError:
            return {}
        found = self.parse_status(out)
        return {
            j: JobStatus(self.to_state(*found[j]), found[j][0], found[j][1])
            for j in job_ids
            if j in found
        }
