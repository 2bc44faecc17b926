"""The batch clusters: each batch system of :mod:`hpcsched.jobqueue.systems` bound to
:class:`~hpcsched.jobqueue.cluster.JobQueueCluster`.

A system's module owns all it knows (commands, formats, its jobs' environment) and
imports nothing of the scheduler, so that a worker can read its job's environment
cheaply; the binding to the cluster, which starts a scheduler, is here.

::

    from hpcsched import Client, SLURMCluster
    cluster = SLURMCluster(cores=8, memory="16GB", walltime="01:00:00", queue="normal")
    print(cluster.job_script())
    cluster.scale(jobs=4)
    client = Client(cluster)

Each class's ``job_cls`` (dask-jobqueue's name) is its system's class: a subclass of it,
passed as ``job_cls=``, changes what the jobs ask for or how they are submitted.
"""

from __future__ import annotations

from hpcsched.jobqueue.cluster import JobQueueCluster
from hpcsched.jobqueue.systems.flux import FluxSystem
from hpcsched.jobqueue.systems.htcondor import HTCondorSystem
from hpcsched.jobqueue.systems.lsf import LSFSystem
from hpcsched.jobqueue.systems.moab import MoabSystem
from hpcsched.jobqueue.systems.oar import OARSystem
from hpcsched.jobqueue.systems.pbs import PBSSystem
from hpcsched.jobqueue.systems.sge import SGESystem
from hpcsched.jobqueue.systems.slurm import SLURMSystem


class SLURMCluster(JobQueueCluster):
    """Workers as SLURM jobs; parameters as in dask-jobqueue's SLURMCluster."""

    system_class = job_cls = SLURMSystem


class SGECluster(JobQueueCluster):
    """Workers as Grid Engine jobs; parameters as in dask-jobqueue's SGECluster (+ ``pe``)."""

    system_class = job_cls = SGESystem


class PBSCluster(JobQueueCluster):
    """Workers as PBS Pro / OpenPBS jobs; parameters as in dask-jobqueue's PBSCluster."""

    system_class = job_cls = PBSSystem


class LSFCluster(JobQueueCluster):
    """Workers as LSF jobs; parameters as in dask-jobqueue's LSFCluster."""

    system_class = job_cls = LSFSystem


class HTCondorCluster(JobQueueCluster):
    """Workers as HTCondor jobs; parameters as in dask-jobqueue's HTCondorCluster
    (``disk`` required, ``job_extra_directives`` a dict of submit attributes)."""

    system_class = job_cls = HTCondorSystem


class OARCluster(JobQueueCluster):
    """Workers as OAR jobs; parameters as in dask-jobqueue's OARCluster
    (``memory_per_core_property_name``)."""

    system_class = job_cls = OARSystem


class MoabCluster(JobQueueCluster):
    """Workers as Moab jobs (PBS scripts, ``msub``); parameters as in dask-jobqueue's
    MoabCluster."""

    system_class = job_cls = MoabSystem


class FluxCluster(JobQueueCluster):
    """Workers as Flux batch jobs (``flux batch``); dask-jobqueue's common parameters."""

    system_class = job_cls = FluxSystem
