"""dask-jobqueue's test cluster, ``dask_jobqueue.local.LocalCluster``, over hpcsched: a
batch system whose jobs are local processes.

dask-jobqueue's tests parametrise many of their tests over every cluster class and
this one ("mostly for testing", its docstring says), whose jobs its ``LocalJob`` starts as
subprocesses of the client. Here it is a :class:`~hpcsched.jobqueue.base.BatchSystem`
like the others: its job script is the base's (no directives), submitting runs that
script in a session of its own (the job id is its pid), the status comes from the
process, cancelling signals its process group. Everything else -- parameters, scripts,
the cluster, scaling, adapting -- is hpcsched's own code.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any, ClassVar

from hpcsched.jobqueue.base import BatchSystem, JobStatus
from hpcsched.jobqueue.cluster import JobQueueCluster
from hpcsched.jobqueue.job import JobState


class LocalSystem(BatchSystem):
    """Jobs as local processes (a test double of a batch system, as dask-jobqueue's)."""

    system = "local"
    directive_prefix = ""
    submit_command: ClassVar[list[str]] = ["bash"]

    def __init__(self, **kwargs: Any) -> None:
        self._procs: dict[str, subprocess.Popen] = {}
        super().__init__(**kwargs)

    def name_directives(self, job_name: str, log_file: str, array: int | None) -> list[str]:
        return []

    def resource_directives(self, ntasks: int) -> list[str]:
        return []

    def submit(self, script_path: str, script: str) -> str:
        with open(self.log_file(os.path.basename(script_path).rsplit(".", 1)[0]), "ab") as log:
            proc = subprocess.Popen(["bash", script_path], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs[str(proc.pid)] = proc
        return str(proc.pid)

    def status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        out = {}
        for job_id in job_ids:
            proc = self._procs.get(job_id)
            if proc is None:
                continue  # not ours: unknown, as to a batch system that forgot it
            code = proc.poll()
            if code is None:
                out[job_id] = JobStatus(JobState.RUNNING, "running")
            else:
                out[job_id] = JobStatus(JobState.DONE if code == 0 else JobState.FAILED,
                                        "exited", code)
        return out

    def cancel(self, job_ids: Any) -> None:
        for job_id in job_ids:
            proc = self._procs.get(str(job_id))
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass


class LocalCluster(JobQueueCluster):
    """A :class:`~hpcsched.jobqueue.cluster.JobQueueCluster` whose jobs are local processes."""

    system_class = job_cls = LocalSystem
