"""A scheduler that dies and comes back, with real processes, as a user on a login node
runs them: ``hpcsched scheduler --journal J`` SIGKILLed in the middle of a graph and started
again with the same command; worker processes that keep their results; the client that
submitted the graph, which reconnects. And a scheduler that never comes back: its workers
do not outlive it by more than their reconnect timeout.

Each task appends a byte to a file of its own, so the files count executions. Every process
a test starts is killed in ``finally`` (the ``procs`` fixture).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from hpcsched import Client
from hpcsched.core import config
from tests.conftest import wait_until
from tests.launchers.counting import counted, runs
from tests.launchers.procs import WORKER_OPTS, hpcsched_cmd

N = 2000
REST = 180.0  # seconds the restarted scheduler may take to finish the graph


def scheduler_cmd(sfile: Path, journal: Path) -> list[str]:
    return [*hpcsched_cmd(), "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--scheduler-file", str(sfile), "--journal", str(journal)]


NO_DASHBOARD = {"HPCSCHED_SCHEDULER__EXTENSIONS": "[]"}


@pytest.mark.timeout(420)
def test_a_killed_scheduler_restarted_with_its_journal_finishes_the_graph(procs, tmp_path):  # noqa: F811
    sfile, journal, done = tmp_path / "scheduler.json", tmp_path / "journal", tmp_path / "runs"
    done.mkdir()
    sched = procs.start(scheduler_cmd(sfile, journal), "scheduler-1", env=NO_DASHBOARD)
    wait_until(lambda: sfile.exists() or sched.poll() is not None, timeout=30,
               what="the scheduler file")
    first_address = sfile.read_text()
    for i in range(2):
        procs.start([*hpcsched_cmd(), "worker", "--scheduler-file", str(sfile),
                     "--scheduler-reconnect-timeout", "120", *WORKER_OPTS], f"worker-{i}")
    with config.set({"client.scheduler-reconnect-timeout": 120}):
        client = Client(str(sfile), set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=30)
        futures = client.map(counted, range(N), directory=str(done))
        client.publish_dataset(first=futures[:10])
        wait_until(lambda: len(list(done.iterdir())) >= N // 2, timeout=120,
                   what="half the tasks done")
        sched.send_signal(signal.SIGKILL)
        sched.wait(10)
        before = runs(done)
        assert len(before) < N, "the graph finished before the scheduler was killed"
        # the same command again
        sched = procs.start(scheduler_cmd(sfile, journal), "scheduler-2", env=NO_DASHBOARD)
        # how long the rest takes is the machine's load (the cluster runs tasks as fast
        # after the restart as before it): the timeout only tells a hang from progress
        results = client.gather(futures, timeout=REST)
        assert results == [2 * i for i in range(N)]
        # the restarted scheduler gave out work as soon as both workers were back, not
        # once their grace (scheduler.journal-worker-grace) was over
        assert "2 workers came back: giving out work" in procs.log("scheduler-2")
        assert sfile.read_text() == first_address  # same address, same secret
        after = runs(done)
        assert len(after) == N
        # what workers held (everything that ran before the kill, and what their running
        # tasks finished while the scheduler was away) was not run again
        rerun = sorted(k for k, n in after.items() if n > 1)
        assert not rerun, f"{len(rerun)} tasks ran again: {rerun[:10]}"
        # a new client (a restarted notebook) finds what was published
        with Client(str(sfile), set_as_default=False) as other:
            assert other.gather(other.get_dataset("first"), timeout=30) == \
                [2 * i for i in range(10)]
        assert runs(done) == after  # ... without recomputing it
        # each future was delivered once: one result each, in the right order
        assert len(results) == N and all(f.status == "finished" for f in futures)
    finally:
        client.close(timeout=2)
    sched.terminate()
    assert sched.wait(30) == 0


@pytest.mark.timeout(120)
def test_workers_of_a_scheduler_that_never_returns_exit_after_their_reconnect_timeout(procs, tmp_path):  # noqa: F811
    sfile, journal = tmp_path / "scheduler.json", tmp_path / "journal"
    sched = procs.start(scheduler_cmd(sfile, journal), "scheduler", env=NO_DASHBOARD)
    wait_until(lambda: sfile.exists() or sched.poll() is not None, timeout=30,
               what="the scheduler file")
    timeout = 3.0
    workers = [procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file",
                            str(sfile), "--scheduler-reconnect-timeout", str(timeout),
                            *WORKER_OPTS], f"worker-{i}") for i in range(2)]
    with config.set({"client.scheduler-reconnect-timeout": timeout}):
        client = Client(str(sfile), set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=30)
        fut = client.submit(time.sleep, 600, pure=False)
        sched.send_signal(signal.SIGKILL)
        sched.wait(10)
        killed = time.monotonic()
        for w in workers:
            code = w.wait(timeout + 10)
            assert code != 0, "a worker whose scheduler vanished must not claim success"
        assert time.monotonic() - killed < timeout + 10
        # the client gives up too, naming the setting
        with pytest.raises(ConnectionError, match="scheduler-reconnect-timeout"):
            fut.result(timeout=timeout + 20)
    finally:
        client.close(timeout=1)


NOTEBOOK = """
import sys, time
from hpcsched import Client, LocalCluster
from tests.launchers.counting import counted
cluster = LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=0,
                       dashboard_address=None, scheduler_journal=sys.argv[1])
