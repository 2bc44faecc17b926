"""/metrics: Prometheus' own parser reads it, and its counts agree with scheduler_info()."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until
from tests.diagnostics.conftest import http_get, split_link


def double(x: int) -> int:
    return 2 * x


def fail(x: int) -> int:
    raise ValueError(f"no {x}")


def scrape(cluster) -> dict[str, dict]:
    base, token = split_link(cluster.dashboard_link)
    status, headers, body = http_get(base + "/metrics", {"Authorization": f"Bearer {token}"})
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_parse_and_match_scheduler_info(dash_cluster, dash_client):
    held = dash_client.map(double, range(25))
    bad = dash_client.submit(fail, 1)
    assert dash_client.gather(held) == [2 * i for i in range(25)]
    with pytest.raises(ValueError):
        bad.result(timeout=30)

    def agree():
        info = dash_client.scheduler_info()
        m = scrape(dash_cluster)
        by_state = {dict(k)["state"]: v for k, v in m["hpcsched_tasks"].items()}
        ok = all(by_state[s] == info["task_counts"].get(s, 0) for s in by_state) and \
            sum(by_state.values()) == info["n_tasks"] and \
            m["hpcsched_workers"][()] == len(info["workers"])
        return ok and (m, info)

    m, info = wait_until(agree, timeout=30, what="/metrics agreeing with scheduler_info()")
    assert info["task_counts"]["memory"] >= 25 and info["task_counts"]["erred"] >= 1
    assert m["hpcsched_threads"][()] == sum(w["nthreads"] for w in info["workers"].values())
    assert m["hpcsched_tasks_completed_total"][()] >= 25
    assert m["hpcsched_tasks_erred_total"][()] >= 1
    assert m["hpcsched_compute_seconds_total"][()] > 0
    assert m["hpcsched_clients"][()] >= 1
    memory = {dict(k)["type"]: v for k, v in m["hpcsched_worker_memory_bytes"].items()}
    assert memory["limit"] == sum(w["memory_limit"] for w in info["workers"].values())
    assert memory["managed"] == sum(w["nbytes"] for w in info["workers"].values())
    assert "hpcsched_transferred_bytes_total" in m and "hpcsched_tasks_per_second" in m


def held_until(path: str, x: int) -> int:
    """``x``, once the file ``path`` exists (at most 60 s): calls that stay running until
    the test has looked at them."""
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return x


N_VIEWED = 200


@pytest.mark.timeout(120)
def test_the_views_count_every_call_of_a_map_on_both_roads(dash_cluster, dash_client, road,
                                                           tmp_path):
    """During 200 calls, the metrics count each one in a state other than memory and
    ``processing()`` names those the workers run; afterwards, the metrics count them in
    memory and ``has_what()`` lists every result, whichever road the calls took."""
    go = str(tmp_path / "go")
    futures = road.map(dash_client, held_until, [go] * N_VIEWED, [*range(N_VIEWED)])
    keys = {f.key for f in futures}
    threads = sum(dash_client.nthreads().values())

    def counted(states):
        m = scrape(dash_cluster)
        by_state = {dict(k)["state"]: v for k, v in m["hpcsched_tasks"].items()}
        return sum(by_state.get(s, 0) for s in states)

    pending = ("waiting", "queued", "no-worker", "processing")
    wait_until(lambda: counted(pending) >= N_VIEWED, timeout=30,
               what="the metrics counting every call as waiting, queued or processing")
    running = wait_until(lambda: {k for ks in dash_client.processing().values() for k in ks}
                         & keys, timeout=30, what="processing() naming the calls running")
    assert len(running) >= threads
    assert all(isinstance(v, list) for v in dash_client.processing().values())
    open(go, "w").close()
    assert dash_client.gather(futures) == list(range(N_VIEWED))
    wait_until(lambda: counted(("memory",)) >= N_VIEWED, timeout=30,
               what="the metrics counting every result in memory")
    held = {k for ks in dash_client.has_what().values() for k in ks}
    assert keys <= held
    who = dash_client.who_has(futures)
    assert set(who) == keys and all(len(v) == 1 for v in who.values())
    info = dash_client.scheduler_info()
    assert sum(w["n_keys"] for w in info["workers"].values()) >= N_VIEWED
    del futures
    wait_until(lambda: not keys & {k for ks in dash_client.has_what().values() for k in ks},
               timeout=30, what="the released results leaving has_what()")
