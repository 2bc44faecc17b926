"""performance_report and get_task_stream, used as distributed's documentation shows.

(What the report looks like in a browser is checked in test_browser.py.)
"""

from __future__ import annotations

import json
import re
import time

import pytest

from hpcsched import Client, get_task_stream, performance_report


def slow_inc(x: int) -> int:
    time.sleep(0.005)
    return x + 1


def add(x: int, y: int) -> int:
    return x + y


@pytest.fixture
def default_client(dash_cluster):
    """A client set as the default, as in distributed's examples."""
    with Client(dash_cluster) as client:
        yield client


def test_performance_report_writes_one_self_contained_file(default_client, tmp_path):
    dash_client = default_client
    dash_client.gather(dash_client.map(slow_inc, range(5), key=[f"before-{i}" for i in range(5)]))
    path = tmp_path / "report.html"
    with performance_report(filename=str(path)):
        a = dash_client.map(slow_inc, range(30))
        total = dash_client.submit(sum, a)
        assert total.result(timeout=60) == sum(range(1, 31))
    text = path.read_text()
    # nothing to fetch: no external script, stylesheet or image
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<script src" not in text and "<link" not in text
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>',
                                text, re.S).group(1))
    groups = [t[2] for t in data["tasks"]]
    assert groups.count("slow_inc") == 30 and groups.count("sum") == 1
    assert not any(t[3].startswith("before-") for t in data["tasks"])  # only the block's work
    assert data["start"] <= min(t[4] for t in data["tasks"])
    assert len(data["workers"]) == 2 and "events" in data and "transfers" in data


def test_report_data_cannot_close_its_script_element(default_client, tmp_path):
    dash_client = default_client
    path = tmp_path / "r.html"
    with performance_report(filename=str(path)):
        dash_client.submit(add, 1, 2, key="</script><b>x").result(timeout=30)
    text = path.read_text()
    assert "</script><b>x" not in text and "<\\/script><b>x" in text


def test_get_task_stream_collects_the_tasks_of_the_block(dash_client):
    with get_task_stream(dash_client) as ts:
        dash_client.gather(dash_client.map(slow_inc, range(12), key=[f"ts-{i}" for i in
                                                                     range(12)]))
    mine = [r for r in ts.data if str(r["key"]).startswith("ts-")]
    assert len(mine) == 12
    for r in mine:
        (ss,) = r["startstops"]
        assert ss["action"] == "compute" and ss["stop"] >= ss["start"]
        assert r["status"] == "OK" and r["worker"].startswith("tcp://")
    assert len(dash_client.get_task_stream(count=5)) == 5
    since = dash_client.get_task_stream(start=time.time() - 600)
    assert {r["key"] for r in mine} <= {r["key"] for r in since}


def test_get_task_stream_needs_a_client():
    from hpcsched.core.client import client as client_mod

    if client_mod.default_client() is not None:
        pytest.skip("a default client exists in this process")
    with pytest.raises(ValueError, match="no client"):
        with get_task_stream():
            pass
