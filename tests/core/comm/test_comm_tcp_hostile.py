"""tcp:// under stress and attack: floods, slow and oversized messages, socket storms.

Real sockets on 127.0.0.1 only; every comm, listener, thread and process a test
starts is ended by it, also when it fails. Each test states what it bounds
(bytes, sockets, seconds); none depends on the machine being fast.
"""

from __future__ import annotations

import contextlib
import gc
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import psutil
import pytest

from hpcsched.core import config
from hpcsched.core.comm import CommClosedError, Security
from hpcsched.core.comm.base import Inbox
from hpcsched.core.comm.loop import CLOSED
from hpcsched.core.comm.tcp_frames import FrameTooLarge
from tests.conftest import wait_until, worker_env
from tests.core.comm.tcp_net import (
    authenticated_raw_socket,
    logged,
    read_until_eof,
)

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- frames
def test_a_message_that_never_finishes_is_dropped_after_the_message_timeout(net, comm_log):
    with config.set({"comm.timeouts.message": 0.5}):
        sec = Security.generate()
        srv = net.serve(security=sec, echo=False)
        s = authenticated_raw_socket(net, srv.address, sec.secret)
        server_side = srv.accepted.get(timeout=5)
        s.sendall(b"HSm1" + (1).to_bytes(4, "little") + (100).to_bytes(8, "little") + b"abc")
        with pytest.raises(CommClosedError, match="comm.timeouts.message"):
            server_side.recv(timeout=30)
        assert read_until_eof(s) == b""
        assert logged(comm_log, "closing comm with", "still incomplete")
        c = net.connect(srv.address, security=sec)  # the listener is unaffected
        srv.accepted.get(timeout=5).send("still serving")
        assert c.recv(timeout=5) == "still serving"


def test_an_announced_gigabyte_costs_the_server_nothing_until_it_arrives(net):
    sec = Security.generate()
    srv = net.serve(security=sec, echo=False)
    s = authenticated_raw_socket(net, srv.address, sec.secret)
    server_side = srv.accepted.get(timeout=5)
    proc = psutil.Process()
    before = proc.memory_info().rss
    s.sendall(b"HSm1" + (1).to_bytes(4, "little") + (2**30).to_bytes(8, "little") + b"x" * 4096)
    with pytest.raises(TimeoutError):
        server_side.recv(timeout=0.5)  # the frame is incomplete: nothing to deliver yet
    assert proc.memory_info().rss - before < 200 * 2**20
    s.close()
    with pytest.raises(CommClosedError):
        server_side.recv(timeout=10)


def test_sending_a_frame_over_the_limit_names_the_setting_and_keeps_the_comm(net):
    srv = net.serve()
    c = net.connect(srv.address)
    with config.set({"comm.max-frame-bytes": 2**20}):
        c2 = net.connect(srv.address)
    with pytest.raises(FrameTooLarge, match=r"comm.max-frame-bytes=1048576"):
        c2.send(np.zeros(2**18))  # 2 MiB
    c2.send("small still goes")
    assert c2.recv(timeout=5) == "small still goes"
    assert c.closed is False


