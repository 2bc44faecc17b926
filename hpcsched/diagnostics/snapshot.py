"""Snapshots of a scheduler, as JSON-ready dicts, for pages, metrics and reports.

Every function here runs on the scheduler's thread (callers go through
``scheduler.call``), so it sees a consistent state; each one does work
proportional to what it returns, except :func:`status`, which counts tasks by
group and state in one pass over every task. Callers cache the
result (:class:`hpcsched.diagnostics.extension.Diagnostics` refreshes it at
most every ``diagnostics.dashboard.refresh`` seconds, and only while someone
is looking), so the scheduler pays nothing per task for it.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from hpcsched.core.comm.registry import backend_for

TASK_STATES = ("released", "waiting", "queued", "no-worker", "processing", "memory", "erred")
MAX_GROUPS_SHOWN = 200


def short(key: Any, limit: int = 120) -> str:
    text = key if isinstance(key, str) else repr(key)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def worker_row(ws: Any, state: Any) -> dict:
    """One worker as the pages show it; what it runs and holds counts the elements of bulk
    maps as tasks (``state``: the scheduler's state)."""
    m = ws.metrics if isinstance(ws.metrics, dict) else {}
    processing, executing = state.load(ws)
    address = ws.address
    number = backend_for(address).rank_of(address)
    rank = None if number is None else str(number)
    return {
        "address": address, "name": ws.name, "host": ws.host, "nthreads": ws.nthreads,
        "memory_limit": ws.memory_limit, "managed": ws.nbytes,
        "memory": _num(m.get("memory")), "cpu": _num(m.get("cpu")),
        "processing": processing, "executing": executing,
        "n_keys": len(ws.has_what) + ws.n_elements, "last_seen": ws.last_seen, "status": ws.status,
        "rank": rank, "job_id": str(m["job_id"]) if m.get("job_id") else None,
        "bandwidth": _num(m.get("bandwidth")), "pid": ws.pid,
        # the kind of worker (a job template's: "GPU=1 only" runs only tasks asking for it)
        "resources": " ".join(f"{r}={q:g}" for r, q in sorted(ws.resources.items()))
        + (" only" if ws.resources_only else ""),
    }


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def status(scheduler: Any, recorder: Any, now: float) -> dict:
    """Cluster totals, tasks per group by state, and one row per worker."""
    state = scheduler.state
    counts = state.group_counts()
    groups: dict[str, dict] = {}
    for (name, st), n in counts.items():
        g = groups.get(name)
        if g is None:
            g = groups[name] = dict.fromkeys(TASK_STATES, 0)
        g[st] = g.get(st, 0) + n
    for name, totals in recorder.groups.items():
        g = groups.get(name)
        if g is None:
            g = groups[name] = dict.fromkeys(TASK_STATES, 0)
        # done = finished once and no longer held (released or forgotten since)
        g["done"] = max(totals.done - g["memory"], 0)
        g["seconds"] = totals.seconds
        g["nbytes"] = totals.nbytes
        g["last_stop"] = totals.last_stop
    for name, g in groups.items():
        g.setdefault("done", 0)
        g["name"] = name
        g["total"] = sum(g[s] for s in TASK_STATES if s != "released") + g["done"]
    active = sorted(groups.values(), key=lambda g: (
        -(g["processing"] + g["queued"] + g["waiting"] + g["no-worker"]),
        -g.get("last_stop", 0.0)))[:MAX_GROUPS_SHOWN]
    workers = [worker_row(ws, state) for ws in state.workers.values()]
    by_state = dict.fromkeys(TASK_STATES, 0)
    for (_, st), n in counts.items():
        by_state[st] = by_state.get(st, 0) + n
    return {
        "time": now, "address": scheduler.address, "id": scheduler.id,
        "started": scheduler.started,
        "n_workers": len(workers), "nthreads": state.total_nthreads,
        "n_tasks": sum(counts.values()), "tasks": by_state, "n_clients": len(state.clients),
        "memory": sum(w["memory"] or 0 for w in workers),
        "managed": sum(w["managed"] for w in workers),
        "memory_limit": sum(w["memory_limit"] for w in workers),
        "processing": sum(w["processing"] for w in workers),
        "executing": sum(w["executing"] for w in workers),
        "bandwidth": state.bandwidth,
        "n_finished": recorder.n_finished, "n_erred": recorder.n_erred,
        "compute_seconds": recorder.compute_seconds,
        "bytes_transferred": recorder.bytes_transferred,
        "tasks_per_second": tasks_per_second(recorder, now),
        "groups": active, "n_groups": len(groups), "workers": workers,
    }


def tasks_per_second(recorder: Any, now: float, window: float = 10.0) -> float:
    """Tasks finished per second over about the last ``window`` seconds, from the counts
    seen by earlier snapshots (no walk over the stream)."""
    marks = recorder.rate_marks
    marks.append((now, recorder.n_finished))
    for t, n in marks:  # the oldest mark still inside the window
        if now - t <= window:
            return (recorder.n_finished - n) / (now - t) if now > t else 0.0
    return 0.0


def task_stream(recorder: Any, start: float = 0.0, stop: float | None = None,
                limit: int = 50_000) -> dict:
    """Entries that ended in ``[start, stop]`` (newest ``limit``), and the transfers."""
    stop = float("inf") if stop is None else stop
    tasks = []
    for w, lane, group, key, t0, t1, kind in reversed(recorder.stream):
        if t1 < start:
            break
        if t1 <= stop:
            tasks.append([w, lane, group, short(key), t0, t1, kind])
            if len(tasks) >= limit:
                break
    transfers = []
    for w, peer, t0, t1, nbytes in reversed(recorder.transfers):
        if t1 < start:
            break
        if t1 <= stop:
            transfers.append([w, peer, t0, t1, nbytes])
            if len(transfers) >= limit:
                break
    tasks.reverse()
    transfers.reverse()
    return {"tasks": tasks, "transfers": transfers}


def newest(ring: Any, count: int, after: int, limit: int) -> list:
    """The entries of ``ring`` (a deque that has had ``count`` appended) after the
    ``after``-th, at most the newest ``limit``; O(entries returned)."""
    n = min(count - after if after >= 0 else len(ring), len(ring), limit)
    if n <= 0:
        return []
    out = list(islice(reversed(ring), n))
    out.reverse()
    return out


def live_stream(recorder: Any, after_tasks: int, after_transfers: int,
                limit: int = 20_000) -> dict:
    """For a page: raw entries it has not seen (converted later, off the scheduler's
    thread, by :func:`compact_stream`)."""
    return {"tasks": newest(recorder.stream, recorder.stream_count, after_tasks, limit),
            "transfers": newest(recorder.transfers, recorder.transfer_count, after_transfers,
                                limit),
            "task_count": recorder.stream_count, "transfer_count": recorder.transfer_count}


def compact_stream(raw: dict, now: float, since: float = 0.0) -> dict:
    """What the task stream page reads: workers and groups as indices, times as integer
    milliseconds from ``base`` and durations in microseconds (encoding floats and repeated
    addresses made JSON several times larger and slower)."""
    workers: dict[str, int] = {}
    groups: dict[str, int] = {}
    base = int(now) - 3600
    tasks = []
    for w, lane, group, key, t0, t1, kind in raw["tasks"]:
        if t1 >= since:
            tasks.append((workers.setdefault(w, len(workers)), lane,
                          groups.setdefault(group, len(groups)),
                          key if type(key) is str and len(key) <= 80 else short(key, 80),
                          int((t0 - base) * 1e3), int((t1 - t0) * 1e6), kind == "erred"))
    transfers = []
    for w, peer, t0, t1, nbytes in raw["transfers"]:
        if t1 >= since:
            transfers.append((workers.setdefault(w, len(workers)),
                              workers.setdefault(peer, len(workers)),
                              int((t0 - base) * 1e3), int((t1 - t0) * 1e6), nbytes))
    return {"base": base, "time": now, "names": list(workers), "groups": list(groups),
            "tasks": tasks, "transfers": transfers, "task_count": raw["task_count"],
            "transfer_count": raw["transfer_count"], "workers": raw.get("workers", [])}


def events(recorder: Any, start: float = 0.0, limit: int = 500) -> list[list]:
    """Recent events, oldest first, as ``[time, topic, text]``."""
    out: list[list] = []
    for t, topic, what in reversed(recorder.events):
        if t < start or len(out) >= limit:
            break
        out.append([t, topic, describe(topic, what)])
    out.reverse()
    return out


def describe(topic: str, what: Any) -> str:
    """One line of text for an event (exceptions and keys become text only here)."""
    try:
        if topic == "task-erred":
            key, worker, text = what
            return f"{short(key)} failed on {worker}: {short(str(text), 400)}"
        if topic == "worker-added":
            address, name, nthreads = what
            return f"{address} ({name}, {nthreads} threads) joined"
        if topic == "worker-removed":
            address, reason = what
            return f"{address} left: {reason or 'unknown reason'}"
        if topic == "retire-workers":
            return f"retiring {', '.join(map(str, what))}"
    except (TypeError, ValueError):
        pass
    return short(str(what), 400)


def worker_logs(recorder: Any, workers: Any = None) -> dict[str, list]:
    wanted = None if not workers else set(workers)
    return {w: [list(x) if isinstance(x, (list, tuple)) else [0, "INFO", str(x)] for x in lines]
            for w, lines in recorder.logs.items() if wanted is None or w in wanted}