client = Client(cluster)
futures = client.map(counted, range(20), directory=sys.argv[2])  # held, as in a notebook
print(sum(client.gather(futures)), flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_a_notebook_restarted_with_its_journal_gets_its_results_without_recomputing(procs, tmp_path):  # noqa: F811
    """A notebook kernel holding a LocalCluster dies (SIGKILL); the worker process it
    started keeps its results; a new kernel makes a LocalCluster with the same journal and
    submits the same pure calls: the results come from that worker, nothing runs again."""
    from hpcsched import LocalCluster

    journal, done = tmp_path / "journal", tmp_path / "runs"
    done.mkdir()
    kernel = procs.start([sys.executable, "-c", NOTEBOOK, str(journal), str(done)], "kernel")
    wait_until(lambda: "380" in procs.log("kernel") or kernel.poll() is not None, timeout=60,
               what="the first kernel's results")
    assert kernel.poll() is None, procs.log("kernel")
    worker = next(p for p in psutil.Process(kernel.pid).children()
                  if "worker" in " ".join(p.cmdline()))
    try:
        kernel.send_signal(signal.SIGKILL)
        kernel.wait(10)
        assert worker.is_running()
        with LocalCluster(n_workers=0, dashboard_address=None,
                          scheduler_journal=str(journal)) as cluster, \
                Client(cluster, set_as_default=False) as client:
            cluster.wait_for_workers(1, timeout=30)  # the old kernel's worker, come back
            again = client.gather(client.map(counted, range(20), directory=str(done)),
                                  timeout=30)
            assert again == [2 * i for i in range(20)]
            assert runs(done) == {i: 1 for i in range(20)}
        worker.wait(30)  # closed with the cluster that adopted it
    finally:
        if worker.is_running():
            worker.kill()


HOLDER = """
import sys, time
from hpcsched import Client, Lock
client = Client(sys.argv[1], set_as_default=False)
assert Lock("theirs", client=client).acquire(timeout=10)
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(180)
def test_the_coordination_primitives_survive_a_restart(procs, tmp_path):  # noqa: F811
    """Variables (a value, a future), queued items, a set event, held locks and semaphore
    leases: all there after the scheduler is SIGKILLed and started again with its journal.
    A lease's holder that comes back keeps it; one that does not loses it after the
    client grace."""
    from hpcsched import Event, Lock, Queue, Semaphore, Variable

    sfile, journal, done = tmp_path / "scheduler.json", tmp_path / "journal", tmp_path / "runs"
    done.mkdir()
    grace = {**NO_DASHBOARD, "HPCSCHED_SCHEDULER__JOURNAL_CLIENT_GRACE": "10"}
    sched = procs.start(scheduler_cmd(sfile, journal), "scheduler-1", env=grace)
    wait_until(lambda: sfile.exists() or sched.poll() is not None, timeout=30,
               what="the scheduler file")
    procs.start([*hpcsched_cmd(), "worker", "--scheduler-file", str(sfile),
                 "--scheduler-reconnect-timeout", "120", *WORKER_OPTS], "worker")
    with config.set({"client.scheduler-reconnect-timeout": 120}):
        mine = Client(str(sfile), set_as_default=False)
    try:
        mine.wait_for_workers(1, timeout=30)
        Variable("plain", client=mine).set(41)
        Variable("future", client=mine).set(mine.submit(counted, 7, directory=str(done)))
        queue = Queue("q", client=mine)
        queue.put(1)
        queue.put(2)
        Event("e", client=mine).set()
        lock = Lock("mine", client=mine)
        assert lock.acquire(timeout=10)
        assert Semaphore(2, "s", client=mine).acquire(timeout=10)
        holder = procs.start([sys.executable, "-c", HOLDER, str(sfile)], "holder")
        wait_until(lambda: "held" in procs.log("holder") or holder.poll() is not None,
                   timeout=30, what="the other client's lock")
        assert Variable("future", client=mine).get(timeout=10).result(timeout=30) == 14
        sched.send_signal(signal.SIGKILL)  # first: the holder's lease is in the journal
        sched.wait(10)
        holder.send_signal(signal.SIGKILL)  # ... and it never comes back
        holder.wait(10)
        sched = procs.start(scheduler_cmd(sfile, journal), "scheduler-2", env=grace)
        with Client(str(sfile), set_as_default=False) as other:
            # held by a client the journal names, which has the grace to come back
            assert not Lock("theirs", client=other).acquire(timeout=0)
            assert Variable("plain", client=other).get(timeout=30) == 41
            future = Variable("future", client=other).get(timeout=10)
            assert future.result(timeout=30) == 14
            assert runs(done) == {7: 1}  # the worker's result, not run again
            other_queue = Queue("q", client=other)
            assert [other_queue.get(timeout=10), other_queue.get(timeout=10)] == [1, 2]
            assert Event("e", client=other).is_set()
            assert Semaphore(2, "s", client=other).get_value() == 1
            theirs = Lock("mine", client=other)
            assert not theirs.acquire(timeout=0)  # still held by the first client
            lock.release()  # which came back with it
            assert theirs.acquire(timeout=30)
            theirs.release()
            # the holder that did not come back loses its lock after the client grace
            assert Lock("theirs", client=other).acquire(timeout=60)
    finally:
        mine.close(timeout=2)
    sched.terminate()
    assert sched.wait(30) == 0
