"""The batch systems, one module each: its commands, formats and in-job environment.

Each module holds a :class:`~hpcsched.jobqueue.base.BatchSystem` subclass: what the
system is, as data and small hooks, including what its jobs' environment says
(:meth:`~hpcsched.jobqueue.base.BatchSystem.in_job`). Every worker asks which job it runs
in (:func:`detect_job`, the seam ``batch-job``), so the question is answered cheaply: a
system's module, and with it :mod:`hpcsched.jobqueue.base` and its shell commands, is
imported only where the environment holds one of that system's job variables
(:data:`JOB_VARIABLES`); outside a batch job nothing is. :mod:`hpcsched.jobqueue.clusters`
binds each system to its cluster class.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcsched.jobqueue.base import BatchSystem
    from hpcsched.launchers.resources import JobEnvironment

logger = logging.getLogger(__name__)

#: seconds a batch system's command may take to say when a job ends (:func:`job_end`)
JOB_END_QUERY_TIMEOUT = 10.0

#: module -> BatchSystem class, in the order a job's environment is recognised (a Moab
#: job under Torque also has PBS_JOBID, and Flux may run under SLURM: the more specific first)
SYSTEMS: dict[str, str] = {
    "flux": "FluxSystem",
    "slurm": "SLURMSystem",
    "moab": "MoabSystem",
    "pbs": "PBSSystem",
    "lsf": "LSFSystem",
    "sge": "SGESystem",
    "oar": "OARSystem",
    "htcondor": "HTCondorSystem",
}

#: module -> the variables of which a job of that system sets at least one: its job id
#: (:attr:`~hpcsched.jobqueue.base.BatchSystem.job_id_variables`; Grid Engine's
#: ``JOB_ID``) or, for HTCondor, the path of the job's ClassAd. A system whose variables
#: are all unset is not asked.
JOB_VARIABLES: dict[str, tuple[str, ...]] = {
    "flux": ("FLUX_JOB_ID",),
    "slurm": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "moab": ("MOAB_JOBID",),
    "pbs": ("PBS_JOBID",),
    "lsf": ("LSB_JOBID",),
    "sge": ("JOB_ID",),
    "oar": ("OAR_JOB_ID", "OAR_JOBID"),
    "htcondor": ("_CONDOR_JOB_AD",),
}


def system_class(module: str) -> type[BatchSystem]:
    """The batch system of ``module`` (a key of :data:`SYSTEMS`), imported on first use."""
    return getattr(importlib.import_module(f"{__name__}.{module}"), SYSTEMS[module])


def system_classes() -> list[type[BatchSystem]]:
    """Every batch system's class, in :data:`SYSTEMS`'s order."""
    return [system_class(module) for module in SYSTEMS]


def detect_job(env: Mapping[str, str], hostname: str) -> JobEnvironment | None:
    """The batch job whose environment ``env`` is, asked of each system whose job
    variables it sets, in turn; None outside a job.

    >>> detect_job({"HOME": "/home/me"}, "node1") is None
    True
    """
    for module, variables in JOB_VARIABLES.items():
        if any(env.get(v, "").strip() for v in variables):
            job = system_class(module).in_job(env, hostname)
            if job is not None:
                return job
    return None


def job_end(job: JobEnvironment, timeout: float = JOB_END_QUERY_TIMEOUT) -> float | None:
    """When ``job`` ends (epoch seconds): what its environment said, else what its batch
    system's commands say (:meth:`~hpcsched.jobqueue.base.BatchSystem.ask_walltime_end`:
    SLURM before 23.02 says it only through ``scontrol``); None when neither says. Asked
    once, as a worker starts (the seam ``batch-job-end``): a command that fails or takes
    longer than ``timeout`` seconds is logged, and the job's end taken for unknown.
    """
    if job.walltime_end is not None:
        return job.walltime_end
    if job.system not in SYSTEMS:
        return None
    from hpcsched.jobqueue.runner import BatchCommandError

    try:
        return system_class(job.system).ask_walltime_end(job.job_id, timeout)
    except (BatchCommandError, ValueError) as e:
        logger.warning("cannot read the end of %s job %s (%s): its walltime is unknown",
                       job.system, job.job_id, e)
        return None
