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
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcsched.jobqueue.base import BatchSystem
    from hpcsched.launchers.resources import JobEnvironment

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
