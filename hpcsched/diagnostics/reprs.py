"""HTML reprs for Jupyter: ``Client``, clusters and ``Future`` (``_repr_html_``).

Small tables with what a user checks first: where the scheduler is, the
dashboard link, workers, threads, memory, and for a batch cluster its jobs'
states. Every value is escaped (worker names and keys are user text).
"""

from __future__ import annotations

from html import escape
from typing import Any

from hpcsched.core.units import format_bytes


def _rows(rows: list[tuple[str, Any]]) -> str:
    return "".join(f'<tr><th style="text-align:left">{escape(k)}</th><td style="text-align:left">'
                   f"{v}</td></tr>" for k, v in rows)


def _link(link: str | None) -> str:
    if not link:
        return "disabled"
    return f'<a href="{escape(link)}" target="_blank">{escape(link)}</a>'


def _workers_rows(workers: dict) -> list[tuple[str, Any]]:
    threads = sum(int(w.get("nthreads") or 0) for w in workers.values())
    limit = sum(int(w.get("memory_limit") or 0) for w in workers.values())
    return [("Workers", len(workers)), ("Threads", threads),
            ("Memory", escape(format_bytes(limit)) if limit else "-")]


def _table(title: str, rows: list[tuple[str, Any]]) -> str:
    return (f'<div><h4 style="margin:4px 0">{escape(title)}</h4>'
            f"<table>{_rows(rows)}</table></div>")


def client_html(client: Any) -> str:
    try:
        info = client.scheduler_info(timeout=5)
    except Exception as e:  # a closed or unreachable scheduler still gets a repr
        return _table("Client", [("Client", escape(client.id)), ("Status", escape(client.status)),
                                 ("Scheduler", escape(f"unreachable: {e}"))])
    rows = [("Client", escape(client.id)), ("Status", escape(client.status)),
            ("Scheduler", escape(str(info.get("address")))),
            ("Dashboard", _link((info.get("services") or {}).get("dashboard")))]
    rows += _workers_rows(info.get("workers") or {})
    if client.cluster is not None:
        rows.append(("Cluster", escape(type(client.cluster).__name__)))
    return _table("Client", rows)


def cluster_html(cluster: Any) -> str:
    rows = [("Scheduler", escape(str(getattr(cluster, "scheduler_address", "?")))),
            ("Dashboard", _link(getattr(cluster, "dashboard_link", None)))]
    try:
        rows += _workers_rows(cluster.scheduler_info_workers())
    except Exception as e:
        rows.append(("Workers", escape(f"unknown: {e}")))
    summary = getattr(cluster, "job_summary", None)
    if callable(summary):
        rows.append(("Jobs", escape(summary())))
    problems = getattr(cluster, "problems", None)
    if callable(problems):
        rows += [("Problem", f'<span style="color:#b3261e">{escape(p)}</span>')
                 for p in problems()]
    return _table(type(cluster).__name__, rows)


def future_html(future: Any) -> str:
    status = future.status
    colour = {"finished": "#2e7d32", "error": "#b3261e", "cancelled": "#6d6d6d"}.get(status,
                                                                                    "#2f6fb5")
    rows = [("key", escape(repr(future.key))),
            ("status", f'<span style="color:{colour}">{escape(status)}</span>')]
    typename = getattr(getattr(future, "state", None), "typename", "")
    if status == "finished" and typename:
        rows.append(("type", escape(str(typename))))
    return _table("Future", rows)
