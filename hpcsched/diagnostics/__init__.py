"""See what the cluster is doing: dashboard, Prometheus metrics, performance report, progress.

Everything here reads snapshots of the scheduler (:mod:`.snapshot`), recorded
cheaply as tasks finish (:mod:`.recorder`); nothing here is on the scheduler's
hot path. Every scheduler attaches it as the ``dashboard`` seam
(:mod:`hpcsched.core.seams`), which the ``scheduler.extensions`` setting lists
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

from typing import TYPE_CHECKING

from hpcsched._lazy import lazy_exports

# progress() is hpcsched.progress: here the name is the submodule's, which Python binds on
# the package once imported, so a lazy function of that name would come and go
_exports = {
    "performance_report": "hpcsched.diagnostics.report",
    "get_task_stream": "hpcsched.diagnostics.report",
}

__all__ = [
    "get_task_stream",
    "performance_report",
]

# Type checkers and IDEs read these imports (public through __all__, which they read as a
# literal list); at run time the names come from __getattr__ below. tests/test_exports.py
# keeps _exports, __all__ and these imports equal. Without a __getattr__ in their view, a
# misspelt name is an error to them rather than Any.
if TYPE_CHECKING:
    from hpcsched.diagnostics.report import get_task_stream, performance_report
else:
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _exports)
