"""The batch systems, one module each: its commands, formats and in-job environment.

Each module holds a :class:`~hpcsched.jobqueue.base.BatchSystem` subclass: what the
system is, as data and small hooks, including what its jobs' environment says
(:meth:`~hpcsched.jobqueue.base.BatchSystem.in_job`). The modules import nothing of the
scheduler, so that a worker reads its job's environment cheaply
(:func:`detect_job`, the seam ``batch-job``); :mod:`hpcsched.jobqueue.clusters` binds
each system to its cluster class.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

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


def system_classes() -> list[type[BatchSystem]]:
    """Every batch system's class, in :data:`SYSTEMS`'s order."""
    return [
        getattr(importlib.import_module(f"{__name__}.{module}"), cls)
        for module, cls in SYSTEMS.items()
    ]


def detect_job(env: Mapping[str, str], hostname: str) -> JobEnvironment | None:
    """The batch job whose environment ``env`` is, asked of each system in turn; None
    outside a job."""
    for cls in system_classes():
        job = cls.in_job(env, hostname)
        if job is not None:
            return job
    return None
