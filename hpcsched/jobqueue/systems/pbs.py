"""PBS Pro / OpenPBS: ``qsub``, ``qdel``, ``qstat -x -f -F json`` (finished jobs included).

Job ids carry the server name (``1234.server``); arrays are ``1234[].server`` with
elements ``1234[0].server``. Resources use PBS Pro's select syntax::

    #PBS -l select=1:ncpus=8:mem=15259mb
    #PBS -l walltime=01:00:00

``resource_spec`` replaces the select line (dask-jobqueue's behaviour). A ``qstat``
without JSON output (Torque, older PBS, SchedMD's Torque wrappers over SLURM) is
recognised by its usage error and then asked ``qstat -f IDS``, whose ``Job Id:``
blocks are parsed; Torque's ``C`` (completed) counts as finished.

Job name, output file and joined stderr are ``#PBS`` lines of the script only, as
dask-jobqueue writes them, so that ``job_directives_skip`` removes them and
``job_extra_directives`` replaces them (``qsub`` options would win over both).
SchedMD's Torque wrappers over SLURM read no directive of a script named by its path:
they give sbatch their own ``-J <script name> -o %x.o%A -e %x.e%A``, so there the log
is written in the submitting directory, not in ``log_directory``.
"""

from __future__ import annotations

import json
import logging
import os
import re

from typing_extensions import override

import hpcsched.jobqueue.runner as runner
from hpcsched.jobqueue.base import BatchSystem, JobStatus
from hpcsched.jobqueue.job import JobState, ceil_div, format_hms

logger = logging.getLogger(__name__)

STATES: dict[str, JobState] = {
    **dict.fromkeys(["Q", "H", "W", "T", "S", "U", "M"], JobState.PENDING),
    **dict.fromkeys(["R", "E", "B"], JobState.RUNNING),  # E: exiting, B: array begun
    **dict.fromkeys(["F", "X", "C"], JobState.DONE),  # finished: refined by the exit status
}

_USAGE_ERROR = re.compile(r"Unknown option|illegal option|invalid option|usage:", re.IGNORECASE)


def pbs_memory(nbytes: int) -> str:
    """``mem=`` as dask-jobqueue writes it.

    PBS's ``gb``/``mb``/``kb`` are binary; whole GB from 10 GiB on, whole MB from 10 MiB
    on, rounded up (never less than asked for).

    >>> pbs_memory(28 * 10**9), pbs_memory(2 * 10**9), pbs_memory(12345678)
    ('27GB', '1908MB', '12MB')
    """
    for suffix, unit in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if nbytes >= 10 * unit:
            return f"{ceil_div(nbytes, unit)}{suffix}"
    return f"{nbytes}B"


