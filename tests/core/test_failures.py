"""Failures end to end, each test on its own LocalCluster of real worker processes.

Workers killed with SIGKILL mid-task, a task that kills every worker it runs on,
peers with the wrong secret, raw sockets sending garbage, and a registered peer
sending nonsense: the answer stays right and the cluster keeps serving.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import struct
import time
from typing import Any

import pytest

from hpcsched.core import config
from hpcsched.core.client.client import Client
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import CommClosedError, HandshakeError, Security
from hpcsched.core.state.scheduler_state import KilledWorker
from tests.conftest import _local_cluster, wait_until


def inc(x):
    return x + 1


def slowinc(x, delay=1.0):
    time.sleep(delay)
    return x + 1


def die(x):
    os.kill(os.getpid(), signal.SIGKILL)


def exit_hard(x):
    os._exit(3)


@pytest.fixture
def cluster4() -> Any:
    c = _local_cluster(n_workers=4)
    try:
        yield c
    finally:
        c.close()


def proc_of(cluster: Any, address: str) -> Any:
    """The Popen of the worker process listening at ``address``."""
    pid = cluster.scheduler_info_workers()[address]["pid"]
    (proc,) = [p for p in cluster.worker_processes.values() if p.pid == pid]
    return proc


def executing_on(cluster: Any, n: int = 1) -> str:
    """Address of a worker that has started ``n`` tasks (TaskStarted seen by the scheduler)."""

    def find() -> str | None:
        for addr, w in cluster.scheduler_info_workers().items():
            if w["executing"] >= n:
                return addr
        return None

    return wait_until(find, timeout=20, what="a task running on a worker")


def kill(cluster: Any, address: str) -> None:
    proc = proc_of(cluster, address)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    wait_until(lambda: address not in cluster.scheduler_info_workers(), timeout=20,
               what=f"the scheduler to notice {address} died")


# ---------------------------------------------------------------- killed workers
@pytest.mark.timeout(90)
def test_worker_sigkilled_mid_task_the_answer_is_still_right(client, cluster):
    x = client.submit(slowinc, 1, 1.0)
    victim = executing_on(cluster)
    kill(cluster, victim)
    assert x.result(timeout=60) == 2
    assert victim not in cluster.scheduler_info_workers()
    # the cluster keeps computing on what is left
    assert sum(client.gather(client.map(inc, range(20)), timeout=30)) == sum(range(1, 21))


@pytest.mark.timeout(90)
def test_result_held_only_by_the_killed_worker_is_recomputed_from_its_inputs(client, cluster):
    workers = sorted(cluster.scheduler_info_workers())
    victim = workers[0]
    # a and b are computed on the victim, and only held there
    a = client.submit(inc, 1, workers=[victim], allow_other_workers=True)
    b = client.submit(inc, a, workers=[victim], allow_other_workers=True)
    assert b.result(timeout=30) == 3
    # c runs (slowly) on the victim too, and needs b
    c = client.submit(slowinc, b, 1.0, workers=[victim], allow_other_workers=True)
    assert executing_on(cluster) == victim
    kill(cluster, victim)
    assert client.gather([a, b, c], timeout=60) == [2, 3, 4]
    assert victim not in cluster.scheduler_info_workers()


@pytest.mark.timeout(90)
def test_gather_right_after_the_holder_died(client, cluster):
    victim, _ = sorted(cluster.scheduler_info_workers())
    x = client.submit(inc, 1, workers=[victim], allow_other_workers=True)
    ys = client.map(inc, range(10), workers=[victim], allow_other_workers=True)
    assert x.result(timeout=30) == 2
    client.gather(ys, timeout=30)
    proc = proc_of(cluster, victim)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    # no waiting for the scheduler to notice: the gather may hit the dead worker
    assert client.gather([x, *ys], timeout=60) == [2, *range(1, 11)]


@pytest.mark.timeout(90)
def test_graph_survives_a_killed_worker(client, cluster):
    dsk = {("x", i): (slowinc, i, 0.05) for i in range(20)}
    dsk["total"] = (sum, [("x", i) for i in range(20)])
    fut = client.compute(dsk, "total")
    victim = executing_on(cluster)
    kill(cluster, victim)
    assert fut.result(timeout=60) == sum(range(1, 21))


@pytest.mark.timeout(90)
def test_silent_worker_is_removed_by_heartbeat_timeout():
    """A frozen worker (SIGSTOP: connection open, no heartbeats) is removed after the
    worker-ttl and its task runs elsewhere."""
    cluster = _local_cluster(n_workers=2, scheduler_kwargs={"worker_ttl": 3.0})
    victim_proc = None
    try:
        with Client(cluster, set_as_default=False) as client:
            x = client.submit(slowinc, 1, 1.0)
            victim = executing_on(cluster)
            victim_proc = proc_of(cluster, victim)
            victim_proc.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            assert x.result(timeout=60) == 2
            assert victim not in cluster.scheduler_info_workers()
            assert time.monotonic() - t0 < 30
            victim_proc.send_signal(signal.SIGCONT)
            # thawed, it finds its scheduler connection closed and exits
            victim_proc.wait(30)
    finally:
        if victim_proc is not None and victim_proc.poll() is None:
            victim_proc.send_signal(signal.SIGCONT)
        cluster.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("killer", [die, exit_hard], ids=["sigkill-self", "os._exit"])
def test_task_killing_three_workers_errs_with_killed_worker(cluster4, killer):
    with Client(cluster4, set_as_default=False) as client:
        bad = client.submit(killer, 1)
        with pytest.raises(KilledWorker) as e:
            bad.result(timeout=90)
        text = str(e.value)
        assert repr(bad.key) in text
        assert "3 workers" in text and "died" in text
        assert bad.status == "error"
        # LocalCluster replaces crashed workers: the cluster is back to its size, and computes
        wait_until(lambda: len(cluster4.scheduler_info_workers()) == 4, timeout=30,
                   what="the dead workers to be replaced")
        assert client.submit(inc, 41).result(timeout=30) == 42
        assert sum(client.gather(client.map(inc, range(10)), timeout=30)) == 55


# ---------------------------------------------------------------- hostile peers
def test_wrong_secret_is_refused_while_the_cluster_keeps_working(client, cluster):
    with pytest.raises(HandshakeError):
        registry.connect(cluster.scheduler_address, timeout=5, security=Security.generate())
    with pytest.raises((HandshakeError, ConnectionError)):
        registry.connect(cluster.scheduler_address, timeout=5, security=None)
    with pytest.raises((HandshakeError, ConnectionError)):
        Client(cluster.scheduler_address, security=Security.generate(), timeout=5,
               set_as_default=False)
    assert client.submit(inc, 1).result(timeout=30) == 2
    assert len(cluster.scheduler_info_workers()) == 2


def _raw(address: str) -> socket.socket:
    host, port = address.split("://", 1)[1].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _drained(sock: socket.socket) -> bool:
    """True once the server closed the connection (reads return EOF or fail)."""
    sock.settimeout(10)
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    return True


def test_raw_socket_garbage_is_dropped_and_the_scheduler_keeps_serving():
    # a short message (an HTTP probe) waits for the rest of a handshake, bounded by the
    # handshake timeout, which the listener reads when it starts
    with config.set({"comm.timeouts.handshake": 1.0}):
        cluster = _local_cluster(n_workers=1)
    try:
        with Client(cluster, set_as_default=False) as client:
            for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(4096),
                         b"\x00" * 100, b""):
                s = _raw(cluster.scheduler_address)
                try:
                    t0 = time.monotonic()
                    s.sendall(junk)
                    assert _drained(s)
                    assert time.monotonic() - t0 < 5
                finally:
                    s.close()
            s = _raw(cluster.scheduler_address)  # connects and leaves at once
            s.close()
            assert client.submit(inc, 2).result(timeout=30) == 3
            total = sum(client.gather(client.map(inc, range(50)), timeout=30))
            assert total == sum(range(1, 51))
    finally:
        cluster.close()


def _registered_peer(cluster: Any) -> Any:
    comm = registry.connect(cluster.scheduler_address, timeout=5, security=cluster.security)
    comm.send([{"op": "register-client", "client": f"intruder-{os.getpid()}"}])
    reply = comm.recv(timeout=5)
    assert reply[0]["op"] == "registered"
    return comm


def _dropped(comm: Any) -> bool:
    try:
        while True:
            comm.recv(timeout=10)
    except CommClosedError:
        return True
    except TimeoutError:
        return False


def test_registered_peer_sending_an_unknown_op_is_dropped_and_logged(client, cluster, caplog):
    caplog.set_level(logging.WARNING, logger="hpcsched.scheduler")
    comm = _registered_peer(cluster)
    try:
        comm.send([{"op": "launch-missiles", "target": "everything"}])
        assert _dropped(comm)
    finally:
        comm.close()
    assert any("launch-missiles" in r.getMessage() for r in caplog.records)
    assert client.submit(inc, 3).result(timeout=30) == 4


@pytest.mark.parametrize("bad", [
    ["not a dict"],
    [{"no-op": 1}],
    [{"op": "update-graph", "tasks": {}, "keys": [], "surprise": 1}],
    [{"op": "task-finished", "key": "x"}],  # a worker's op from a client
], ids=["not-a-dict", "no-op", "unknown-field", "worker-op"])
def test_registered_peer_sending_malformed_messages_is_dropped(client, cluster, bad):
    comm = _registered_peer(cluster)
    try:
        comm.send(bad)
        assert _dropped(comm)
    finally:
        comm.close()
    assert client.submit(inc, 4).result(timeout=30) == 5


def test_garbage_frame_after_a_correct_handshake_is_dropped(client, cluster):
    comm = _registered_peer(cluster)
    try:
        comm._sock.sendall(b"XXXX" + os.urandom(64))  # not an hpcsched frame header
        assert _dropped(comm)
    finally:
        comm.close()
    comm = _registered_peer(cluster)
    try:
        # a well-formed header announcing one absurdly large frame
        comm._sock.sendall(b"HSm1" + struct.pack("<I", 1) + struct.pack("<Q", 2**62))
        assert _dropped(comm)
    finally:
        comm.close()
    assert client.submit(inc, 5).result(timeout=30) == 6
    assert len(cluster.scheduler_info_workers()) == 2