# ---------------------------------------------------------------- sending never blocks
def test_two_peers_flooding_each_other_do_not_deadlock(net):
    """Each side queues 200 MB for the other before it reads anything. With sends that
    waited for the peer to read, both would wait forever."""
    srv = net.serve(echo=False)
    a = net.connect(srv.address)
    b = srv.accepted.get(timeout=5)
    block = np.arange(10 * 2**20 // 8, dtype="f8")  # 10 MiB
    n = 20
    sent = {"a": threading.Event(), "b": threading.Event()}
    errors: queue.Queue = queue.Queue()

    def flood(comm: Any, name: str) -> None:
        try:
            for i in range(n):
                comm.send((name, i, block))
            sent[name].set()
        except Exception as e:
            errors.put(e)

    threads = [threading.Thread(target=flood, args=(a, "a")),
               threading.Thread(target=flood, args=(b, "b"))]
    net.threads += threads
    for t in threads:
        t.start()
    for name, ev in sent.items():
        assert ev.wait(60), f"{name}'s sends did not return while nobody read"
    assert errors.empty()
    for comm, other in ((a, "b"), (b, "a")):
        for i in range(n):
            name, j, arr = comm.recv(timeout=60)
            assert (name, j) == (other, i)
            assert arr[-1] == block[-1] and arr.nbytes == block.nbytes


def test_a_peer_that_does_not_read_is_cut_off_at_the_queue_limit(net, comm_log):
    srv = net.serve(echo=False)  # accepts, never reads: its socket buffers fill up
    with config.set({"comm.max-send-queue-bytes": 8 * 2**20}):
        c = net.connect(srv.address)
    block = np.zeros(2**20)  # 8 MiB
    with pytest.raises(CommClosedError, match="comm.max-send-queue-bytes"):
        for _ in range(200):
            c.send(block)
    assert c.closed
    assert logged(comm_log, "not reading")


# ---------------------------------------------------------------- delivery
class RecordingInbox(Inbox):
    """``offer=False``: an inbox keeping ``Inbox``'s queueing ``offer_batch``."""

    def __init__(self, offer: bool):
        self.items: queue.Queue = queue.Queue()
        self.threads: list[str] = []
        if offer:
            self.offer_batch = self._record_batch

    def put(self, item: Any) -> None:
        self._record(item)

    def _record_batch(self, items: list) -> None:
        for item in items:
            self._record(item)

    def _record(self, item: Any) -> None:
        self.threads.append(threading.current_thread().name)
        self.items.put(item)


@pytest.mark.parametrize("offer", [False, True])
def test_deliver_to_pushes_messages_in_order_then_the_closed_marker(net, offer):
    srv = net.serve(echo=False)
    c = net.connect(srv.address)
    server_side = srv.accepted.get(timeout=5)
    c.send("queued before deliver_to")
    wait_until(lambda: server_side._inq, what="the first message to arrive")
    inbox = RecordingInbox(offer)
    server_side.deliver_to(inbox, "peer-1", CLOSED)
    for i in range(100):
        c.send(i)
    got = [inbox.items.get(timeout=10) for _ in range(101)]
    assert got == [("peer-1", "queued before deliver_to")] + [("peer-1", i) for i in range(100)]
    c.close()
    assert inbox.items.get(timeout=10) == ("peer-1", CLOSED)
    assert inbox.items.empty()
    # what was queued is handed over by the caller of deliver_to; the rest by the I/O
    # thread itself (an idle loop runs its iteration there), batched per round of events
    assert set(inbox.threads[1:]) == {"hpcsched-tcp-io"}


def test_an_undecodable_message_queued_before_deliver_to_closes_that_comm_only(net, comm_log):
    sec = Security.generate()
    srv = net.serve(security=sec, echo=False)
    s = authenticated_raw_socket(net, srv.address, sec.secret)
    bad = srv.accepted.get(timeout=5)
    garbage = b"not a pickle"
    s.sendall(b"HSm1" + (1).to_bytes(4, "little") + len(garbage).to_bytes(8, "little")
              + garbage)
    wait_until(lambda: bad._inq, what="the undecodable message to arrive")
    inbox = RecordingInbox(offer=True)
    bad.deliver_to(inbox, "bad-peer", CLOSED)
    assert inbox.items.get(timeout=10) == ("bad-peer", CLOSED)
    assert bad.closed
    assert logged(comm_log, "closing comm with", "undecodable message")
    assert read_until_eof(s) == b""
    good = net.connect(srv.address, security=sec)  # the listener and others are unaffected
    srv.accepted.get(timeout=5).send("still serving")
    assert good.recv(timeout=5) == "still serving"


@pytest.mark.parametrize("closed_by", ["peer", "us", "peer-before-deliver_to"])
def test_a_closed_comm_goes_with_its_last_user_not_with_the_collector(net, closed_by):
    """A worker hands a peer comm's messages to its loop with the comm named where it
    delivers and, in a large cluster, closes peer comms all the time. Once the
    closed marker is handed over and the receiver lets go, the comm (its receive buffer,
    its socket object) is freed at once: not kept by a reference cycle through its own
    source until the cyclic collector's next full pass, which a server runs rarely
    (``admin.gc-threshold``)."""
    srv = net.serve(echo=False)
    c = net.connect(srv.address)
    server_side = srv.accepted.get(timeout=5)
    srv.comms.remove(server_side)  # the test's own reference is the last one
    inbox = RecordingInbox(offer=True)
    source = ("peer", server_side)
    if closed_by == "peer-before-deliver_to":
        c.close()
        wait_until(lambda comm=server_side: comm.closed, what="the peer's close to arrive")
        server_side.deliver_to(inbox, source, CLOSED)
    else:
        server_side.deliver_to(inbox, source, CLOSED)
        c.send("hello")
        assert inbox.items.get(timeout=10) == (source, "hello")
        (c if closed_by == "peer" else server_side).close()
    assert inbox.items.get(timeout=10) == (source, CLOSED)
    freed = weakref.ref(server_side)
    gc.disable()
    try:
        del server_side, source
        # torn down (socket closed, I/O thread let go) once the peer's end is closed too
        wait_until(lambda: freed() is None, what="the closed comm to be freed")
    finally:
        gc.enable()


# ---------------------------------------------------------------- handshake storms
ATTACKER = textwrap.dedent("""
    import selectors, socket, sys, time
    host, port, n, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    sel = selectors.DefaultSelector()
    reopened = 0
    def open_one():
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, port))
        sel.register(s, selectors.EVENT_READ)
    for _ in range(n):
        open_one()
    sel.register(sys.stdin, selectors.EVENT_READ)
    print("ready", flush=True)
    end = time.monotonic() + limit
    while time.monotonic() < end:
        for key, _ in sel.select(0.5):
            if key.fileobj is sys.stdin:
                print("reopened", reopened, flush=True)
                sys.exit(0)
            try:
                data = key.fileobj.recv(4096)  # the greeting, and never an answer
            except OSError:
                data = b""
            if not data:  # dropped by the server: come straight back
                sel.unregister(key.fileobj)
                key.fileobj.close()
                open_one()
                reopened += 1
""")


def test_a_client_gets_in_while_500_idle_sockets_keep_coming_back(tmp_path):
    """500 unauthenticated sockets that never answer the greeting, reopened as soon as the
    scheduler drops them, cannot keep a legitimate Client out for 2 seconds."""
    from hpcsched.core.client.client import Client

    env = dict(os.environ, **worker_env())
    for var in ("HPCSCHED_SECRET", "HPCSCHED_SECRET_FILE"):
        env.pop(var, None)
    sched_file = tmp_path / "scheduler.json"
    procs: list[subprocess.Popen] = []
    try:
        sched = subprocess.Popen(
            [sys.executable, "-m", "hpcsched", "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--scheduler-file", str(sched_file)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "scheduler.log", "wb"))  # noqa: SIM115 - closed with it
        procs.append(sched)
        wait_until(sched_file.exists, timeout=60, what="the scheduler file")
        with Client(str(sched_file), timeout=30, set_as_default=False) as warmup:
            address = warmup.scheduler_address
        host, port = address[len("tcp://"):].rsplit(":", 1)
        attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, host, port, "500", "90"],
                                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True)
        procs.append(attacker)
        assert attacker.stdout.readline().strip() == "ready"
        for _ in range(3):
            with Client(str(sched_file), timeout=2, set_as_default=False) as c:
                assert c.scheduler_info()["address"] == address
        attacker.stdin.close()
        report = attacker.stdout.readline().split()
        assert report[0] == "reopened" and int(report[1]) > 0  # the storm was on
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
            for f in (p.stdin, p.stdout):
                if f is not None:
                    f.close()


