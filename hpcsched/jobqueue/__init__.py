"""Batch-system clusters: workers as SLURM, Grid Engine, PBS or LSF jobs.

Modules: ``runner`` (the one shell-command function), ``job`` (JobState, Job,
memory/walltime parsing), ``launch`` (in-allocation launchers), ``base`` (the
batch-system adapter base: parameters, script rendering, submit/status/cancel),
``cluster`` (JobQueueCluster: scheduler, scaling, polling), ``cleanup`` (nothing
leaks), and one small module per system: ``slurm``, ``sge``, ``pbs``, ``lsf``.
"""

from __future__ import annotations

from hpcsched._lazy import lazy_exports

_exports = {
    "SLURMCluster": "hpcsched.jobqueue.slurm",
    "SGECluster": "hpcsched.jobqueue.sge",
    "PBSCluster": "hpcsched.jobqueue.pbs",
    "LSFCluster": "hpcsched.jobqueue.lsf",
    "JobQueueCluster": "hpcsched.jobqueue.cluster",
    "JobFailedError": "hpcsched.jobqueue.cluster",
    "JobState": "hpcsched.jobqueue.job",
    "Job": "hpcsched.jobqueue.job",
    "BatchCommandError": "hpcsched.jobqueue.runner",
    "BatchCommandTimeout": "hpcsched.jobqueue.runner",
    "BatchCommandNotFound": "hpcsched.jobqueue.runner",
    "launch_command": "hpcsched.jobqueue.launch",
}

__all__ = sorted(_exports)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _exports)
