"""Grid Engine (SGE / Son of Grid Engine / UGE) as a batch system.

It submits with ``qsub -terse``, cancels with ``qdel`` and asks ``qstat -xml`` (``qacct``
for jobs that left the queue).

Memory is requested per slot, as Grid Engine counts it: ``memory / cores`` with the
``smp`` parallel environment. ``memory_resource`` names the complex: ``mem_free``
(a scheduling hint, the default) or ``h_vmem`` (a hard virtual-memory limit, which
can kill Python processes that merely reserve address space).

dask-jobqueue writes neither: its users ask for memory in ``resource_spec`` and for
slots in ``job_extra_directives`` (``-pe smp 8``). So a ``resource_spec`` replaces the
memory request, and a ``-pe`` among the extra directives replaces the ``pe`` one.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from typing_extensions import override

import hpcsched.jobqueue.runner as runner
from hpcsched.jobqueue.base import BatchSystem, JobStatus, mib
from hpcsched.jobqueue.job import JobState, ceil_div, format_hms
from hpcsched.jobqueue.systems.slurm import expand_ranges
from hpcsched.launchers.resources import JobEnvironment, env_int

STATES: dict[str, JobState] = {
    "qw": JobState.PENDING, "hqw": JobState.PENDING, "hRwq": JobState.PENDING,
    "r": JobState.RUNNING, "t": JobState.RUNNING, "Rr": JobState.RUNNING, "Rt": JobState.RUNNING,
    "dr": JobState.CANCELLED, "dt": JobState.CANCELLED, "dqw": JobState.CANCELLED,
    "Eqw": JobState.FAILED, "Ehqw": JobState.FAILED, "EhRqw": JobState.FAILED,
}


def sge_state(native: str) -> JobState:
    """Table first, then by letter: E error, d deletion, r/t running, q/h/w/s/S/T waiting."""
    if native in STATES:
        return STATES[native]
    if "E" in native:
        return JobState.FAILED  # stays in the queue forever unless deleted
    if "d" in native:
        return JobState.CANCELLED
    if "r" in native or "t" in native:
        return JobState.RUNNING
    if any(c in native for c in "qhwsST"):
        return JobState.PENDING
    return JobState.UNKNOWN


class SGESystem(BatchSystem):
    """Grid Engine as a :class:`~hpcsched.jobqueue.base.BatchSystem`: its hooks."""

    system = "sge"
    walltime_two_fields = "mm:ss"  # h_rt=[[hours:]minutes:]seconds
    directive_prefix = "#$"
    account_flag = "-P"
    submit_command = ["qsub", "-terse"]
    cancel_command = ["qdel"]
    job_id_regex = r"^(?P<job_id>\d+)(?:\.\d+-\d+:\d+)?$"  # "3", arrays "3.1-4:1"
    states = STATES
    array_index_var = "SGE_TASK_ID"
    array_first_index = 1
    extra_params = {"pe": "smp", "memory_resource": "mem_free"}

    @classmethod
    @override
    def in_job(cls, env: Mapping[str, str], hostname: str) -> JobEnvironment | None:
        # JOB_ID is a common name: a Grid Engine job also has SGE_ROOT, NSLOTS or SGE_TASK_ID
        job_id = env.get("JOB_ID", "").strip()
        if not job_id or not (env.get("SGE_ROOT") or env.get("NSLOTS")
                              or env.get("SGE_TASK_ID")):
            return None
        task = env.get("SGE_TASK_ID", "").strip()
        if task and task.lower() != "undefined":
            job_id = f"{job_id}.{task}"
        return JobEnvironment(cls.system, job_id, node_cpus=env_int(env, "NSLOTS"))

    @override
    def validate_system(self) -> None:
        if self.params["memory_resource"] not in (None, "mem_free", "h_vmem", "s_vmem",
                                                  "virtual_free", "h_rss"):
            raise ValueError(f"memory_resource={self.params['memory_resource']!r}: use mem_free, "
                             "h_vmem, s_vmem, virtual_free, h_rss or None")

    @override
    def name_directives(self, job_name: str, log_file: str, array: int | None) -> list[str]:
        return [f"-N {job_name}", f"-o {log_file}", "-j y", "-cwd"]

    @override
    def array_directive(self, job_name: str, count: int) -> list[str]:
        return [f"-t 1-{count}"]

    @override
    def array_log_token(self) -> str:
        return "$TASK_ID"

    @override
    def resource_directives(self, ntasks: int) -> list[str]:
        p = self.params
        out = self.queue_account_directives()
        slots = 1
        own_pe = any(d.strip().startswith("-pe ") for d in p["job_extra_directives"])
        if p["cores"] > 1 and p["pe"] and not own_pe:
            slots = p["cores"]
            out.append(f"-pe {p['pe']} {slots}")
        if p["memory_resource"] and not p["resource_spec"]:
            out.append(f"-l {p['memory_resource']}={ceil_div(mib(self.memory_bytes), slots)}M")
        if self.walltime_seconds:
            out.append(f"-l h_rt={format_hms(self.walltime_seconds)}")
        if p["resource_spec"]:
            out.append(f"-l {p['resource_spec']}")
        return out

    @override
    def array_element_ids(self, parent: str, count: int) -> list[str]:
        return [f"{parent}.{i}" for i in range(1, count + 1)]

    @override
    def already_gone(self, error: runner.BatchCommandError) -> bool:
        return "does not exist" in error.stderr + error.stdout

    @override
    def status_command(self, job_ids: list[str]) -> list[str]:
        return ["qstat", "-xml"]  # all of the user's jobs, in one call

    @override
    def parse_status(self, output: str) -> dict[str, tuple[str, int | None]]:
        if not output.strip():
            return {}
        try:
            root = ET.fromstring(output)
        except ET.ParseError as e:
            raise runner.BatchCommandError(f"qstat -xml printed unparsable XML ({e}):\n"
                                           f"{runner.tail(output)}", cmd=["qstat", "-xml"],
                                           stdout=output) from None
        out: dict[str, tuple[str, int | None]] = {}
        for jl in root.iter("job_list"):
            number = (jl.findtext("JB_job_number") or "").strip()
            state = (jl.findtext("state") or "").strip()
            tasks = (jl.findtext("tasks") or "").strip()
            if not number:
                continue
            if tasks:
                for i in expand_ranges(tasks):
                    out[f"{number}.{i}"] = (state, None)
            else:
                out[number] = (state, None)
        return out

    @override
    def to_state(self, native: str, exit_code: int | None) -> JobState:
        return sge_state(native)

    @override
    def stuck_in_queue(self, native: str) -> bool:
        return "E" in native

    @override
    def finished_status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        if not self.has_command("qacct"):
            return {}
        result = {}
        for job_id in job_ids:
            number, _, task = job_id.partition(".")
            cmd = ["qacct", "-j", number] + (["-t", task] if task else [])
            try:
                out = self._run(cmd)
            except runner.BatchCommandError:
                continue  # not (yet) in the accounting file
            status = parse_qacct(out)
            if status:
                result[job_id] = status
        return result


def parse_qacct(output: str) -> JobStatus | None:
    """The last record of ``qacct -j`` output -> done (exit 0) or failed."""
    failed = re.findall(r"^failed\s+(\d+)", output, re.MULTILINE)
    codes = re.findall(r"^exit_status\s+(\d+)", output, re.MULTILINE)
    if not codes:
        return None
    code = int(codes[-1])
    fail = int(failed[-1]) if failed else 0
    state = JobState.DONE if code == 0 and fail == 0 else JobState.FAILED
    return JobStatus(state, f"failed={fail}", code)

