"""Adaptive scaling end to end: LocalCluster (worker processes), real SLURM, and the PBS
emulator holding jobs pending, each on both roads (``road``: a bulk map, or a task per
call).

The story of each test (:func:`tests.adaptive_harness.check_burst_and_retirement`): a
burst of work arrives -> workers (jobs) are requested and join; the work ends -> after
``wait_count`` intervals idle workers retire gracefully (their results move to a
survivor first); futures the user still holds keep their values -- a call that counts
its own executions in a file shows nothing was recomputed; the futures are released ->
the last worker retires and, on a batch system, no job of the cluster is left in the
queue.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from hpcsched.core.client.client import Client
from tests.adaptive_harness import (
    N_CALLS,
    PeakWorkers,
    check_burst_and_retirement,
    count_and_sleep,
    executions,
    log,
)
from tests.conftest import wait_until, worker_env


@pytest.mark.timeout(60)
def test_local_cluster_adapts_to_a_burst_and_retires_gracefully(road, tmp_path):
    from hpcsched.launchers.local_cluster import LocalCluster

    runs = tmp_path / "runs.txt"
    cluster = LocalCluster(n_workers=0, threads_per_worker=1, memory_limit="1GB",
                           worker_env=worker_env())
    try:
        adaptive = cluster.adapt(minimum=0, maximum=4, interval=0.2, wait_count=2,
                                 target_duration=0.5)
        assert cluster.adaptive is adaptive
        with Client(cluster, set_as_default=False) as client:
            check_burst_and_retirement(cluster, client, adaptive, road, runs, 0, 4, timeout=30)
            wait_until(lambda: not cluster.worker_processes, timeout=10,
                       what="worker processes to be stopped")
        print("\n".join(map(str, adaptive.log)))
    finally:
        cluster.close()
    assert not adaptive.running


# ---------------------------------------------------------------- batch systems
def squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                         timeout=30).stdout
    return {ln.strip().split("_")[0] for ln in out.splitlines() if ln.strip()}


def one_core_slurm_cluster(tmp_path):
    """A SLURMCluster of one-core, one-worker jobs whose workers import the tests."""
    from hpcsched.jobqueue.clusters import SLURMCluster

    return SLURMCluster(cores=1, memory="200MB", processes=1, walltime="00:10:00",
                        death_timeout=20, log_directory=str(tmp_path / "logs"),
                        job_script_prologue=[f"export PYTHONPATH={worker_env()['PYTHONPATH']}"])


@pytest.mark.slurm
@pytest.mark.timeout(110)
def test_slurm_cluster_adapts_and_its_jobs_leave_the_queue(slurm, fast_poll, road, tmp_path):
    runs = tmp_path / "runs.txt"
    cluster = one_core_slurm_cluster(tmp_path)
    ids: set[str] = set()
    try:
        adaptive = cluster.adapt(minimum=0, maximum=4, interval=0.3, wait_count=2,
                                 target_duration=0.5)
        with Client(cluster, set_as_default=False) as client:
            check_burst_and_retirement(cluster, client, adaptive, road, runs, 0, 4, timeout=60)
        ids = {j.split("_")[0] for j in cluster.jobs}
        assert 2 <= len(ids) <= 4, cluster.jobs
        wait_until(lambda: not ids & squeue_ids(), timeout=30,
                   what=f"jobs {sorted(ids)} to leave the SLURM queue")
        print("\n".join(map(str, adaptive.log)))
    finally:
        ids |= {j.split("_")[0] for j in getattr(cluster, "jobs", {})}
        cluster.close()
    wait_until(lambda: not ids & squeue_ids(), timeout=30, what="no job left after close")


@pytest.mark.slurm
@pytest.mark.timeout(150)
def test_slurm_cluster_grows_for_a_sweep_and_leaves_nothing_queued(slurm, fast_poll, road,
                                                                   tmp_path):
    """A sweep of 1,000 calls of 20 ms (20 s of work) on one job's worker: adaptive submits
    more jobs, each call runs once; after close no job of the cluster is left in squeue."""
    n = 1000
    runs = tmp_path / "runs.txt"
    cluster = one_core_slurm_cluster(tmp_path)
    ids: set[str] = set()
    try:
        adaptive = cluster.adapt(minimum=1, maximum=3, interval=0.3, wait_count=2,
                                 target_duration=0.5)
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=60)
            peak = PeakWorkers(cluster.scheduler)
            try:
                futures = road.calls(client, count_and_sleep, n, path=str(runs), delay=0.02)
                assert client.gather(futures, timeout=90) == [i * i for i in range(n)]
            finally:
                peak.detach()
            assert peak.peak >= 2, f"never grew past one worker: {log(adaptive)}"
            assert any(d.kind == "backlog" for d in adaptive.log), log(adaptive)
            assert executions(runs) == list(range(n))
        ids = {j.split("_")[0] for j in cluster.jobs}
        assert 2 <= len(ids) <= 3, cluster.jobs
        print("\n".join(log(adaptive)))
    finally:
        ids |= {j.split("_")[0] for j in getattr(cluster, "jobs", {})}
        cluster.close()
    wait_until(lambda: not ids & squeue_ids(), timeout=30, what="no job left after close")


@pytest.fixture
def pbs_hold(tmp_path, monkeypatch, fast_poll):
    """The PBS emulator on PATH with every job held pending until released."""
    from tests.jobqueue.emulators import cleanup, emulator_env

    state = tmp_path / "pbs-state"
    env = emulator_env("pbs", state)
    env["HPCSCHED_EMU_HOLD"] = "1"
    for k, v in env.items():
        if os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    yield state
    cleanup(state)


@pytest.mark.timeout(90)
def test_slow_queue_never_makes_adaptive_submit_more_than_maximum(pbs_hold, road, tmp_path):
    from hpcsched.jobqueue.clusters import PBSCluster
    from tests.jobqueue.emulators import live_processes, release

    runs = tmp_path / "runs.txt"
    cluster = PBSCluster(cores=1, memory="200MB", processes=1, walltime="00:10:00",
                         death_timeout=20, log_directory=str(tmp_path / "logs"),
                         job_script_prologue=[f"export PYTHONPATH={worker_env()['PYTHONPATH']}"])
    try:
        adaptive = cluster.adapt(minimum=0, maximum=4, interval=0.1, wait_count=2,
                                 target_duration=0.5)
        with Client(cluster, set_as_default=False) as client:
            futures = road.calls(client, count_and_sleep, N_CALLS, path=str(runs), delay=0.3)
            wait_until(lambda: cluster.jobs, timeout=10, what="a job submission")
            # 30 intervals with the queue not starting anything: the request stands
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                assert len(cluster.jobs) <= 1, cluster.jobs
                time.sleep(0.1)
            assert len(cluster.jobs) == 1 and not cluster.workers
            assert all(j.state.value == "pending" for j in cluster.jobs.values())
            # one request, then "already requested" -- the log shows no second submission
            assert [d.kind for d in adaptive.log if d.kind != "steady"] == \
                ["no-workers", "pending"], log(adaptive)
            # the queue starts moving: growth, but never beyond maximum jobs in all
            release(pbs_hold)
            assert client.gather(futures, timeout=60) == [i * i for i in range(N_CALLS)]
            assert 2 <= len(cluster.jobs) <= 4, cluster.jobs
            del futures
            wait_until(lambda: not cluster.workers and not any(
                j.active for j in cluster.jobs.values()), timeout=30,
                what="every worker to retire")
            assert len(cluster.jobs) <= 4
        print("\n".join(map(str, adaptive.log)))
    finally:
        cluster.close()
    wait_until(lambda: not live_processes(pbs_hold), timeout=15, what="no emulated job left")
