"""Across nodes: ``hpcsched scheduler`` on the login side, ``hpcsched worker`` on compute nodes.

The nodes are network namespaces (:mod:`tests.nodes`, ``ci/nodes/start-nodes.sh``); a
worker runs on one through ``ci/nodes/on-node.sh``. The nodes share this host's file
system, so a scheduler file works as on a cluster's shared file system.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from hpcsched.core.client.client import Client, read_scheduler_file
from tests.conftest import wait_until
from tests.launchers.test_cli import WORKER_OPTS, Procs, hpcsched_cmd
from tests.nodes import LOGIN, ON_NODE, UNREACHABLE, missing_nodes, require

NODES = 2  # of the 3 ci/test-all.sh makes, these tests use two


@pytest.fixture(scope="module")
def nodes() -> None:
    require(missing_nodes(NODES), "sudo bash ci/nodes/start-nodes.sh 3")


@pytest.fixture
def procs(tmp_path: Path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.kill_all()


def start_scheduler(procs: Procs, sfile: Path, *options: str):
    p = procs.start([*hpcsched_cmd(), "scheduler", "--port", "0", "--scheduler-file",
                     str(sfile), *options], "scheduler")
    wait_until(lambda: sfile.exists() or p.poll() is not None, timeout=30,
               what="the scheduler file")
    assert p.poll() is None, procs.log("scheduler")
    return p


def start_worker(procs: Procs, node: int, sfile: Path, *options: str):
    return procs.start(["bash", ON_NODE, str(node), sys.executable, "-m", "hpcsched", "worker",
                        "--scheduler-file", str(sfile), "--name", f"node{node}",
                        *WORKER_OPTS, *options], f"worker-node{node}")


def block(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(1_000_000)  # 8 MB: a real transfer


def combine(a: np.ndarray, b: np.ndarray) -> tuple[str, float]:
    import socket

    return socket.gethostname(), float((a + b).sum())


@pytest.mark.timeout(120)
def test_workers_on_two_nodes_reach_the_login_side_and_each_other(nodes, procs, tmp_path):
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile, "--interface", "hsbr0")
    address, _ = read_scheduler_file(str(sfile))
    assert address.startswith(f"tcp://{LOGIN}:")
    for node in (1, 2):
        start_worker(procs, node, sfile)
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
        workers = client.scheduler_info()["workers"]
        by_name = {w["name"]: a for a, w in workers.items()}
        # each worker names its own node's address: what the other node reaches
        assert by_name["node1"].startswith("tcp://10.77.0.11:"), by_name
        assert by_name["node2"].startswith("tcp://10.77.0.12:"), by_name
        a = client.submit(block, 1, workers=["node1"], pure=False)
        b = client.submit(block, 2, workers=["node2"], pure=False)
        # node1 fetches b from node2, node2 fetches a from node1: transfers both ways
        on1 = client.submit(combine, a, b, workers=["node1"], pure=False)
        on2 = client.submit(combine, b, a, workers=["node2"], pure=False)
        expected = float((block(1) + block(2)).sum())
        host1, total1 = on1.result(timeout=60)
        host2, total2 = on2.result(timeout=60)
        assert (host1, host2) == ("node1", "node2")
        assert total1 == pytest.approx(expected) and total2 == pytest.approx(expected)
        # the inputs were made where they were asked for: each result needed a transfer
        who = client.who_has([a, b])
        assert by_name["node1"] in who[a.key] and by_name["node2"] in who[b.key], who


@pytest.mark.timeout(90)
def test_a_scheduler_on_a_network_the_nodes_cannot_reach_is_named_by_the_worker(
        nodes, procs, tmp_path):
    """The login side's second network: the worker says at once which address it cannot
    reach and why, then gives up after its death timeout naming it again."""
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile, "--interface", "hsbr1")
    address, _ = read_scheduler_file(str(sfile))
    assert address.startswith(f"tcp://{UNREACHABLE}:")
    w = start_worker(procs, 1, sfile, "--death-timeout", "15")
    wait_until(lambda: "cannot reach the scheduler" in procs.log("worker-node1"), timeout=30,
               what="the worker's warning")
    log = procs.log("worker-node1")
    assert f"cannot reach the scheduler at {address} yet" in log
    assert "Network is unreachable" in log
    assert w.wait(30) != 0
    assert f"could not reach the scheduler at {address} within death_timeout=15" in \
        procs.log("worker-node1")