class PBSSystem(BatchSystem):
    """PBS Pro, OpenPBS or Torque as a :class:`~hpcsched.jobqueue.base.BatchSystem`."""

    system = "pbs"
    walltime_two_fields = "mm:ss"  # walltime=[[hours:]minutes:]seconds (Moab's too)
    directive_prefix = "#PBS"
    submit_command = ["qsub"]
    cancel_command = ["qdel"]
    job_id_regex = r"^(?P<job_id>\d+(?:\[\])?(?:\.[A-Za-z0-9_.-]+)?)$"
    states = STATES
    array_index_var = "PBS_ARRAY_INDEX"
    array_first_index = 0
    project_is_deprecated = True
    job_id_variables = ("PBS_JOBID",)
    # PBS_NUM_PPN: Torque; NCPUS: PBS Pro's ncpus of this node's chunk (pbs_environment)
    job_counts = {"node_cpus": ("PBS_NUM_PPN", "NCPUS")}
    walltime_variable = "PBS_WALLTIME"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._text_qstat = False  # set once qstat turned out to have no -F json

    @override
    def validate_system(self) -> None:
        if not self.params["account"]:  # dask-jobqueue's fallback, the variable qsub reads
            self.params["account"] = os.environ.get("PBS_ACCOUNT") or None

    @override
    def name_directives(self, job_name: str, log_file: str, array: int | None) -> list[str]:
        return [f"-N {job_name}", f"-o {log_file}", "-j oe"]

    @override
    def array_directive(self, job_name: str, count: int) -> list[str]:
        return [f"-J 0-{count - 1}"]

    @override
    def array_log_token(self) -> str:
        return "^array_index^"

    @override
    def resource_directives(self, ntasks: int) -> list[str]:
        p = self.params
        out = self.queue_account_directives()
        if p["resource_spec"]:
            out.append(f"-l {p['resource_spec']}")
        else:
            select = f"select=1:ncpus={p['cores']}"
            if ntasks > 1:
                select += f":mpiprocs={ntasks}"
            out.append(f"-l {select}:mem={pbs_memory(self.memory_bytes)}")
        if self.walltime_seconds:
            out.append(f"-l walltime={format_hms(self.walltime_seconds)}")
        return out

    @override
    def array_element_ids(self, parent: str, count: int) -> list[str]:
        return [parent.replace("[]", f"[{i}]", 1) for i in range(count)]

    @override
    def query_ids(self, job_ids: list[str]) -> list[str]:
        return list(dict.fromkeys(re.sub(r"\[\d+\]", "[]", j) for j in job_ids))

    @override
    def already_gone(self, error: runner.BatchCommandError) -> bool:
        text = error.stderr + error.stdout
        # the Torque wrappers' qdel exits 1 without a word for a job that has finished
        return "Unknown Job Id" in text or "finished" in text or \
            (error.returncode == 1 and not text.strip())

    @override
    def status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        try:
            return super().status(job_ids)
        except runner.BatchCommandError as e:
            if self._text_qstat or isinstance(e, runner.BatchCommandTimeout) \
                    or not _USAGE_ERROR.search(e.stderr + e.stdout):
                raise
            logger.info("qstat has no JSON output (%s): reading 'qstat -f' instead",
                        runner.tail(e.stderr, 1))
            self._text_qstat = True
            return super().status(job_ids)

    @override
    def status_command(self, job_ids: list[str]) -> list[str]:
        if self._text_qstat:
            return ["qstat", "-f", *job_ids]
        cmd = ["qstat", "-x", "-f", "-F", "json"]
        if any("[]" in j for j in job_ids):
            cmd.append("-t")  # list array elements
        return cmd + job_ids

    @override
    def status_error_ok(self, error: runner.BatchCommandError) -> bool:
        # "qstat: Unknown Job Id 12.server" for some ids; the others are still printed
        lines = [ln for ln in error.stderr.splitlines() if ln.strip()]
        return bool(lines) and all("Unknown Job Id" in ln for ln in lines)

    @override
    def parse_status(self, output: str) -> dict[str, tuple[str, int | None]]:
        text = output.strip()
        if not text:
            return {}
        if text.startswith("{"):
            return self._parse_json(text)
        if text.startswith("Job Id:"):
            return self._parse_full(text)
        return self._parse_table(text)

    @staticmethod
    def _parse_full(text: str) -> dict[str, tuple[str, int | None]]:
        """``qstat -f``: ``Job Id: 12.server`` blocks of ``key = value`` lines."""
        out: dict[str, tuple[str, int | None]] = {}
        job_id = ""
        for line in text.splitlines():
            if line.startswith("Job Id:"):
                job_id = line.split(":", 1)[1].strip()
                out[job_id] = ("", None)
                continue
            key, eq, value = line.strip().partition(" = ")
            if not job_id or not eq:
                continue
            state, code = out[job_id]
            if key == "job_state":
                state = value.strip()
            elif key.lower() == "exit_status" and value.strip().lstrip("-").isdigit():
                code = int(value)
            out[job_id] = (state, code)
        return out

    @staticmethod
    def _parse_json(text: str) -> dict[str, tuple[str, int | None]]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise runner.BatchCommandError(f"qstat -F json printed invalid JSON ({e}):\n"
                                           f"{runner.tail(text)}", stdout=text) from None
        out: dict[str, tuple[str, int | None]] = {}
        for job_id, info in (data.get("Jobs") or {}).items():
            code = info.get("Exit_status")
            out[job_id] = (str(info.get("job_state", "")), int(code) if code is not None else None)
        return out

    @staticmethod
    def _parse_table(text: str) -> dict[str, tuple[str, int | None]]:
        # Job id  Name  User  Time Use S Queue / ----- ... / 1234.server  name user 0 R workq
        out: dict[str, tuple[str, int | None]] = {}
        body = False
        for line in text.splitlines():
            if line.startswith("---"):
                body = True
                continue
            parts = line.split()
            if body and len(parts) >= 6:
                out[parts[0]] = (parts[-2], None)
        return out


