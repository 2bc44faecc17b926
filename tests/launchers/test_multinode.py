"""Across nodes: ``hpcsched scheduler`` on the login side, ``hpcsched worker`` on compute nodes.

The nodes are network namespaces (:mod:`tests.nodes`, ``ci/nodes/start-nodes.sh``); a
worker runs on one through ``ci/nodes/on-node.sh``. The nodes share this host's file
system, so a scheduler file works as on a cluster's shared file system, and tasks count
their runs in files there (one file per run, named after the task and the node).

Node 3 is the one that fails: it crashes (every process of the test on it SIGKILLed) or
is cut off the network for longer than ``scheduler.worker-ttl``. Each failure is met on
both roads of a map (:class:`Road`): tasks submitted one by one, and a ``Client.map``
large enough to be a bulk map (:mod:`hpcsched.core.state.bulk`: ranges of elements, no
tasks), whose loss and rerun take other code.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from hpcsched.core.client.client import Client, read_scheduler_file
from hpcsched.core.client.graphs import BULK_MAP_MIN
from tests.conftest import wait_until
from tests.launchers.procs import WORKER_OPTS, Procs, hpcsched_cmd
from tests.nodes import (
    LOGIN,
    ON_NODE,
    UNREACHABLE,
    crash_node,
    link_down,
    missing_nodes,
    require,
)

NODES = 2  # two nodes for the tests that only need two
LOST = 3  # the node that crashes or is cut off


@pytest.fixture(scope="module")
def nodes() -> None:
    require(missing_nodes(NODES), "sudo bash ci/nodes/start-nodes.sh 3")


@pytest.fixture(scope="module")
def three_nodes() -> None:
    require(missing_nodes(LOST), "sudo bash ci/nodes/start-nodes.sh 3")


def start_scheduler(procs: Procs, sfile: Path, *options: str, env: dict | None = None):
    p = procs.start([*hpcsched_cmd(), "scheduler", "--port", "0", "--scheduler-file",
                     str(sfile), *options], "scheduler", env=env or {})
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


def counted(i: int, runs: str, seconds: float) -> int:
    """Task ``i``: leaves a file naming itself and its node in ``runs``, works, returns i*i."""
    Path(runs, f"{i}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex}").touch()
    time.sleep(seconds)
    return i * i


def add_all(*xs: int) -> int:
    return sum(xs)


def runs_by_task(runs: Path) -> dict[str, collections.Counter]:
    """{task: Counter(node hostname -> runs)} from the files :func:`counted` leaves."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for f in runs.iterdir():
        task, host = f.name.split(".")[:2]
        out[task][host] += 1
    return out


def holding(client: Client, futures: list, address: str) -> int:
    """How many of ``futures`` the worker at ``address`` holds."""
    return sum(address in holders for holders in client.who_has(futures).values())


def until_node3_holds_results(client: Client, parts: list, by_name: dict, procs: Procs) -> None:
    """Wait until node 3 holds three results of ``parts``; if it does not, fail saying
    where the results are and what node 3's worker and the scheduler logged."""
    try:
        wait_until(lambda: holding(client, parts, by_name["node3"]) >= 3, timeout=60,
                   what="node 3 holding three results of the map")
    except TimeoutError:
        where = collections.Counter(a for hs in client.who_has(parts).values() for a in hs)
        raise AssertionError(
            f"node 3 holds fewer than three results of the map: {dict(where)} (workers "
            f"{by_name}, now {sorted(client.scheduler_info()['workers'])}); node 3's worker "
            f"logged: {procs.log('worker-node3')[-3000:]}; the scheduler logged: "
            f"{procs.log('scheduler')[-3000:]}") from None


def start_three(procs: Procs, sfile: Path) -> dict[int, object]:
    return {node: start_worker(procs, node, sfile) for node in (1, 2, LOST)}


