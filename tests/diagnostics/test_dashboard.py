"""The dashboard server over HTTP: token, pages, JSON snapshots, port fallback, closing.

A real LocalCluster (worker processes over TCP) serves its dashboard; requests
go through urllib. The browser tests (test_browser.py) check what the pages
show; these check the server's contract.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

from hpcsched import Client, LocalCluster
from hpcsched.core.comm.base import Security
from hpcsched.diagnostics.extension import dashboard_token
from tests.conftest import wait_until
from tests.diagnostics.conftest import http_get, split_link


def slow_inc(x: int) -> int:
    time.sleep(0.01)
    return x + 1


def test_requests_without_the_token_are_refused(dash_cluster, dash_client):
    base, token = split_link(dash_cluster.dashboard_link)
    for path in ("/status", "/tasks", "/workers", "/events", "/api/status.json",
                 "/api/task-stream.json", "/metrics", "/static/dashboard.js"):
        status, _, body = http_get(base + path)
        assert status == 403, path
        assert b"token" in body
        assert http_get(base + path + "?token=" + "0" * len(token))[0] == 403, path
        assert http_get(base + path, {"Authorization": "Bearer wrong"})[0] == 403, path


def test_the_link_opens_the_page_and_sets_a_cookie_for_the_page_requests(dash_cluster):
    link = dash_cluster.dashboard_link
    base, token = split_link(link)
    status, headers, body = http_get(link)
    assert status == 200 and b'data-page="status"' in body
    cookie = headers["Set-Cookie"].split(";")[0]
    assert token in cookie and "HttpOnly" in headers["Set-Cookie"]
    # what the page's script then asks for, with the cookie alone
    status, _, js = http_get(base + "/static/dashboard.js", {"Cookie": cookie})
    assert status == 200 and b"taskStream" in js
    status, _, body = http_get(base + "/api/status.json", {"Cookie": "a=b; " + cookie})
    assert status == 200 and json.loads(body)["n_workers"] == 2
    assert http_get(base + "/nowhere", {"Cookie": cookie})[0] == 404


def test_pages_reference_no_outside_asset(dash_cluster):
    base, token = split_link(dash_cluster.dashboard_link)
    for page in ("status", "tasks", "workers", "events"):
        _, _, body = http_get(f"{base}/{page}?token={token}")
        text = body.decode()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, page


def test_status_and_task_stream_show_the_work_by_group(dash_cluster, dash_client):
    base, token = split_link(dash_cluster.dashboard_link)
    auth = {"Authorization": f"Bearer {token}"}
    futures = dash_client.map(slow_inc, range(40))
    assert dash_client.gather(futures) == list(range(1, 41))

    def inc_group() -> dict | None:
        s = json.loads(http_get(base + "/api/status.json", auth)[2])
        return next((g for g in s["groups"] if g["name"] == "slow_inc"), None)

    g = wait_until(lambda: (g := inc_group()) and g["memory"] + g["done"] >= 40 and g,
                   timeout=30, what="40 slow_inc tasks shown as finished")
    assert g["erred"] == 0 and g["seconds"] > 0.3
    stream = json.loads(http_get(base + "/api/task-stream.json", auth)[2])
    names, groups = stream["names"], stream["groups"]
    mine = [t for t in stream["tasks"] if groups[t[2]] == "slow_inc"]
    assert len(mine) >= 40
    workers = {w for w, _ in stream["workers"]}
    for wi, lane, _, key, start_ms, duration_us, erred in mine:
        assert names[wi] in workers and lane in (0, 1) and key.startswith("slow_inc-")
        assert duration_us >= 10_000 and not erred
        assert stream["base"] + start_ms / 1e3 <= stream["time"]
    # the page then asks only for what is new: nothing, here
    more = json.loads(http_get(f"{base}/api/task-stream.json?tasks={stream['task_count']}"
                               f"&transfers={stream['transfer_count']}", auth)[2])
    assert more["tasks"] == [] and more["task_count"] == stream["task_count"]
    assert http_get(base + "/api/task-stream.json?tasks=x", auth)[0] == 400


def test_client_and_cluster_give_the_same_link(dash_cluster, dash_client):
    assert dash_client.dashboard_link == dash_cluster.dashboard_link
    assert "token=" in dash_cluster.dashboard_link
    html = dash_client._repr_html_()
    assert "Dashboard" in html and dash_cluster.dashboard_link.replace("&", "&amp;") in html
    assert "Workers" in dash_cluster._repr_html_()


def test_token_comes_from_the_secret():
    s1, s2 = Security.generate(), Security.generate()
    assert dashboard_token(s1.secret) == dashboard_token(s1.secret)
    assert dashboard_token(s1.secret) != dashboard_token(s2.secret)
    assert s1.secret.hex() not in dashboard_token(s1.secret)
    assert dashboard_token(None) != dashboard_token(None)  # no secret: a random one


def test_a_port_in_use_falls_back_to_a_free_one_and_says_so(caplog):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with caplog.at_level(logging.WARNING, logger="hpcsched.diagnostics"), \
                LocalCluster(n_workers=0, processes=False,
                             dashboard_address=f"127.0.0.1:{port}") as a, \
                LocalCluster(n_workers=0, processes=False,
                             dashboard_address=f"127.0.0.1:{port}") as b:
            ports = {split_link(c.dashboard_link)[0].rsplit(":", 1)[1] for c in (a, b)}
            assert str(port) not in ports and len(ports) == 2
            for c in (a, b):
                assert http_get(c.dashboard_link)[0] == 200
        assert f"port {port} is already in use" in caplog.text
    finally:
        taken.close()


def test_no_dashboard_when_the_address_is_none():
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert cluster.dashboard_link is None and client.dashboard_link is None
        assert client.submit(slow_inc, 1).result(timeout=30) == 2
        assert client.get_task_stream()  # the recorder works without a dashboard


def test_closing_the_cluster_stops_the_server_and_its_threads():
    before = {t.ident for t in threading.enumerate()}
    cluster = LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0")
    base, token = split_link(cluster.dashboard_link)
    # a keep-alive connection holds a handler thread: closing must end it too
    conn = socket.create_connection((base.split("//")[1].split(":")[0],
                                     int(base.rsplit(":", 1)[1])))
    conn.sendall(f"GET /status?token={token} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert conn.recv(100).startswith(b"HTTP/1.1 200")
    cluster.close()
    conn.close()
    with pytest.raises(OSError):
        socket.create_connection((base.split("//")[1].split(":")[0],
                                  int(base.rsplit(":", 1)[1])), timeout=5)
    wait_until(lambda: not [t for t in threading.enumerate() if t.ident not in before
                            and t.is_alive()], timeout=10, what="dashboard threads ended")


def test_adaptive_decisions_are_among_the_scheduler_events():
    # LocalCluster(n_workers=0).adapt(): work arrives, adaptive starts a worker, and the
    # decision shows where the dashboard and reports read the scheduler's recent events
    with LocalCluster(n_workers=0, threads_per_worker=1, processes=False) as cluster, \
            Client(cluster, set_as_default=False) as client:
        cluster.adapt(minimum=0, maximum=1, interval="50ms")
        assert client.submit(slow_inc, 1).result(timeout=60) == 2
        recorder = cluster.scheduler.state.recorder

        def adaptive_events():
            return [what for _, topic, what in list(recorder.events) if topic == "adaptive"]

        found = wait_until(adaptive_events, timeout=30, what="an adaptive event")
        assert any("up" in text and "target=1" in text for text in found), found


def test_the_workers_table_tells_a_job_templates_workers_by_their_resources():
    """A GPU template's worker (resources GPU=1, kept for GPU tasks) and a CPU worker, as
    the workers page lists them."""
    from hpcsched.core.state import events as ev
    from hpcsched.core.state.scheduler_state import SchedulerState
    from hpcsched.diagnostics.snapshot import worker_row

    s = SchedulerState()
    s.handle(ev.AddWorker("tcp://g:1", 1, resources={"GPU": 1}, resources_only=True))
    s.handle(ev.AddWorker("tcp://c:1", 1))
    rows = {a: worker_row(ws, s) for a, ws in s.workers.items()}
    assert rows["tcp://g:1"]["resources"] == "GPU=1 only"
    assert rows["tcp://c:1"]["resources"] == ""
