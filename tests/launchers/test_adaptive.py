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