@dataclasses.dataclass(frozen=True)
class Road:
    """How the calls of :func:`counted` are submitted: ``n`` of them, of ``seconds`` each."""

    name: str
    n: int
    seconds: float

    def start(self, client: Client, runs: Path) -> list:
        if self.name == "tasks":  # one task each, and a sum of them: a graph
            return [client.submit(counted, i, str(runs), self.seconds, pure=False)
                    for i in range(self.n)]
        assert self.n >= BULK_MAP_MIN
        parts = client.map(counted, range(self.n), runs=str(runs), seconds=self.seconds,
                           pure=False)
        prefix = parts[0].key.rpartition("-")[0] + "-"
        assert client.run_on_scheduler(lambda dask_scheduler: prefix in
                                       dask_scheduler.state.bulk.maps), "not a bulk map"
        return parts

    def check_road(self, client: Client, parts: list) -> None:
        """A bulk map's elements stayed elements, lost and run again as such: none of them
        was made a task (asking where results are, or losing them, makes none)."""
        if self.name != "tasks":
            keys = [f.key for f in parts]
            assert client.run_on_scheduler(lambda dask_scheduler: [
                k for k in keys if dict.__contains__(dask_scheduler.state.tasks, k)]) == []

    @property
    def graph(self) -> bool:
        """A sum is submitted over the calls before the failure: with a bulk map it would
        make every element a task of its own (a dependency), so its road is the map's
        alone, gathered."""
        return self.name == "tasks"


# a dozen tasks per node; a bulk map of 3,000 elements (ranges of hundreds), short enough
# that it is done within the partition on nodes 1-2, long enough that node 3 still has
# ranges to run when it fails
ROADS = [pytest.param(Road("tasks", 36, 0.3), id="tasks"),
         pytest.param(Road("map", 3000, 0.002), id="bulk-map")]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("road", ROADS)
def test_a_node_that_crashes_mid_graph_loses_only_what_it_alone_held(three_nodes, procs,
                                                                      tmp_path, road):
    """Workers on nodes 1-3, a map then a sum; node 3 crashes once it holds results of its
    own. What only it held runs again on nodes 1-2 (once each), a result it had already
    copied to node 1 does not, and the client's results are right."""
    sfile, runs = tmp_path / "scheduler.json", tmp_path / "runs"
    runs.mkdir()
    start_scheduler(procs, sfile, "--interface", "hsbr0")
    workers = start_three(procs, sfile)
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(3, timeout=60)
        by_name = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        # made on node 3 and copied to node 1
        kept = client.submit(counted, -1, str(runs), 0, workers=["node3"], pure=False)
        client.replicate([kept], workers=[by_name["node1"], by_name["node3"]])
        assert set(client.who_has([kept])[kept.key]) == {by_name["node3"], by_name["node1"]}
        parts = road.start(client, runs)
        if road.graph:
            total = client.submit(add_all, kept, *parts, pure=False)
        until_node3_holds_results(client, parts, by_name, procs)
        killed = crash_node(LOST, [workers[LOST].pid])
        assert workers[LOST].pid in killed
        if road.graph:
            assert total.result(timeout=90) == 1 + sum(i * i for i in range(road.n))
        assert client.gather(parts, timeout=60) == [i * i for i in range(road.n)]
        road.check_road(client, parts)
        if not road.graph:
            assert client.submit(add_all, kept, *parts, pure=False).result(30) == \
                1 + sum(i * i for i in range(road.n))
        assert sorted(w["name"] for w in client.scheduler_info()["workers"].values()) == \
            ["node1", "node2"]
    assert workers[LOST].wait(10) == -9
    counts = runs_by_task(runs)
    assert counts["-1"] == {"node3": 1}  # a copy survived: not run again
    lost = [i for i in range(road.n) if counts[str(i)]["node3"]]
    assert len(lost) >= 3, counts
    for i in range(road.n):
        # run once on nodes 1-2 each task, also those node 3 had run (or was running)
        assert counts[str(i)]["node1"] + counts[str(i)]["node2"] == 1, (i, counts[str(i)])
        assert counts[str(i)]["node3"] <= 1, (i, counts[str(i)])


# seconds: the scheduler.worker-ttl of the partition test, long enough that nodes 1-2 are
# done with what they were given and idle when node 3 is dropped: its work must then
# reach them with no report of theirs to prompt it
TTL = 10.0
PARTITION = 30.0  # seconds node 3 is cut off


