"""SLURM as a batch system.

It submits with ``sbatch --parsable``, cancels with ``scancel`` and asks ``squeue``
(``sacct`` / ``scontrol`` for jobs that left the queue).

::

    from hpcsched import Client, SLURMCluster
    cluster = SLURMCluster(cores=8, memory="16GB", walltime="01:00:00", queue="normal")
    print(cluster.job_script())
    cluster.scale(jobs=4)
    client = Client(cluster)
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from typing_extensions import override

import hpcsched.jobqueue.runner as runner
from hpcsched.jobqueue.base import BatchSystem, JobStatus
from hpcsched.jobqueue.job import JobState, ceil_div, format_hms

logger = logging.getLogger(__name__)
NODE_QUERY_TIMEOUT = 5.0  # seconds: an optional question, asked before the cluster starts

P, R = JobState.PENDING, JobState.RUNNING

STATES: dict[str, JobState] = {
    **dict.fromkeys(["PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                     "RESV_DEL_HOLD", "SUSPENDED", "STOPPED", "POWER_UP_NODE"], P),
    **dict.fromkeys(["RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"], R),
    "COMPLETED": JobState.DONE,
    **dict.fromkeys(["FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                     "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"], JobState.FAILED),
    "CANCELLED": JobState.CANCELLED,
}

_ARRAY_RE = re.compile(r"^(?P<parent>\d+)_\[(?P<ranges>[^\]]+)\]$")


def expand_ranges(spec: str) -> list[int]:
    """``"1-3,7"`` (or ``"0-9%2"``, or SGE's ``"1-7:2"``) -> indices."""
    spec = spec.split("%", 1)[0]  # SLURM's max-simultaneous suffix
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        rng, _, step = part.partition(":")
        lo, _, hi = rng.partition("-")
        out += range(int(lo), int(hi or lo) + 1, int(step or 1))
    return out


def slurm_memory(nbytes: int) -> str:
    """``--mem`` as dask-jobqueue writes it.

    Whole GiB (SLURM's ``G``) rounded up from 1 GiB on, else whole MiB, else KiB -- never
    less than asked for.

    >>> slurm_memory(28 * 10**9), slurm_memory(300 * 10**6), slurm_memory(2**30)
    ('27G', '287M', '1G')
    """
    for suffix, unit in (("G", 2**30), ("M", 2**20)):
        if nbytes >= unit:
            return f"{ceil_div(nbytes, unit)}{suffix}"
    return f"{max(1, ceil_div(nbytes, 2**10))}K"


def slurm_megabytes(env: Mapping[str, str], name: str) -> int | None:
    """SLURM's memory variables count megabytes (MiB); a suffix K/M/G/T is binary too.

    >>> slurm_megabytes({"SLURM_MEM_PER_NODE": "4G"}, "SLURM_MEM_PER_NODE") == 4 * 2**30
    True
    """
    value = env.get(name)
    if value is None or value.strip() in ("", "0"):  # 0 means "all the node's memory"
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGTkmgt]?)[Bb]?\s*", value)
    if m is None:
        raise ValueError(f"environment variable {name}={value!r} is not a SLURM memory size "
                         "(megabytes, e.g. 4000 or 4G)")
    scale = {"": 2**20, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def parse_slurm_time(text: str) -> float | None:
    """SLURM's local ``2026-11-29T09:18:28`` as epoch seconds; None for ``Unknown``.

    >>> parse_slurm_time("2026-11-29T09:18:28") == time.mktime((2026, 11, 29, 9, 18, 28, 0, 0, -1))
    True
    >>> parse_slurm_time("Unknown") is None
    True
    """
    text = text.strip()
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        raise ValueError(f"{text!r} is not a SLURM time (YYYY-MM-DDTHH:MM:SS)") from None


def parse_exit_code(text: str) -> int | None:
    """SLURM's ``"3:0"`` (status:signal) -> 3; a signal gives 128 + signal."""
    m = re.match(r"^(\d+):(\d+)$", text.strip())
    if not m:
        return None
    code, sig = int(m.group(1)), int(m.group(2))
    return 128 + sig if sig and not code else code


class SLURMSystem(BatchSystem):
    """SLURM as a :class:`~hpcsched.jobqueue.base.BatchSystem`: its hooks."""

    system = "slurm"
    walltime_two_fields = "mm:ss"  # --time: minutes:seconds
    directive_prefix = "#SBATCH"
    queue_flag = "-p"
    submit_command = ["sbatch", "--parsable"]
    cancel_command = ["scancel"]
    job_id_regex = r"^(?P<job_id>\d+)(?:;\S+)?$"  # "42", or "42;cluster" when federated
    states = STATES
    array_index_var = "SLURM_ARRAY_TASK_ID"
    array_first_index = 0
    project_is_deprecated = True
    job_id_variables = ("SLURM_JOB_ID", "SLURM_JOBID")
    #: dask-jobqueue's: CPUs and memory to book when they differ from cores and memory
    extra_params = {"job_cpu": None, "job_mem": None}

    # sbatch's output environment variables (man sbatch); SLURM_JOB_END_TIME since 23.02
    job_counts = {"node_cpus": ("SLURM_CPUS_ON_NODE",), "cpus_per_rank": ("SLURM_CPUS_PER_TASK",)}

    @classmethod
    @override
    def job_details(cls, env: Mapping[str, str], hostname: str) -> dict[str, Any]:
        end = env.get("SLURM_JOB_END_TIME", "").strip()
        try:
            walltime_end = float(end) if end else None
        except ValueError:
            raise ValueError(f"SLURM_JOB_END_TIME={end!r} is not epoch seconds") from None
        return {"node_memory": slurm_megabytes(env, "SLURM_MEM_PER_NODE"),
                "memory_per_cpu": slurm_megabytes(env, "SLURM_MEM_PER_CPU"),
                "walltime_end": walltime_end}

    @classmethod
    @override
    def ask_walltime_end(cls, job_id: str, timeout: float) -> float | None:
        # SLURM sets SLURM_JOB_END_TIME in a job's environment only from its 23.02 release
        # on; before, the job's EndTime is in what scontrol says of it
        out = runner.run_command(["scontrol", "-o", "show", "job", job_id], timeout=timeout)
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return parse_slurm_time(fields.get("EndTime", ""))

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sacct_works: bool | None = None  # None: not tried yet

    @override
    def validate_system(self) -> None:
        p = self.params
        if p["resource_spec"]:
            raise ValueError("resource_spec is not a SLURM option: put SLURM options in "
                             "job_extra_directives, e.g. ['--gres=gpu:1']")
        if p["job_cpu"] is not None and (isinstance(p["job_cpu"], bool)
                                         or not isinstance(p["job_cpu"], int) or p["job_cpu"] < 1):
            raise ValueError(f"job_cpu must be a positive integer, got {p['job_cpu']!r}")
        if p["job_mem"] is not None and not isinstance(p["job_mem"], (str, int)):
            raise TypeError(f"job_mem must be SLURM's --mem value such as '100G', "
                            f"got {p['job_mem']!r}")

    @override
    def name_directives(self, job_name: str, log_file: str, array: int | None) -> list[str]:
        return [f"-J {job_name}", f"-o {log_file}"]

    @override
    def array_directive(self, job_name: str, count: int) -> list[str]:
        return [f"--array=0-{count - 1}"]

    @override
    def array_log_token(self) -> str:
        return "%a"

    @override
    def resource_directives(self, ntasks: int) -> list[str]:
        p = self.params
        out = self.queue_account_directives()
        out.append(f"-n {ntasks}")
        out.append(f"--cpus-per-task={p['job_cpu'] or max(1, p['cores'] // ntasks)}")
        out.append(f"--mem={p['job_mem'] or slurm_memory(self.memory_bytes)}")
        if self.walltime_seconds:
            out.append(f"-t {format_hms(self.walltime_seconds)}")
        return out

    @override
    def array_element_ids(self, parent: str, count: int) -> list[str]:
        return [f"{parent}_{i}" for i in range(count)]

    @override
    def query_ids(self, job_ids: list[str]) -> list[str]:
        return list(dict.fromkeys(j.split("_", 1)[0] for j in job_ids))

    @override
    def node_addresses(self) -> list[str]:
        # the NodeAddr of each node of the job's partition (the default one without queue=)
        queue = self.params["queue"]
        cmd = ["sinfo", "-h", "-N", "-o", "%o", *(["-p", queue] if queue else [])]
        try:
            out = self._run(cmd, timeout=NODE_QUERY_TIMEOUT)
        except runner.BatchCommandError as e:
            logger.debug("%s failed (%s): compute nodes' addresses unknown", " ".join(cmd), e)
            return []
        return list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))

    @override
    def status_command(self, job_ids: list[str]) -> list[str]:
        return ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i %T"]

    @override
    def parse_status(self, output: str) -> dict[str, tuple[str, int | None]]:
        out: dict[str, tuple[str, int | None]] = {}
        for line in output.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            job_id, state = parts[0], parts[1].rstrip("+")
            m = _ARRAY_RE.match(job_id)
            if m:  # pending array elements are listed as one line: 42_[1-3]
                for i in expand_ranges(m.group("ranges")):
                    out[f"{m.group('parent')}_{i}"] = (state, None)
            else:
                out[job_id] = (state, None)
        return out

    @override
    def status_error_ok(self, error: runner.BatchCommandError) -> bool:
        # every id unknown: "slurm_load_jobs error: Invalid job id specified", exit 1
        return "Invalid job id" in error.stderr

    @override
    def status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        result = super().status(job_ids)
        for job_id, st in result.items():
            # squeue has no exit-code field: ask scontrol, only on the (rare) failure path
            if st.state is JobState.FAILED and st.exit_code is None and self.has_command("scontrol"):
                detail = self._scontrol(job_id)
                if detail is not None and detail.exit_code is not None:
                    result[job_id] = JobStatus(st.state, st.native, detail.exit_code)
        return result

    @override
    def finished_status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        result = self._sacct(job_ids)
        for job_id in job_ids:
            if job_id not in result and self.has_command("scontrol"):
                status = self._scontrol(job_id)
                if status:
                    result[job_id] = status
        return result

    def _sacct(self, job_ids: list[str]) -> dict[str, JobStatus]:
        if self._sacct_works is False or not self.has_command("sacct"):
            return {}
        try:
            out = self._run(["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids),
                             "-o", "JobID,State,ExitCode"])
        except runner.BatchCommandError as e:
            # no accounting database ("Slurm accounting storage is disabled"): stop asking
            if not isinstance(e, runner.BatchCommandTimeout):
                self._sacct_works = False
            return {}
        self._sacct_works = True
        result = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) < 3:
                continue
            native = parts[1].split()[0] if parts[1].split() else ""  # "CANCELLED by 0"
            code = parse_exit_code(parts[2])
            result[parts[0]] = JobStatus(self.states.get(native, JobState.UNKNOWN), native, code)
        return result

    def _scontrol(self, job_id: str) -> JobStatus | None:
        try:
            out = self._run(["scontrol", "show", "job", job_id])
        except runner.BatchCommandError:
            return None  # "Invalid job id specified": older than MinJobAge
        state = re.search(r"\bJobState=(\S+)", out)
        code = re.search(r"\bExitCode=(\S+)", out)
        if not state:
            return None
        native = state.group(1)
        return JobStatus(self.states.get(native, JobState.UNKNOWN), native,
                         parse_exit_code(code.group(1)) if code else None)