def _limit_descriptors() -> None:
    """In the scheduler's process, before it starts: few file descriptors, and no more
    to be had (the hard limit as low as the soft one)."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))


def _soft_descriptor_limit() -> None:
    """In the scheduler's process, before it starts: a soft limit on descriptors lower
    than its workers, and a hard one that allows them, as many systems give."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 4096))


@contextlib.contextmanager
def _scheduler_with_limits(tmp_path, limits) -> Iterator[tuple[subprocess.Popen, Any]]:
    """``hpcsched scheduler`` on 127.0.0.1, started with ``limits`` (a preexec function
    setting its descriptor limits), without a secret: (its process, its scheduler file),
    killed on the way out."""
    env = dict(os.environ, **worker_env())
    for var in ("HPCSCHED_SECRET", "HPCSCHED_SECRET_FILE"):
        env.pop(var, None)
    sched_file = tmp_path / "scheduler.json"
    with open(tmp_path / "scheduler.log", "wb") as log:
        sched = subprocess.Popen(
            [sys.executable, "-m", "hpcsched", "scheduler", "--host", "127.0.0.1", "--port",
             "0", "--scheduler-file", str(sched_file)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            preexec_fn=limits)
        try:
            yield sched, sched_file
        finally:
            if sched.poll() is None:
                sched.kill()
            sched.wait(timeout=30)


def test_a_scheduler_takes_more_workers_than_its_soft_descriptor_limit(tmp_path):
    """Many systems give a process 1,024 descriptors (its soft limit) unless it asks for
    more, up to a hard limit they allow: a scheduler of a thousand workers, one socket
    each, has to ask. Here its soft limit is 64 and 100 workers join it."""
    from concurrent.futures import ThreadPoolExecutor

    from hpcsched.core.client.client import Client
    from hpcsched.core.comm.scheduler_file import read_scheduler_file
    from hpcsched.core.worker.server import Worker

    workers: list[Worker] = []
    with _scheduler_with_limits(tmp_path, _soft_descriptor_limit) as (sched, sched_file):
        try:
            wait_until(sched_file.exists, timeout=60, what="the scheduler file")
            address, security = read_scheduler_file(str(sched_file))
            # all at once, as a node's worker processes start; one refused fails in 20 s
            workers.extend(Worker(address, nthreads=1, security=security, death_timeout=20)
                           for _ in range(100))
            with ThreadPoolExecutor(len(workers)) as pool:
                list(pool.map(lambda w: w.start(), workers))
            with Client(str(sched_file), timeout=30, set_as_default=False) as c:
                c.wait_for_workers(100, timeout=30)
                assert c.submit(sum, [1, 2]).result(timeout=30) == 3
            assert psutil.Process(sched.pid).rlimit(psutil.RLIMIT_NOFILE) == (4096, 4096)
            assert b"accept failed" not in (tmp_path / "scheduler.log").read_bytes()
        finally:
            for w in workers:
                w.close()


def test_the_descriptor_limit_is_raised_to_the_kernels_ceiling_where_unlimited(monkeypatch):
    """A hard limit of 'unlimited' cannot be the soft one (Linux refuses more than
    /proc/sys/fs/nr_open): the ceiling is asked for instead, and a refusal is no error."""
    import resource

    from hpcsched.core.comm import tcp_listener

    asked: list[tuple[int, int]] = []

    def setrlimit(which: int, limits: tuple[int, int]) -> None:
        asked.append(limits)
        if limits[0] > 1 << 20:
            raise ValueError("not allowed")

    monkeypatch.setattr(tcp_listener, "_raised", False)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, resource.RLIM_INFINITY))
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    with open("/proc/sys/fs/nr_open") as f:
        ceiling = int(f.read())
    got = tcp_listener.raise_descriptor_limit()
    assert asked[0] == (ceiling, resource.RLIM_INFINITY)
    assert got == ((ceiling, resource.RLIM_INFINITY) if ceiling <= 1 << 20
                   else (10240, resource.RLIM_INFINITY))
    # once per process: a limit the program lowers afterwards is its own
    asked.clear()
    assert tcp_listener.raise_descriptor_limit() == (1024, resource.RLIM_INFINITY)
    assert asked == []


