"""The jobs of a test on a batch system, as the batch system itself sees them:
:class:`Batch` builds the test's clusters and checks, with the system's own command
(``squeue``, ``qstat``, ``bjobs``) rather than through the adapter, that nothing it
submitted is left. The ``batch`` fixture of tests/jobqueue/conftest.py gives one.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from hpcsched.jobqueue.cluster import JobQueueCluster
from hpcsched.jobqueue.clusters import (
    FluxCluster,
    HTCondorCluster,
    LSFCluster,
    MoabCluster,
    OARCluster,
    PBSCluster,
    SGECluster,
    SLURMCluster,
)

ROOT = Path(__file__).resolve().parents[2]
CLASSES = {"slurm": SLURMCluster, "sge": SGECluster, "pbs": PBSCluster, "lsf": LSFCluster,
           "torque": PBSCluster, "htcondor": HTCondorCluster, "oar": OARCluster,
           "moab": MoabCluster, "flux": FluxCluster}
#: what a cluster of each system needs beyond cores and memory
REQUIRED = {"htcondor": {"disk": "1GB"}, "oar": {"memory_per_core_property_name": "memcore"}}


def run_command(cmd: list[str], env: dict[str, str] | None) -> subprocess.CompletedProcess:
    """A batch system's command, its output captured (30 s at most)."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)


def unfinished(system: str, env: dict[str, str] | None = None) -> set[str]:
    """Numeric ids of this user's unfinished jobs, straight from the batch system."""
    if system == "slurm":
        out = run_command(["squeue", "-h", "-o", "%i %T"], env).stdout
        return {ln.split()[0].split("_")[0] for ln in out.splitlines()
                if len(ln.split()) > 1 and ln.split()[1] not in ("COMPLETED", "CANCELLED",
                                                                 "FAILED", "TIMEOUT")}
    if system == "sge":
        return {ln.split()[0] for ln in run_command(["qstat"], env).stdout.splitlines()[2:]
                if ln.split()}
    if system == "torque":  # the wrappers list finished jobs as C for a while
        return {ln.split()[0] for ln in run_command(["qstat"], env).stdout.splitlines()[2:]
                if len(ln.split()) > 4 and ln.split()[-2] != "C"}
    if system == "pbs":  # without -x: unfinished jobs only
        return {ln.split()[0].split("[")[0].split(".")[0]
                for ln in run_command(["qstat"], env).stdout.splitlines()[2:] if ln.split()}
    if system == "htcondor":  # condor_q lists the jobs in the queue only
        out = run_command(["condor_q", "-af:j", "JobStatus"], env).stdout
        return {ln.split(".")[0] for ln in out.splitlines() if ln.strip()}
    if system == "oar":
        out = json.loads(run_command(["oarstat", "-J"], env).stdout or "{}")
        return {j for j, info in out.items() if info["state"] not in ("Terminated", "Error")}
    if system == "moab":  # without -c: active, eligible and blocked jobs
        root = ElementTree.fromstring(run_command(["showq", "--xml"], env).stdout)
        return {job.get("JobID", "") for job in root.iter("job")}
    if system == "flux":
        out = run_command(["flux", "jobs", "-a", "-n", "-o", "{id.f58} {status}"], env).stdout
        return {ln.split()[0] for ln in out.splitlines() if len(ln.split()) > 1
                and ln.split()[1] not in ("COMPLETED", "FAILED", "CANCELED", "TIMEOUT")}
    out = run_command(["bjobs", "-noheader", "-o", "jobid"], env).stdout  # unfinished only
    return {ln.strip() for ln in out.splitlines() if ln.strip().isdigit()}


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def numeric(job_id: str) -> str:
    if job_id.startswith(("ƒ", "f")):  # Flux's F58 ids have no number in them
        return job_id
    return job_id.split("_")[0].split("[")[0].split(".")[0]


@dataclass
class Batch:
    system: str
    log_dir: Path
    env: dict[str, str]
    clusters: list[JobQueueCluster] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)  # numeric ids this test submitted

    def cluster(self, **kwargs) -> JobQueueCluster:
        kw = dict(cores=1, memory="300MB", walltime="00:10:00", death_timeout=20,
                  log_directory=str(self.log_dir), **REQUIRED.get(self.system, {}))
        kw.update(kwargs)
        c = CLASSES[self.system](**kw)
        self.clusters.append(c)
        return c

    def record(self, cluster: JobQueueCluster) -> set[str]:
        ids = {numeric(j) for j in cluster.jobs}
        self.ids |= ids
        return ids

    def assert_queue_empty(self, ids: set[str] | None = None, timeout: float = 30) -> None:
        ids = self.ids if ids is None else ids
        wait_for(lambda: not (ids & unfinished(self.system, self.env)), timeout,
                 f"jobs {sorted(ids)} to leave the {self.system} queue "
                 f"(still: {sorted(ids & unfinished(self.system, self.env))})")
