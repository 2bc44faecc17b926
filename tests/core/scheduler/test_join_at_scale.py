"""Workers joining and idling at scale, over TCP with real components.

* The heartbeat interval the scheduler tells its workers grows with the cluster, and
  a worker that hangs (its connection open, its heartbeats stopped) is still removed
  within ``worker_ttl``.
* Hundreds of workers connecting at once, from a few processes, all join: no
  handshake timeouts, no lost registrations, no thread per connection.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcsched.core import config
from hpcsched.core.comm.base import Security
from hpcsched.core.scheduler.server import Scheduler
from hpcsched.core.state import liveness
from hpcsched.core.worker.server import Worker
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def no_extensions():
    with config.set({"scheduler.extensions": []}):
        yield


@pytest.mark.timeout(60)
def test_the_interval_grows_with_the_cluster_and_a_hung_worker_goes_within_its_ttl(
        monkeypatch, no_extensions):
    # 10 heartbeats a second at most: 4 workers at a base of 0.1 s heartbeat every 0.4 s
    monkeypatch.setattr(liveness, "HEARTBEATS_PER_SECOND", 10)
    ttl = 2.0
    security = Security.generate()
    workers: list[Worker] = []
    with config.set({"worker.heartbeat-interval": 0.1}), \
            Scheduler("tcp://127.0.0.1:0", security, worker_ttl=ttl,
                      dashboard_address=None).start() as s:
        try:
            for _ in range(4):
                workers.append(Worker(s.address, nthreads=1, security=security).start())
            s.wait_for_workers(4, timeout=20)
            grown = liveness.heartbeat_interval(4, 0.1, ttl)
            assert grown == pytest.approx(0.4)
            # the last to join was told at registration, the first ones after a heartbeat
            wait_until(lambda: all(w.heartbeats.interval == grown for w in workers),
                       timeout=20, what="every worker heartbeating at the grown interval")
            assert all(ws["status"] == "running" for ws in s.workers_info().values())
            victim = workers[0]
            victim.loop.stop()  # hung: its connection stays open, its heartbeats stop
            t0 = time.monotonic()
            wait_until(lambda: victim.address not in s.workers_info(), timeout=20,
                       what="the hung worker removed")
            assert time.monotonic() - t0 <= ttl + 1.0
            # the others heartbeat at their interval: they stayed through the same TTL
            assert set(s.workers_info()) == {w.address for w in workers[1:]}
        finally:
            for w in workers:
                w.close()


HOST = """
import sys, threading
from hpcsched.core.comm.base import Security
from hpcsched.core.worker.server import Worker

address, secret, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
security = Security.from_hex(secret)
workers, failures = [], []
go = threading.Event()

def start():
    go.wait()
    try:
        workers.append(Worker(address, nthreads=1, security=security, death_timeout=60).start())
    except Exception as e:
        failures.append(repr(e))

threads = [threading.Thread(target=start) for _ in range(count)]
for t in threads:
    t.start()
go.set()  # every worker of this process connects at once
for t in threads:
    t.join(120)
print(f"started {len(workers)} failed {len(failures)} {failures[:3]}", flush=True)
sys.stdin.read()  # until the test is done
for w in workers:
    w.close()
"""


@pytest.mark.timeout(180)
def test_hundreds_of_workers_connecting_at_once_all_join(no_extensions):
    n, hosts = 300, 3
    security = Security.generate()
    with Scheduler("tcp://127.0.0.1:0", security, dashboard_address=None).start() as s:
        procs = [subprocess.Popen(
            [sys.executable, "-c", HOST, s.address, security.secret_hex(), str(n // hosts)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            for _ in range(hosts)]
        try:
            s.wait_for_workers(n, timeout=120)
            reports = [p.stdout.readline() for p in procs]  # type: ignore[union-attr]
            assert reports == [f"started {n // hosts} failed 0 []\n"] * hosts
            info = s.workers_info()
            assert len(info) == n and len({ws["name"] for ws in info.values()}) == n
            # the scheduler served them without a thread per connection
            assert threading.active_count() < 50
        finally:
            for p in procs:
                try:
                    p.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
