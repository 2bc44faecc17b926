"""The one way the core reaches the layers above it: named entry points, resolved on use.

The package's layers point one way: ``core`` <- ``diagnostics`` <- ``launchers``
<- ``jobqueue``, ``hpc`` (``tests/test_layers.py`` checks it). A few things the
core offers are built higher up: ``Client()`` with no address starts a
``LocalCluster``; ``Client.get_task_stream`` and the notebook reprs come from
the diagnostics. Inside core the same holds for the worker, whose tasks use
the client above it (``get_client()``, dask's ``.compute()`` in a task), and
for the code below the Client that makes one (a primitive without a client). The core names them here, as ``module:attribute`` text, and
imports them only when asked -- the same way the transport registry names the
``mpi://`` backend and ``scheduler.extensions`` names scheduler extensions. A
name here is the whole contract: :func:`resolve` returns the object, or raises
``ImportError`` saying which seam could not be served.
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
}

_resolved: dict[str, Any] = {}


def resolve(name: str) -> Any:
    """The object serving seam ``name`` (imported on first use)."""
    obj = _resolved.get(name)
    if obj is None:
        module, _, attr = SEAMS[name].partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ImportError(f"hpcsched cannot serve {name!r} ({SEAMS[name]}): {e}") from e
        _resolved[name] = obj
    return obj
