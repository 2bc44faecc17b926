"""``performance_report`` and ``get_task_stream``, as in distributed.

Both ask the scheduler for what its recorder kept (an ``extension`` request
answered on the scheduler's thread), so they work whether the scheduler runs
in this process, on a login node over TCP or on rank 0 under MPI.

Example::

    from hpcsched import Client
    from hpcsched.diagnostics import performance_report, get_task_stream

    with Client() as client:
        with performance_report(filename="report.html"):
            client.gather(client.map(slow_inc, range(100)))
        with get_task_stream() as ts:
            client.gather(client.map(slow_inc, range(10)))
        print(len(ts.data))  # 10 records: worker, key, group, start, stop, ...
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from hpcsched.core.protocol.messages import Extension
from hpcsched.diagnostics.server import page_html


def _client(client: Any) -> Any:
    if client is not None:
        return client
    from hpcsched.core.client.client import default_client

    c = default_client()
    if c is None:
        raise ValueError("no client: pass client= or create a Client first")
    return c


def request(client: Any, what: str, timeout: float | None = 60.0, **kw: Any) -> dict:
    """Ask the scheduler's diagnostics extension; raises RuntimeError with its error."""
    reply = client.request(Extension("diagnostics", extra={"what": what, **kw}), timeout)
    answer = reply.extra
    if answer.get("error"):
        raise RuntimeError(f"the scheduler's diagnostics could not answer {what!r}: "
                           f"{answer['error']}")
    return answer


def as_time(t: Any) -> float:
    """Epoch seconds from a start given as epoch seconds or as a time ago.

    A string such as dask's ``"10s"`` / ``"2 min"`` means that long ago.
    """
    if t is None:
        return 0.0
    if isinstance(t, (int, float)):
        return float(t)
    from hpcsched.core.units import parse_interval

    return time.time() - parse_interval(t, "start")


def task_stream_records(client: Any, start: Any = None, stop: Any = None,
                        count: int | None = None) -> list[dict]:
    """The task stream as distributed's ``get_task_stream`` gives it.

    One dict a task, with ``worker``, ``key``, ``group``, ``thread``, ``status`` and
    ``startstops``.
    """
    reply = request(_client(client), "task-stream", start=as_time(start),
                    stop=None if stop is None else as_time(stop), limit=count or 100_000)
    out = [{"worker": w, "thread": lane, "group": group, "key": key,
            "status": "error" if kind == "erred" else "OK",
            "startstops": [{"action": "compute", "start": t0, "stop": t1}]}
           for w, lane, group, key, t0, t1, kind in reply["tasks"]]
    out += [{"worker": w, "thread": None, "group": "transfer", "key": f"transfer from {peer}",
             "status": "OK", "nbytes": nbytes,
             "startstops": [{"action": "transfer", "start": t0, "stop": t1, "source": peer}]}
            for w, peer, t0, t1, nbytes in reply["transfers"]]
    out.sort(key=lambda r: r["startstops"][0]["start"])
    return out[-count:] if count else out


def worker_logs(client: Any, n: int | None = None, workers: list | None = None) -> dict:
    """``{worker address: [(level, message), ...]}``, the last ``n`` records of each.

    The workers send theirs with their heartbeats.
    """
    logs = request(client, "worker-logs", workers=workers)["logs"]
    out = {}
    for address, records in logs.items():
        recs = [(str(r[1]), str(r[2])) for r in records if isinstance(r, list) and len(r) >= 3]
        out[address] = recs[-n:] if n else recs
    return out


class get_task_stream:  # noqa: N801 - distributed's name, used as a context manager
    """Collect the task stream of the work done inside the ``with`` block.

    ::

        with get_task_stream(client) as ts:
            client.gather(futures)
        ts.data  # list of dicts

    ``plot=True`` (or ``"save"``) also writes the stream as a self-contained HTML
    file, ``filename``.
    """

    def __init__(self, client: Any = None, plot: bool | str = False,
                 filename: str = "task-stream.html"):
        self.client = client
        self.plot = plot
        self.filename = filename
        self.data: list[dict] = []
        self.start = 0.0

    def __enter__(self) -> get_task_stream:
        self.client = _client(self.client)
        self.start = time.time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.data[:] = task_stream_records(self.client, self.start)
        if self.plot:
            write_report(self.client, self.start, self.filename)


def write_report(client: Any, start: float, filename: str | os.PathLike) -> str:
    """Write the performance report of everything since ``start`` to ``filename``."""
    data = request(client, "report", start=start, timeout=120.0)
    # inlined in a <script> element: "</" must not end it early (keys are user text)
    text = json.dumps(data, separators=(",", ":"), default=str).replace("</", "<\\/")
    page = page_html("report", data=text)
    with open(filename, "w", encoding="utf-8") as f:
        f.write(page)
    return os.fspath(filename)


class performance_report:  # noqa: N801 - distributed's name, used as a context manager
    """Write one self-contained HTML file about the work done inside the ``with`` block.

    The file opens offline (nothing is fetched) and shows the task stream, time per task
    group, transfers, worker utilization over time and the scheduler's events::

        with performance_report(filename="report.html"):
            client.gather(client.map(f, range(1000)))
    """

    def __init__(self, filename: str | os.PathLike = "dask-report.html", stacklevel: int = 1,
                 mode: str | None = None, storage_options: dict | None = None,
                 client: Any = None):
        self.filename = filename
        self.client = client
        self.start = 0.0

    def __enter__(self) -> performance_report:
        self.client = _client(self.client)
        self.start = time.time()
        return self

    def __exit__(self, *exc: Any) -> None:
        write_report(self.client, self.start, self.filename)

