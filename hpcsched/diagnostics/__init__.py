"""See what the cluster is doing: dashboard, Prometheus metrics, performance report, progress.

Everything here reads snapshots of the scheduler (:mod:`.snapshot`), recorded
cheaply as tasks finish (:mod:`.recorder`); nothing here is on the scheduler's
hot path. The scheduler gets it through the ``scheduler.extensions`` seam
(:mod:`.extension`).

Example::

    from hpcsched import Client, performance_report, progress
    with Client() as client:
        print(client.dashboard_link)
        with performance_report(filename="report.html"):
            futures = client.map(slow_inc, range(1000))
            progress(futures)
"""

from __future__ import annotations

from hpcsched._lazy import lazy_exports

_exports = {
    "performance_report": "hpcsched.diagnostics.report",
    "get_task_stream": "hpcsched.diagnostics.report",
    "progress": "hpcsched.diagnostics.progress",
}

__all__ = sorted(_exports)

__getattr__, __dir__ = lazy_exports(__name__, globals(), _exports)
