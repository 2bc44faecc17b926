"""hpcsched: a distributed task scheduler for HPC clusters.

The public API mirrors dask.distributed's names so users can move over::

    from hpcsched import Client
    with Client() as client:                # a LocalCluster sized to the machine
        futures = client.map(lambda x: x + 1, range(10))
        print(sum(client.gather(futures)))
"""

from __future__ import annotations

from hpcsched._lazy import lazy_exports

__version__ = "0.1.0"

# name -> module; imported on first use so `import hpcsched` stays cheap and
# never imports mpi4py unless MPI is used.
_exports = {
    "Client": "hpcsched.core.client",
    "Future": "hpcsched.core.client",
    "wait": "hpcsched.core.client",
    "as_completed": "hpcsched.core.client",
    "progress": "hpcsched.diagnostics.progress",
    "default_client": "hpcsched.core.client",
    "fire_and_forget": "hpcsched.core.client",
    "futures_of": "hpcsched.core.client",
    "get": "hpcsched.core.local",
    "get_client": "hpcsched.core.worker_client",
    "get_worker": "hpcsched.core.worker_client",
    "worker_client": "hpcsched.core.worker_client",
    "secede": "hpcsched.core.worker_client",
    "rejoin": "hpcsched.core.worker_client",
    "Lock": "hpcsched.core.coordination",
    "Semaphore": "hpcsched.core.coordination",
    "Event": "hpcsched.core.coordination",
    "Variable": "hpcsched.core.coordination",
    "Queue": "hpcsched.core.coordination",
    "MultiLock": "hpcsched.core.coordination",
    "WorkerPlugin": "hpcsched.core.plugins",
    "SchedulerPlugin": "hpcsched.core.plugins",
    "NannyPlugin": "hpcsched.core.nanny",
    "LocalCluster": "hpcsched.launchers.local_cluster",
    "initialize": "hpcsched.hpc.bootstrap",
    "send_close_signal": "hpcsched.hpc.bootstrap",
    "SLURMCluster": "hpcsched.jobqueue.slurm",
    "SGECluster": "hpcsched.jobqueue.sge",
    "PBSCluster": "hpcsched.jobqueue.pbs",
    "LSFCluster": "hpcsched.jobqueue.lsf",
    "Adaptive": "hpcsched.launchers.adaptive",
    "Security": "hpcsched.core.comm.base",
    "performance_report": "hpcsched.diagnostics.report",
    "get_task_stream": "hpcsched.diagnostics.report",
    "config": "hpcsched.core.config",
}

__all__ = sorted(_exports)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _exports, modules=('config',))