def test_a_listener_out_of_file_descriptors_waits_instead_of_spinning(tmp_path):
    """A scheduler that runs out of file descriptors cannot accept the peers queued for it:
    its listening socket stays readable. It must not call accept() in a loop meanwhile
    (it burnt a core, and its I/O thread, until descriptors were freed), and it takes
    peers again once some are."""
    import socket

    from hpcsched.core.client.client import Client

    socks: list[socket.socket] = []
    with _scheduler_with_limits(tmp_path, _limit_descriptors) as (sched, sched_file):
        try:
            wait_until(sched_file.exists, timeout=60, what="the scheduler file")
            with Client(str(sched_file), timeout=30, set_as_default=False) as warmup:
                address = warmup.scheduler_address
            host, port = address[len("tcp://"):].rsplit(":", 1)
            proc = psutil.Process(sched.pid)
            # more peers than it has descriptors left: the rest wait in the kernel's queue
            for _ in range(300):
                socks.append(socket.create_connection((host, int(port)), timeout=10))
            wait_until(lambda: b"accept failed" in (tmp_path / "scheduler.log").read_bytes(),
                       timeout=30, what="the scheduler to run out of file descriptors")
            before = sum(proc.cpu_times()[:2])
            time.sleep(2.0)  # a measurement window, not a wait for something to happen
            spent = sum(proc.cpu_times()[:2]) - before
            assert spent < 0.5, f"{spent:.2f}s of CPU in 2s while out of file descriptors"
            for s in socks:
                s.close()
            socks.clear()
            with Client(str(sched_file), timeout=30, set_as_default=False) as c:
                assert c.scheduler_info()["address"] == address
        finally:
            for s in socks:
                s.close()
