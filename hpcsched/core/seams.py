"""The one way code reaches a layer above its own: named entry points, imported on use.

The package's layers point one way: ``core`` <- ``diagnostics`` <- ``launchers``
<- ``jobqueue``, ``hpc`` (``tests/test_layers.py`` checks every import). A few
things the core offers are built higher up, and the core names each of them here,
as ``module:attribute`` text, importing it only when it is asked for:

* the client's: ``Client()`` with no address starts a ``LocalCluster``;
  ``Client.get_task_stream``, the worker logs, the notebook reprs and
  ``progress`` come from the diagnostics;
* the scheduler's extensions: the ``scheduler.extensions`` setting lists seam
  names (``dashboard`` by default) or a user's own ``module:factory`` entries,
  each called with the scheduler once it listens
  (:mod:`hpcsched.core.scheduler.extensions`);
* inside the core, the client above the worker and below it: a task's
  ``get_client()`` and dask's ``.compute()`` in a task make a ``Client``, and
  code below the ``Client`` that needs one (a primitive made without a client)
  asks for the default client;
* what a batch job's environment says (its id, cores, memory, walltime), which each
  batch system's module in :mod:`hpcsched.jobqueue.systems` reads
  (``launchers/resources.py`` for a rank's resources, the worker's heartbeat for its
  job id);
* the transports built above the core: ``mpi://`` is served by
  :mod:`hpcsched.hpc.mpi`, imported (with mpi4py) only when an ``mpi://``
  address is used (:mod:`hpcsched.core.comm.registry`).

A name here is the whole contract: :func:`resolve` returns the object, or raises
``ImportError`` saying which seam could not be served. This module imports
nothing of hpcsched; no other module of the core names a higher layer.
"""

from __future__ import annotations

import importlib
from typing import Any

#: seam name -> "module:attribute" serving it
SEAMS: dict[str, str] = {
    "local-cluster": "hpcsched.launchers.local_cluster:LocalCluster",
    "task-stream": "hpcsched.diagnostics.report:task_stream_records",
    "task-stream-report": "hpcsched.diagnostics.report:write_report",
    "as-time": "hpcsched.diagnostics.report:as_time",
    "worker-logs": "hpcsched.diagnostics.report:worker_logs",
    "client-html": "hpcsched.diagnostics.reprs:client_html",
    "future-html": "hpcsched.diagnostics.reprs:future_html",
    "progress": "hpcsched.diagnostics.progress:progress",
    # the worker's tasks, and the code the Client itself uses, reach the Client
    "client": "hpcsched.core.client.client:Client",
    "default-client": "hpcsched.core.client.client:default_client",
    "dask-scheduler": "hpcsched.core.client.collections:become_dask_scheduler",
    "dashboard": "hpcsched.diagnostics.extension:attach",
    "transport:mpi": "hpcsched.hpc.mpi:BACKEND",
    # what a batch job tells the processes inside it: each batch system's module knows
    "batch-job": "hpcsched.jobqueue.systems:detect_job",
    # ... and when its walltime ends, asked of the batch system if the environment did not say
    "batch-job-end": "hpcsched.jobqueue.systems:job_end",
    # command tasks (Client.submit_command / map_command): the functions their workers run
    "history": "hpcsched.diagnostics.history:client_history",
    "submit-command": "hpcsched.commands.run:submit_command",
    "map-command": "hpcsched.commands.run:map_command",
    "forward-output": "hpcsched.diagnostics.forwarding:forward",
    # a task holding many slots: the environment that starts an MPI program on them
    "gang-environment": "hpcsched.hpc.gang:enter_environment",
}

_resolved: dict[str, Any] = {}


def resolve(name: str) -> Any:
    """The object serving seam ``name``, imported on first use.

    ``name`` is a key of :data:`SEAMS`, or ``module:attribute`` text naming an
    entry point of the user's own (a scheduler extension of theirs).

    >>> resolve("local-cluster").__name__
    'LocalCluster'
    """
    obj = _resolved.get(name)
    if obj is None:
        spec = SEAMS.get(name, name)
        module, _, attr = spec.partition(":")
        if not module or not attr:
            raise ImportError(f"hpcsched has no seam {name!r} (known: {', '.join(SEAMS)})")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ImportError(f"hpcsched cannot serve {name!r} ({spec}): {e}") from e
        _resolved[name] = obj
    return obj
