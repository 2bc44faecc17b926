"""Adaptive scaling of a LocalCluster of worker processes, on both roads (``road``: one
bulk map, or a task per call): the calls waiting make it grow, their end makes it shrink
back to its minimum with every result kept and no call run twice.

The policy itself is tested without processes in ``test_adaptive_policy.py``; the same
story on batch systems in ``tests/jobqueue/test_adaptive.py``.
"""

from __future__ import annotations

import pytest

from hpcsched.core.client.client import Client
from tests.adaptive_harness import check_burst_and_retirement
from tests.conftest import _local_cluster


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
