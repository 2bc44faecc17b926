"""Which heavy libraries, and which of hpcsched's optional modules, a process has imported:
what no start-up of a scheduler, a worker or a client needs."""

from __future__ import annotations

import sys

#: libraries no start-up needs
LIBRARIES = ("dask", "distributed", "pandas", "numpy", "yaml", "jinja2", "tornado", "bokeh",
             "zict", "joblib", "sklearn")
#: hpcsched's modules no start-up needs (the dashboard's server: once a browser connects;
#: the batch clusters: a worker reads its job's identity through the batch systems' own
#: small modules, hpcsched.jobqueue.systems, never the cluster's)
OURS = ("hpcsched.jobqueue.cluster", "hpcsched.diagnostics.server")


def heavy_loaded() -> list[str]:
    """The packages of ``LIBRARIES`` and modules of ``OURS`` this process has imported."""
    return sorted(m for m in sys.modules
                  if m.split(".")[0] in LIBRARIES and "." not in m or m in OURS)
