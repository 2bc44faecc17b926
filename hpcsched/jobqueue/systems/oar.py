"""OAR as a batch system: ``oarsub -S``, ``oarstat -J``, ``oardel``.

Written from OAR 2.5's manual pages (``oarsub(1)``, ``oarstat(1)``, ``oardel(1)``) and
its user documentation:

* ``oarsub -S script`` reads the script's ``#OAR`` lines as options and prints
  ``OAR_JOB_ID=<id>``; the script must be executable, and it is run from where it was
  written (a shared file system, like the log directory), as dask-jobqueue requires;
* resources go on ONE ``-l`` line (several ``-l`` lines make a "moldable" job whose
  resources the scheduler may choose among), ``/nodes=1/core=<cores>,walltime=H:M:S``
  by default, as dask-jobqueue writes it; memory is a property of the nodes
  (``-p memcore>=<MiB per core>``, ``memory_per_core_property_name``), and OAR keeps only
  the last ``-p``, so a ``-p`` in ``job_extra_directives`` is merged with it by ``AND``;
* ``oarstat -f -J -j ID ...`` prints a JSON object keyed by job id, whose ``state`` is
  one of OAR's job states and whose ``exit_code`` is the job's wait status; finished
  jobs stay in its database, so no accounting command is needed.

Inside a job OAR sets ``OAR_JOB_ID`` (``OAR_JOBID``), ``OAR_NODEFILE`` (one line per
core given, named by host) and ``OAR_JOB_WALLTIME_SECONDS``.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

from typing_extensions import override

import hpcsched.jobqueue.runner as runner
from hpcsched.jobqueue.base import BatchSystem
from hpcsched.jobqueue.job import JobState, ceil_div, format_hms
from hpcsched.launchers import resources
from hpcsched.launchers.resources import env_int

P, R = JobState.PENDING, JobState.RUNNING

STATES: dict[str, JobState] = {
    **dict.fromkeys(
        ["Waiting", "Hold", "toLaunch", "toAckReservation", "Launching", "Suspended", "Resuming"], P
    ),
    **dict.fromkeys(["Running", "Finishing"], R),
    "Terminated": JobState.DONE,  # refined by the exit code (to_state)
    **dict.fromkeys(["Error", "toError"], JobState.FAILED),
}


def wait_status_code(status: int | None) -> int | None:
    """OAR's ``exit_code`` is a wait status: the exit code, or 128 + the signal.

    >>> wait_status_code(256), wait_status_code(0), wait_status_code(9), wait_status_code(None)
    (1, 0, 137, None)
    """
    if status is None:
        return None
    return 128 + (status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def last_property(directives: list[str]) -> str | None:
    """The last ``-p`` property of ``job_extra_directives`` (the one OAR keeps)."""
    for directive in reversed(directives):
        if directive.startswith("-p "):
            return directive[3:].strip().strip("'\"")
    return None


class OARSystem(BatchSystem):
    """OAR as a :class:`~hpcsched.jobqueue.base.BatchSystem`: its hooks."""

    system = "oar"
    walltime_two_fields = "hh:mm"  # oarsub's walltime=[hour:mn:sec|hour:mn|hour]
    directive_prefix = "#OAR"
    account_flag = "--project"
    submit_command = ["oarsub", "-S"]
    cancel_command = ["oardel"]
    job_id_regex = r"OAR_JOB_ID=(?P<job_id>\d+)"
    states = STATES
    job_id_variables = ("OAR_JOB_ID", "OAR_JOBID")
    #: dask-jobqueue's: the nodes' property holding their memory per core, in MiB
    #: ("not_applicable": ask for no memory)
    extra_params = {"memory_per_core_property_name": None}

    @classmethod
    @override
    def job_details(cls, env: Mapping[str, str], hostname: str) -> dict[str, Any]:
        cores = None
        nodefile = env.get("OAR_NODEFILE", "")
        if nodefile:
            try:
                with open(nodefile) as f:
                    hosts = [line.strip() for line in f if line.strip()]
            except OSError:
                hosts = []
            short = hostname.split(".")[0]
            cores = sum(1 for h in hosts if h == hostname or h.split(".")[0] == short) or None
        seconds = env_int(env, "OAR_JOB_WALLTIME_SECONDS")
        end = resources.process_start() + seconds if seconds else None
        return {"node_cpus": cores, "walltime_end": end}

    @override
    def validate_system(self) -> None:
        p = self.params
        if p["job_array"]:
            raise ValueError(
                "job_array is not supported on OAR: its array jobs get one job "
                "id per element, which hpcsched does not yet follow"
            )
        if p["memory_per_core_property_name"] is None:
            warnings.warn(
                "OAR Job memory reserved resources will not be set according to the "
                "workers' memory limit, which can cause crashes. Set "
                "memory_per_core_property_name to your nodes' property (oarnodes lists "
                "them; often 'memcore'), or to 'not_applicable'",
                UserWarning,
                stacklevel=4,
            )

    @override
    def name_directives(self, job_name: str, log_file: str, array: int | None) -> list[str]:
        return [f"-n {job_name}", f"-O {log_file}", f"-E {log_file}"]

    @override
    def resource_directives(self, ntasks: int) -> list[str]:
        p = self.params
        spec = [p["resource_spec"] or f"/nodes=1/core={p['cores']}"]
        if self.walltime_seconds:
            spec.append(f"walltime={format_hms(self.walltime_seconds)}")
        return [*self.queue_account_directives(), f"-l {','.join(spec)}"]

    @override
    def header(self, job_name: str, array: int | None = None) -> list[str]:
        # the memory property comes last: OAR keeps the last -p, and merges the user's
        lines = super().header(job_name, array)
        prop = self.params["memory_per_core_property_name"]
        if prop in (None, "not_applicable"):
            return lines
        wanted = f"{prop}>={ceil_div(self.memory_bytes, self.params['cores'] * 2**20)}"
        other = last_property(self.params["job_extra_directives"])
        line = f"#OAR -p '{other} AND {wanted}'" if other else f"#OAR -p {wanted}"
        return (
            lines
            if any(self.skips(line, s) for s in self.params["job_directives_skip"])
            else [*lines, line]
        )

    @override
    def submit(self, script_path: str, script: str) -> str:
        os.chmod(script_path, 0o755)  # oarsub -S runs the script itself
        return super().submit(script_path, script)

    @override
    def already_gone(self, error: runner.BatchCommandError) -> bool:
        text = error.stderr + error.stdout
        return "does not exist" in text or "already killed" in text or "not in a state" in text

    @override
    def status_command(self, job_ids: list[str]) -> list[str]:
        return ["oarstat", "-f", "-J", *(a for j in job_ids for a in ("-j", j))]

    @override
    def status_error_ok(self, error: runner.BatchCommandError) -> bool:
        return error.stdout.strip().startswith("{")

    @override
    def parse_status(self, output: str) -> dict[str, tuple[str, int | None]]:
        text = output.strip()
        if not text:
            return {}
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError as e:
            raise runner.BatchCommandError(
                f"oarstat -J printed invalid JSON ({e}):\n{runner.tail(text)}", stdout=text
            ) from None
        out: dict[str, tuple[str, int | None]] = {}
        for job_id, info in data.items():
            code = info.get("exit_code")
            out[str(job_id)] = (
                str(info.get("state", "")),
                wait_status_code(int(code)) if code is not None else None,
            )
        return out

