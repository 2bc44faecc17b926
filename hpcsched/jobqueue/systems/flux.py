"""Flux as a batch system: ``flux batch``, ``flux jobs``, ``flux cancel``.

Written from flux-core's manual pages (``flux-batch(1)``, ``flux-jobs(1)``,
``flux-cancel(1)``, ``flux-resource(1)``, "Flux Standard Duration"):

* ``flux batch script`` reads the script's ``#flux:`` lines as its options and prints
  the new job's id (F58, ``ƒ2Tc8nHw``). A batch job is a Flux instance of its own:
  inside it ``flux run`` starts tasks on its nodes (the launcher ``flux``);
* resources are slots: ``-N`` nodes, ``-n`` slots, ``-c`` cores per slot; the walltime is
  ``-t`` in Flux Standard Duration (``1800s``); Flux schedules no memory, so ``memory``
  is only the workers' limit; ``--output`` takes stderr too unless ``--error`` is given;
* ``flux jobs -a -n -o '{id.f58} {status} {returncode}' IDS`` prints one line per job,
  ``status`` one of DEPEND, PRIORITY, SCHED, RUN, CLEANUP, COMPLETED, FAILED, CANCELED,
  TIMEOUT; inactive jobs stay listed (Flux keeps them), so no accounting is needed;
* ``flux cancel IDS`` cancels.

Inside a job Flux sets ``FLUX_JOB_ID``, and ``FLUX_URI`` names the job's own instance,
which ``flux resource list`` asks for the cores the job holds.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from typing_extensions import override

import hpcsched.jobqueue.runner as runner
from hpcsched.jobqueue.base import BatchSystem
from hpcsched.jobqueue.job import JobState

logger = logging.getLogger(__name__)
INSTANCE_QUERY_TIMEOUT = 10.0  # seconds: asking the job's own Flux instance, once

P, R = JobState.PENDING, JobState.RUNNING

STATES: dict[str, JobState] = {
    **dict.fromkeys(["DEPEND", "PRIORITY", "SCHED", "NEW"], P),
    **dict.fromkeys(["RUN", "CLEANUP"], R),
    "COMPLETED": JobState.DONE,
    **dict.fromkeys(["FAILED", "TIMEOUT"], JobState.FAILED),
    "CANCELED": JobState.CANCELLED,
}


def _ask_instance(args: list[str], env: Mapping[str, str]) -> str | None:
    """The output of ``flux ARGS`` run against the job's instance, or None."""
    flux = shutil.which("flux", path=env.get("PATH"))
    if flux is None:
        return None
    try:
        r = subprocess.run(
            [flux, *args],
            capture_output=True,
            text=True,
            env=dict(env),
            timeout=INSTANCE_QUERY_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.debug("flux %s failed: %s", " ".join(args), e)
        return None
    return r.stdout if r.returncode == 0 else None


class FluxSystem(BatchSystem):
    """Flux as a :class:`~hpcsched.jobqueue.base.BatchSystem`: its hooks."""

    system = "flux"
    directive_prefix = "#flux:"
    submit_command = ["flux", "batch"]
    cancel_command = ["flux", "cancel"]
    job_id_regex = r"^(?P<job_id>\S+)$"
    states = STATES
    job_id_variables = ("FLUX_JOB_ID",)

    @classmethod
    @override
    def job_details(cls, env: Mapping[str, str], hostname: str) -> dict[str, Any]:
        if not env.get("FLUX_URI"):
            return {}
        cores = _ask_instance(["resource", "list", "-s", "up", "-n", "-o", "{ncores}"], env)
        end = None
        r_text = _ask_instance(["kvs", "get", "resource.R"], env)
        if r_text:
            try:
                expiration = float(json.loads(r_text)["execution"].get("expiration", 0))
            except (ValueError, KeyError, TypeError, AttributeError):
                expiration = 0.0
            end = expiration or None
        total = sum(int(x) for x in (cores or "").split() if x.isdigit())
        return {"node_cpus": total or None, "walltime_end": end}

    @override
    def validate_system(self) -> None:
        p = self.params
        if p["job_array"]:
            raise ValueError("job_array is not supported on Flux: submit single jobs")
        if p["launcher"] not in ("fork", "flux"):
            raise ValueError(
                f"launcher={p['launcher']!r}: inside a Flux job, workers start "
                "with 'fork' (one node) or 'flux' (flux run, across its nodes)"
            )

    @override
    def name_directives(self, job_name: str, log_file: str, array: int | None) -> list[str]:
        return [f"--job-name={job_name}", f"--output={log_file}"]

    @override
    def resource_directives(self, ntasks: int) -> list[str]:
        p = self.params
        out = [f"-q {p['queue']}"] if p["queue"] else []
        if p["account"]:
            out.append(f"--setattr=system.bank={p['account']}")
        if p["resource_spec"]:
            out.append(p["resource_spec"])
        else:
            out += ["-N 1", f"-n {ntasks}", f"-c {max(1, p['cores'] // ntasks)}"]
        if self.walltime_seconds:
            out.append(f"-t {self.walltime_seconds}s")
        return out

    @override
    def already_gone(self, error: runner.BatchCommandError) -> bool:
        text = error.stderr + error.stdout
        return "inactive" in text or "unknown job" in text.lower()

    @override
    def status_command(self, job_ids: list[str]) -> list[str]:
        return ["flux", "jobs", "-a", "-n", "-o", "{id.f58} {status} {returncode}", *job_ids]

    @override
    def status_error_ok(self, error: runner.BatchCommandError) -> bool:
        return "unknown" in error.stderr.lower() or "invalid" in error.stderr.lower()

    @override
    def parse_status(self, output: str) -> dict[str, tuple[str, int | None]]:
        out: dict[str, tuple[str, int | None]] = {}
        for line in output.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                code = parts[2] if len(parts) > 2 else ""
                out[parts[0]] = (parts[1], int(code) if code.lstrip("-").isdigit() else None)
        return out

