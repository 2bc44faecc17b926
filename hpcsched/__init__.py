"""hpcsched: a distributed task scheduler for HPC clusters.

The public API mirrors dask.distributed's names so users can move over::

    from hpcsched import Client
    with Client() as client:                # a LocalCluster sized to the machine
        futures = client.map(lambda x: x + 1, range(10))
        print(sum(client.gather(futures)))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcsched._lazy import lazy_exports, when_imported
from hpcsched._version import __version__ as __version__

# name -> module; imported on first use so `import hpcsched` stays cheap and
# never imports mpi4py unless MPI is used.
_exports = {
    "Client": "hpcsched.core.client.client",
    "Future": "hpcsched.core.client.client",
    "wait": "hpcsched.core.client.client",
    "as_completed": "hpcsched.core.client.client",
    "progress": "hpcsched.diagnostics.progress",
    "default_client": "hpcsched.core.client.client",
    "fire_and_forget": "hpcsched.core.client.client",
    "futures_of": "hpcsched.core.client.client",
    "get": "hpcsched.core.client.local",
    "get_client": "hpcsched.core.client.worker_client",
    "get_worker": "hpcsched.core.client.worker_client",
    "get_task_gpus": "hpcsched.core.client.worker_client",
    "task_env": "hpcsched.core.client.worker_client",
    "worker_client": "hpcsched.core.client.worker_client",
    "secede": "hpcsched.core.client.worker_client",
    "rejoin": "hpcsched.core.client.worker_client",
    "Lock": "hpcsched.core.client.coordination",
    "Semaphore": "hpcsched.core.client.coordination",
    "Event": "hpcsched.core.client.coordination",
    "Variable": "hpcsched.core.client.coordination",
    "Queue": "hpcsched.core.client.coordination",
    "MultiLock": "hpcsched.core.client.coordination",
    "WorkerPlugin": "hpcsched.core.client.plugins",
    "SchedulerPlugin": "hpcsched.core.client.plugins",
    "NannyPlugin": "hpcsched.core.worker.nanny",
    "LocalCluster": "hpcsched.launchers.local_cluster",
    "initialize": "hpcsched.hpc.bootstrap",
    "execute": "hpcsched.hpc.bootstrap",
    "send_close_signal": "hpcsched.hpc.bootstrap",
    "get_task_comm": "hpcsched.hpc.gang",
    "SLURMCluster": "hpcsched.jobqueue.clusters",
    "SGECluster": "hpcsched.jobqueue.clusters",
    "PBSCluster": "hpcsched.jobqueue.clusters",
    "LSFCluster": "hpcsched.jobqueue.clusters",
    "HTCondorCluster": "hpcsched.jobqueue.clusters",
    "OARCluster": "hpcsched.jobqueue.clusters",
    "MoabCluster": "hpcsched.jobqueue.clusters",
    "FluxCluster": "hpcsched.jobqueue.clusters",
    "Adaptive": "hpcsched.launchers.adaptive",
    "Security": "hpcsched.core.comm.base",
    "performance_report": "hpcsched.diagnostics.report",
    "get_task_stream": "hpcsched.diagnostics.report",
    "print": "hpcsched.diagnostics.forwarding",
    "warn": "hpcsched.diagnostics.forwarding",
    "config": "hpcsched.core.config",
}

__all__ = [
    "Adaptive",
    "Client",
    "Event",
    "FluxCluster",
    "Future",
    "HTCondorCluster",
    "LSFCluster",
    "LocalCluster",
    "Lock",
    "MoabCluster",
    "MultiLock",
    "NannyPlugin",
    "OARCluster",
    "PBSCluster",
    "Queue",
    "SGECluster",
    "SLURMCluster",
    "SchedulerPlugin",
    "Security",
    "Semaphore",
    "Variable",
    "WorkerPlugin",
    "as_completed",
    "config",
    "default_client",
    "execute",
    "fire_and_forget",
    "futures_of",
    "get",
    "get_client",
    "get_task_comm",
    "get_task_gpus",
    "get_task_stream",
    "get_worker",
    "initialize",
    "performance_report",
    "print",
    "progress",
    "rejoin",
    "secede",
    "send_close_signal",
    "task_env",
    "wait",
    "warn",
    "worker_client",
]

# Type checkers and IDEs read these imports (public through __all__, which they read as a
# literal list); at run time the names come from __getattr__ below. tests/test_exports.py
# keeps _exports, __all__ and these imports equal. Without a __getattr__ in their view, a
# misspelt name is an error to them rather than Any.
if TYPE_CHECKING:
    from hpcsched.core import config
    from hpcsched.core.client.client import (
        Client,
        Future,
        as_completed,
        default_client,
        fire_and_forget,
        futures_of,
        wait,
    )
    from hpcsched.core.client.coordination import Event, Lock, MultiLock, Queue, Semaphore, Variable
    from hpcsched.core.client.local import get
    from hpcsched.core.client.plugins import SchedulerPlugin, WorkerPlugin
    from hpcsched.core.client.worker_client import (
        get_client,
        get_task_gpus,
        get_worker,
        rejoin,
        secede,
        task_env,
        worker_client,
    )
    from hpcsched.core.comm.base import Security
    from hpcsched.core.worker.nanny import NannyPlugin
    from hpcsched.diagnostics.forwarding import print, warn  # noqa: A004 - dask's names
    from hpcsched.diagnostics.progress import progress
    from hpcsched.diagnostics.report import get_task_stream, performance_report
    from hpcsched.hpc.bootstrap import execute, initialize, send_close_signal
    from hpcsched.hpc.gang import get_task_comm
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
    from hpcsched.launchers.adaptive import Adaptive
    from hpcsched.launchers.local_cluster import LocalCluster
else:
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _exports, modules=("config",))


def _register_with_joblib() -> None:
    import hpcsched.joblib  # noqa: F401 - registering is what importing it does


# joblib knows the "hpcsched" backend once a program imports it (hpcsched/joblib.py); not
# before, so that `import hpcsched` costs no joblib
when_imported("joblib", _register_with_joblib)
