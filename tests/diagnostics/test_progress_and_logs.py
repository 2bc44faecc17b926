"""progress() as distributed's, worker logs and heartbeat telemetry, over real worker processes."""

from __future__ import annotations

import io
import json
import time

import dask
import numpy as np
import pytest

from hpcsched import progress
from tests.conftest import wait_until
from tests.diagnostics.conftest import http_get, split_link


def slow_inc(x: int) -> int:
    time.sleep(0.01)
    return x + 1


def explode(x: int) -> int:
    raise ZeroDivisionError(f"task exploded on {x}")


def big(i: int) -> np.ndarray:
    return np.full(500_000, i, dtype="f8")  # 4 MB: fetched by the other worker


def total(*arrays: np.ndarray) -> float:
    return float(sum(a.sum() for a in arrays))


def test_text_progress_blocks_until_every_future_is_done(dash_client):
    futures = dash_client.map(slow_inc, range(30))
    out = io.StringIO()
    assert progress(futures, notebook=False, file=out) is None
    assert all(f.done() for f in futures)
    last = out.getvalue().rstrip("\n").split("\r")[-1]
    assert "100% Completed" in last and "erred" not in last


def test_progress_counts_erred_futures_as_done_and_says_so(dash_client):
    futures = dash_client.map(explode, range(3)) + dash_client.map(slow_inc, range(3))
    out = io.StringIO()
    progress(futures, notebook=False, file=out)
    assert "100% Completed" in out.getvalue() and "3 erred" in out.getvalue()


def test_progress_of_a_collection_holding_futures(dash_client):
    futures = dash_client.map(slow_inc, range(10), key=[f"coll-{i}" for i in range(10)])
    collection = dask.delayed(sum)(futures)
    out = io.StringIO()
    progress(collection, notebook=False, file=out)
    assert all(f.done() for f in futures) and "100% Completed" in out.getvalue()


def test_progress_of_nothing_is_an_error_not_an_empty_bar():
    with pytest.raises(ValueError, match="no futures"):
        progress(dask.delayed(sum)([1, 2]), notebook=False)


def test_widget_returns_at_once_and_fills_per_group(dash_client, monkeypatch):
    pytest.importorskip("ipywidgets")
    from hpcsched.diagnostics import progress as progress_mod

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    gate = dash_client.submit(time.sleep, 0.5)
    a = dash_client.map(slow_inc, range(8), key=[f"alpha-{i}" for i in range(8)])
    b = dash_client.map(lambda x, _: x, range(4), [gate] * 4, key=[f"beta-{i}" for i in
                                                                    range(4)])
    widget = progress(a, b, notebook=True, multi=True)
    assert isinstance(widget, progress_mod.ProgressWidget) and shown == [widget.box]
    assert not all(f.done() for f in b)  # it did not wait
    wait_until(lambda: widget.bars.get("beta") is not None and widget.bars["beta"].value == 1.0
               and widget.bars["alpha"].value == 1.0, timeout=30, what="both bars full")
    assert widget.labels["alpha"].value == "8 / 8" and widget.labels["beta"].value == "4 / 4"
    assert widget.bars["alpha"].bar_style == "success"


def test_a_failed_task_is_logged_by_its_worker_and_reaches_get_worker_logs(dash_client):
    fut = dash_client.submit(explode, 7, key="explode-logged")
    with pytest.raises(ZeroDivisionError):
        fut.result(timeout=30)

    def logged():
        logs = dash_client.get_worker_logs()
        return [(w, m) for w, recs in logs.items() for level, m in recs
                if level == "WARNING" and "explode-logged" in m]

    ((worker, message),) = wait_until(logged, timeout=30, what="the failure in the worker log")
    assert "task exploded on 7" in message and worker in dash_client.scheduler_info()["workers"]
    assert dash_client.get_worker_logs(n=1, workers=[worker])[worker][-1:] != []


def test_transfers_and_cpu_reach_the_task_stream_and_the_workers_table(dash_cluster,
                                                                      dash_client):
    workers = sorted(dash_client.scheduler_info()["workers"])
    parts = [dash_client.submit(big, i, workers=[workers[i % 2]], key=f"big-{i}")
             for i in range(4)]
    result = dash_client.submit(total, *parts, workers=[workers[0]], key="total-fetch")
    assert result.result(timeout=60) == float(sum(i * 500_000 for i in range(4)))

    def fetched():
        stream = dash_client.get_task_stream(start=time.time() - 120)
        return [r for r in stream if r["startstops"][0]["action"] == "transfer"
                and r["worker"] == workers[0] and r["nbytes"] >= 4_000_000]

    records = wait_until(fetched, timeout=30, what="the fetches in the task stream")
    assert records[0]["startstops"][0]["source"] == workers[1]
    base, token = split_link(dash_cluster.dashboard_link)

    def cpu_known():
        s = json.loads(http_get(base + "/api/status.json",
                                {"Authorization": f"Bearer {token}"})[2])
        return s["bytes_transferred"] >= 8_000_000 and all(w["cpu"] is not None
                                                           for w in s["workers"])

    wait_until(cpu_known, timeout=30, what="CPU and bytes moved in the status snapshot")
