"""Adaptive scaling of a LocalCluster of worker processes, on both roads (``road``: one
bulk map, or a task per call): the calls waiting make it grow, their end makes it shrink
back to its minimum with every result kept and no call run twice.

The policy itself is tested without processes in ``test_adaptive_policy.py``; the same
story on batch systems in ``tests/jobqueue/test_adaptive.py``.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from hpcsched.core.client.client import Client
from tests.adaptive_harness import PeakWorkers, check_burst_and_retirement, executions, log
from tests.conftest import _local_cluster, wait_until
from tests.launchers.procs import hpcsched_cmd


@pytest.mark.timeout(90)
def test_one_worker_grows_for_waiting_calls_and_shrinks_back_keeping_results(road, tmp_path):
    """One worker of one thread and 40 calls of 0.3 s (12 s of work, over a target of
    0.5 s): adaptive asks for more, up to 3; once the calls are done it retires the idle
    ones, whose results move to the one that stays (none is computed twice)."""
    runs = tmp_path / "runs.txt"
    cluster = _local_cluster(n_workers=1, memory_limit="1GB")
    try:
        adaptive = cluster.adapt(minimum=1, maximum=3, interval=0.2, wait_count=2,
                                 target_duration=0.5)
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=60)
            check_burst_and_retirement(cluster, client, adaptive, road, runs, 1, 3,
                                       timeout=60)
        print("\n".join(map(str, adaptive.log)))
    finally:
        cluster.close()
    assert not adaptive.running


@pytest.mark.timeout(180)
def test_an_array_job_makes_it_grow_and_shrink_with_each_of_its_tasks_run_once(tmp_path):
    """An array job (``hpcsched submit --array``: 120 commands of 0.1 s, 12 s of work) on a
    LocalCluster adapting from no worker up to 3. Its futures are published, so each of
    its elements is a task run in the ranges given to the workers (the third road of a
    bulk map): they are work waiting as a plain map's elements are, and it grows on the
    backlog. ``hpcsched job wait`` exits 0, every command ran once (none rerun by a
    retirement, none lost), the workers beyond the one holding the job's results retire
    once it ended, and that one once the job is let go."""
    runs = tmp_path / "runs.txt"
    n = 120
    cluster = _local_cluster(n_workers=0)
    try:
        adaptive = cluster.adapt(minimum=0, maximum=3, interval=0.2, wait_count=2,
                                 target_duration=0.5)
        peak = PeakWorkers(cluster.scheduler)
        try:
            def hs(what: str, *args: str) -> subprocess.CompletedProcess:
                head = what.split()
                return subprocess.run(
                    [*hpcsched_cmd(), *head, "--address", cluster.scheduler_address, *args],
                    cwd=tmp_path, capture_output=True, text=True, timeout=120,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, "HPCSCHED_SECRET": cluster.security.secret_hex()})

            submitted = hs("submit", "--array", f"1-{n}", "--", "sh", "-c",
                           f"echo $HPCSCHED_TASK_ID >> {runs}; sleep 0.1")
            assert submitted.returncode == 0, submitted.stderr
            job = submitted.stdout.strip().rsplit(" ", 1)[-1]
            waited = hs("job wait", job)
            assert waited.returncode == 0, waited.stderr
            assert f"{n}/{n} finished" in waited.stderr
            assert executions(runs) == list(range(1, n + 1)), "a command ran twice, or never"
            ups = [d for d in adaptive.log if d.action == "up"]
            assert ups and ups[0].kind == "no-workers", log(adaptive)
            assert any(d.kind == "backlog" for d in ups), log(adaptive)
            assert peak.peak >= 2 and all(d.target <= 3 for d in adaptive.log), log(adaptive)

            with Client(cluster, set_as_default=False) as client:
                # the third road: the job's elements are tasks the scheduler knows by key
                tasks = client.run_on_scheduler(lambda dask_scheduler: sum(
                    k.startswith(f"hpcsched-job-{job}-") for k in dask_scheduler.state.tasks))
                assert tasks == n
                wait_until(lambda: len(cluster.workers) == 1
                           and any(d.action == "down" for d in adaptive.log), timeout=60,
                           what="adaptive to retire all but the worker holding the results")
                client.unpublish_dataset(f"hpcsched-job-{job}")
                wait_until(lambda: not cluster.workers, timeout=60,
                           what="the last worker to retire once the job is let go")
            assert executions(runs) == list(range(1, n + 1))
        finally:
            peak.detach()
        print("\n".join(log(adaptive)))
    finally:
        cluster.close()
    assert not adaptive.running


@pytest.mark.timeout(120)
def test_workers_a_replacement_covers_are_neither_capacity_nor_excess():
    """A batch cluster names the workers of jobs already replaced (they retire by
    themselves, hpcsched/jobqueue/succession.py): at maximum 1 with 2 workers connected,
    one of them leaving, adaptive retires nothing and counts 1 worker."""
    from hpcsched.launchers.adaptive import Adaptive
    from tests.conftest import _local_cluster

    with _local_cluster(n_workers=2) as cluster:
        cluster.wait_for_workers(2, timeout=60)
        names = sorted(str(w["name"]) for w in cluster.scheduler_info_workers().values())
        adaptive = Adaptive(cluster.scheduler, cluster, minimum=1, maximum=1, start=False)
        assert adaptive.recommendations().action == "down"  # 2 workers above maximum 1
        # as a JobQueueCluster does: the leaving worker's job is no longer requested
        cluster.leaving_workers = lambda: {names[0]}  # type: ignore[attr-defined]
        cluster._requested = lambda: 1  # type: ignore[method-assign]
        snap = adaptive.snapshot()
        assert [w.name for w in snap.running] == names[1:]
        assert adaptive.recommendations(snap).action == "none"
