"""Prometheus metrics of a scheduler, in the official client library's exposition format.

Served at ``/metrics`` by the dashboard server, so an HPC site scrapes it
(bearer token: the dashboard's) into Grafana. Figures come from the same
cached snapshot as the pages: a scrape costs the scheduler one snapshot at
most every ``diagnostics.dashboard.refresh`` seconds.

Names follow Prometheus' conventions: a ``hpcsched_`` prefix, base units
(bytes, seconds), ``_total`` on counters (added by the library).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from hpcsched.diagnostics.snapshot import TASK_STATES

CONTENT_TYPE = CONTENT_TYPE_LATEST


class SchedulerCollector:
    """A custom collector: figures are read from a snapshot when scraped."""

    def __init__(self, status: Any):
        self.status = status  # () -> status snapshot dict

    def collect(self) -> Any:
        s = self.status()
        tasks = GaugeMetricFamily("hpcsched_tasks", "Tasks known to the scheduler, by state",
                                  labels=["state"])
        for state in TASK_STATES:
            tasks.add_metric([state], s["tasks"].get(state, 0))
        yield tasks
        yield GaugeMetricFamily("hpcsched_workers", "Workers connected", value=s["n_workers"])
        yield GaugeMetricFamily("hpcsched_threads", "Worker threads in the cluster",
                                value=s["nthreads"])
        yield GaugeMetricFamily("hpcsched_clients", "Clients connected", value=s["n_clients"])
        mem = GaugeMetricFamily("hpcsched_worker_memory_bytes",
                                "Memory of all workers: managed (results held) or process "
                                "(resident set size) or limit", labels=["type"])
        mem.add_metric(["managed"], s["managed"])
        mem.add_metric(["process"], s["memory"])
        mem.add_metric(["limit"], s["memory_limit"])
        yield mem
        yield GaugeMetricFamily("hpcsched_tasks_executing", "Tasks running on worker threads",
                                value=s["executing"])
        yield GaugeMetricFamily("hpcsched_tasks_per_second",
                                "Tasks finished per second over the last 10 seconds",
                                value=s["tasks_per_second"])
        yield CounterMetricFamily("hpcsched_tasks_completed", "Tasks finished",
                                  value=s["n_finished"])
        yield CounterMetricFamily("hpcsched_tasks_erred", "Tasks that raised",
                                  value=s["n_erred"])
        yield CounterMetricFamily("hpcsched_compute_seconds", "Seconds spent running tasks",
                                  value=s["compute_seconds"])
        yield CounterMetricFamily("hpcsched_transferred_bytes",
                                  "Bytes workers fetched from each other",
                                  value=s["bytes_transferred"])
        yield GaugeMetricFamily("hpcsched_bandwidth_bytes_per_second",
                                "Measured worker-to-worker bandwidth", value=s["bandwidth"])


def exposition(diagnostics: Any) -> bytes:
    """The text a scrape of ``/metrics`` returns."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerCollector(diagnostics.status))
    return generate_latest(registry)
