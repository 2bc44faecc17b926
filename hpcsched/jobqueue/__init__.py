"""Batch-system clusters: workers as SLURM, Grid Engine, PBS, LSF, HTCondor, OAR, Moab or
Flux jobs.

Modules: ``runner`` (the one shell-command function), ``job`` (JobState, Job,
memory/walltime parsing), ``launch`` (in-allocation launchers), ``base`` (the
batch-system adapter base: parameters, script rendering, submit/status/cancel),
``cluster`` (JobQueueCluster: scheduler, scaling, polling), ``cleanup`` (nothing
leaks), and ``systems/``, one small module per system: ``slurm``, ``sge``, ``pbs``, ``lsf``,
``htcondor``, ``oar``, ``moab``, ``flux`` (bound to their clusters in ``clusters``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcsched._lazy import lazy_exports

_exports = {
    "SLURMCluster": "hpcsched.jobqueue.clusters",
    "SGECluster": "hpcsched.jobqueue.clusters",
    "PBSCluster": "hpcsched.jobqueue.clusters",
    "LSFCluster": "hpcsched.jobqueue.clusters",
    "HTCondorCluster": "hpcsched.jobqueue.clusters",
    "OARCluster": "hpcsched.jobqueue.clusters",
    "MoabCluster": "hpcsched.jobqueue.clusters",
    "FluxCluster": "hpcsched.jobqueue.clusters",
    "JobQueueCluster": "hpcsched.jobqueue.cluster",
    "JobFailedError": "hpcsched.jobqueue.cluster",
    "SchedulerUnreachableError": "hpcsched.jobqueue.cluster",
    "JobState": "hpcsched.jobqueue.job",
    "Job": "hpcsched.jobqueue.job",
    "BatchCommandError": "hpcsched.jobqueue.runner",
    "BatchCommandTimeout": "hpcsched.jobqueue.runner",
    "BatchCommandNotFound": "hpcsched.jobqueue.runner",
    "launch_command": "hpcsched.jobqueue.launch",
}

__all__ = [
    "BatchCommandError",
    "BatchCommandNotFound",
    "BatchCommandTimeout",
    "FluxCluster",
    "HTCondorCluster",
    "Job",
    "JobFailedError",
    "JobQueueCluster",
    "JobState",
    "LSFCluster",
    "MoabCluster",
    "OARCluster",
    "PBSCluster",
    "SGECluster",
    "SLURMCluster",
    "SchedulerUnreachableError",
    "launch_command",
]

# Type checkers and IDEs read these imports (public through __all__, which they read as a
# literal list); at run time the names come from __getattr__ below. tests/test_exports.py
# keeps _exports, __all__ and these imports equal. Without a __getattr__ in their view, a
# misspelt name is an error to them rather than Any.
if TYPE_CHECKING:
    from hpcsched.jobqueue.cluster import (
        JobFailedError,
        JobQueueCluster,
        SchedulerUnreachableError,
    )
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
    from hpcsched.jobqueue.job import Job, JobState
    from hpcsched.jobqueue.launch import launch_command
    from hpcsched.jobqueue.runner import (
        BatchCommandError,
        BatchCommandNotFound,
        BatchCommandTimeout,
    )
else:
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _exports)
