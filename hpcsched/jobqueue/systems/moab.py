"""Moab as a batch system: PBS job scripts, ``msub``, ``showq --xml``, ``canceljob``.

Moab is a scheduler over a resource manager (most often Torque): its jobs are PBS job
scripts (``#PBS`` directives, as dask-jobqueue's MoabCluster, a PBSCluster submitting
with ``msub``), but its commands are its own, from Adaptive Computing's Moab Workload
Manager documentation:

* ``msub script`` prints the job's Moab id (``1234``, or ``Moab.1234``) on a line of its
  own, after an empty one;
* ``showq --xml`` lists the active, eligible and blocked jobs as
  ``<queue option="active"><job JobID="1234" State="Running" .../></queue>``, and
  ``showq -c --xml`` the completed ones (``State="Completed"``, ``CompletionCode``);
* ``canceljob ID ...`` cancels.

Inside a job Moab sets ``MOAB_JOBID``; the resource manager's own variables (Torque's
``PBS_NUM_PPN``, ``PBS_WALLTIME``) tell the cores and the walltime.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from typing_extensions import override

import hpcsched.jobqueue.runner as runner
from hpcsched.jobqueue.base import BatchSystem, JobStatus
from hpcsched.jobqueue.job import JobState
from hpcsched.jobqueue.systems.pbs import PBSSystem

P, R = JobState.PENDING, JobState.RUNNING

#: Moab's job states (``showq``'s State attribute)
STATES: dict[str, JobState] = {
    **dict.fromkeys(
        [
            "Idle",
            "Hold",
            "UserHold",
            "SystemHold",
            "BatchHold",
            "Deferred",
            "NotQueued",
            "Staged",
            "Staging",
            "Suspended",
            "Blocked",
        ],
        P,
    ),
    **dict.fromkeys(["Running", "Starting"], R),
    "Completed": JobState.DONE,  # refined by the completion code (to_state)
    **dict.fromkeys(["Removed", "Vacated"], JobState.CANCELLED),
}


class MoabSystem(PBSSystem):
    """Moab over a PBS resource manager as a :class:`~hpcsched.jobqueue.base.BatchSystem`."""

    system = "moab"
    submit_command = ["msub"]
    cancel_command = ["canceljob"]
    job_id_regex = r"^(?P<job_id>(?:Moab\.)?\d+)$"
    states = STATES
    #: PBSSystem.in_job reads the rest (PBS_NUM_PPN, NCPUS, PBS_WALLTIME)
    job_id_variables = ("MOAB_JOBID",)

    @override
    def validate_system(self) -> None:
        super().validate_system()
        if self.params["job_array"]:
            raise ValueError("job_array is not supported on Moab: submit single jobs")

    @override
    def already_gone(self, error: runner.BatchCommandError) -> bool:
        text = error.stderr + error.stdout
        return "cannot locate job" in text or "invalid job" in text.lower()

    @override
    def query_ids(self, job_ids: list[str]) -> list[str]:
        return job_ids

    @override
    def status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        return BatchSystem.status(self, job_ids)

    @override
    def status_command(self, job_ids: list[str]) -> list[str]:
        return ["showq", "--xml"]

    @override
    def status_error_ok(self, error: runner.BatchCommandError) -> bool:
        return False

    @override
    def parse_status(self, output: str) -> dict[str, tuple[str, int | None]]:
        text = output.strip()
        if not text:
            return {}
        try:
            root = ET.fromstring(text)
        except ET.ParseError as e:
            raise runner.BatchCommandError(
                f"showq --xml printed invalid XML ({e}):\n{runner.tail(text)}", stdout=text
            ) from None
        out: dict[str, tuple[str, int | None]] = {}
        for job in root.iter("job"):
            job_id = job.get("JobID", "")
            code = job.get("CompletionCode")
            out[job_id] = (
                job.get("State", ""),
                int(code) if code and code.lstrip("-").isdigit() else None,
            )
            if job_id.isdigit():  # "msub" may have printed it as Moab.<n>
                out[f"Moab.{job_id}"] = out[job_id]
        return out

    @override
    def finished_status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        try:
            out = self._run(["showq", "-c", "--xml"])
        except runner.BatchCommandError:
            return {}
        found = self.parse_status(out)
        return {
            j: JobStatus(self.to_state(*found[j]), found[j][0], found[j][1])
            for j in job_ids
            if j in found
        }