@pytest.mark.timeout(240)
@pytest.mark.parametrize("road", ROADS)
def test_a_node_cut_off_past_the_worker_ttl_is_dropped_and_its_work_rerun(three_nodes, procs,
                                                                         tmp_path, road):
    """Node 3's link goes down for 30 s mid-graph: the scheduler drops its worker after
    ``scheduler.worker-ttl`` and runs its tasks on nodes 1-2; when the link is back that
    worker finds it was dropped and exits (or joins again as a new worker), and nothing is
    counted twice."""
    sfile, runs = tmp_path / "scheduler.json", tmp_path / "runs"
    runs.mkdir()
    start_scheduler(procs, sfile, "--interface", "hsbr0",
                    env={"HPCSCHED_SCHEDULER__WORKER_TTL": str(TTL)})
    workers = start_three(procs, sfile)
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(3, timeout=60)
        by_name = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        # made on node 3, where nothing else copies it; elsewhere when it is lost
        alone = client.submit(counted, -1, str(runs), 0, workers=["node3"],
                              allow_other_workers=True, pure=False)
        assert alone.result(30) == 1
        parts = road.start(client, runs)
        if road.graph:
            total = client.submit(add_all, *parts, pure=False)
        until_node3_holds_results(client, parts, by_name, procs)
        with link_down(LOST):
            cut = time.monotonic()
            # node 1 fetches a result from node 3 while the scheduler still counts on it
            fetched = client.submit(add_all, alone, 1, workers=["node1"], pure=False)
            wait_until(lambda: by_name["node3"] not in client.scheduler_info()["workers"],
                       timeout=TTL * 3, what="the scheduler dropping node 3's worker")
            dropped = time.monotonic() - cut
            if road.graph:
                assert total.result(timeout=60) == sum(i * i for i in range(road.n))
            assert fetched.result(timeout=60) == 2
            fetch = time.monotonic() - cut
            assert client.gather(parts, timeout=30) == [i * i for i in range(road.n)]
            done = time.monotonic() - cut
            road.check_road(client, parts)
            # the link stays down until then: a fetch from node 3 that waits out its connect
            # timeout can make that a little longer than the partition's 30 s
            assert done < 2 * PARTITION, done
            time.sleep(max(PARTITION - done, 0))  # the rest of the partition: nothing to wait for
        back = time.monotonic()
        # back: the dropped worker learns it and exits, or joins again as a new worker
        wait_until(lambda: workers[LOST].poll() is not None or any(
            a != by_name["node3"] and w["name"] == "node3"
            for a, w in client.scheduler_info()["workers"].items()), timeout=90,
            what="node 3's dropped worker exiting or joining again")
        learnt = time.monotonic() - back
        if workers[LOST].poll() is not None:  # it says why it left
            assert workers[LOST].returncode == 1
            assert "the connection to the scheduler at" in procs.log("worker-node3")
        # the cluster still answers, with what it computed, once
        assert client.submit(add_all, *parts, pure=False).result(30) == \
            sum(i * i for i in range(road.n))
    counts = runs_by_task(runs)
    assert [i for i in range(road.n) if counts[str(i)]["node3"]], counts
    for i in range(road.n):
        assert counts[str(i)]["node1"] + counts[str(i)]["node2"] == 1, (i, counts[str(i)])
        assert counts[str(i)]["node3"] <= 1, (i, counts[str(i)])
    # lost with node 3: made again once, on node 1 or 2 (whichever is less busy then)
    assert counts["-1"]["node3"] == 1 and counts["-1"]["node1"] + counts["-1"]["node2"] == 1, \
        counts["-1"]
    print(f"node 3 dropped {dropped:.1f}s after its link went down (worker-ttl {TTL:g}s), "
          f"the fetch from it done after {fetch:.1f}s; "
          f"{learnt:.1f}s after it came back the worker had exit status "
          f"{workers[LOST].poll()}: {procs.log('worker-node3')[-600:]}")
