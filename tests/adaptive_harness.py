"""The story every adaptive cluster must tell, shared by the LocalCluster and batch-system
tests (``tests/launchers/test_adaptive.py``, ``tests/jobqueue/test_adaptive.py``).

A burst of calls arrives -> workers are requested and join; the calls end -> after
``wait_count`` intervals idle workers retire gracefully (their results move to a survivor
first); futures the user still holds keep their values -- each call appends its number to
a file, which shows nothing was recomputed; the futures are released -> the workers
above the minimum retire. The calls go by the ``road`` fixture (``tests/conftest.py``):
one bulk map, or one task per call.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import Road, wait_until

#: calls of a burst: above BULK_MAP_MIN, so that the bulk road is a bulk map
N_CALLS = 40


def count_and_sleep(i: int, path: str, delay: float = 0.5) -> int:
    """Append ``i`` to ``path`` (one line per execution), sleep, return ``i * i``."""
    with open(path, "a") as f:
        f.write(f"{i}\n")
    time.sleep(delay)
    return i * i


def executions(path: Path) -> list[int]:
    return sorted(int(x) for x in path.read_text().split()) if path.exists() else []


class PeakWorkers:
    """Counts connected workers through the scheduler's join/leave callback."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        self.now = len(scheduler.state.workers)
        self.peak = self.now
        self.joined = 0
        self.lock = threading.Lock()
        scheduler.add_worker_callback(self)

    def __call__(self, event: str, address: str, info: dict | None = None) -> None:
        with self.lock:
            self.now += 1 if event == "add" else -1
            self.joined += event == "add"
            self.peak = max(self.peak, self.now)

    def detach(self) -> None:
        self.scheduler.remove_worker_callback(self)


def log(adaptive: Any) -> list[str]:
    return list(map(str, adaptive.log))


def check_burst_and_retirement(cluster: Any, client: Any, adaptive: Any, road: Road,
                               runs: Path, minimum: int, maximum: int, timeout: float,
                               n: int = N_CALLS, delay: float = 0.3) -> None:
    """The shared story: burst, growth, shrink with data kept, release, shrink to
    ``minimum``."""
    peak = PeakWorkers(cluster.scheduler)
    try:
        futures = road.calls(client, count_and_sleep, n, path=str(runs), delay=delay)
        results = client.gather(futures, timeout=timeout)
        assert results == [i * i for i in range(n)]
        ups = [d for d in adaptive.log if d.action == "up"]
        assert ups, log(adaptive)
        if minimum == 0:
            assert ups[0].kind == "no-workers", log(adaptive)
        assert any(d.kind == "backlog" for d in ups), log(adaptive)
        assert peak.peak >= max(2, minimum + 1), f"never grew: {log(adaptive)}"
        assert all(d.target <= maximum for d in adaptive.log)

        # the work ended: idle workers retire, one stays with the results
        # (on a busy machine late workers may still be connecting when the work ends: what
        # must happen is that adaptive retires them, not merely that one is connected now)
        wait_until(lambda: len(cluster.workers) == max(minimum, 1)
                   and any(d.action == "down" for d in adaptive.log), timeout=timeout,
                   what="adaptive to retire all but one worker")
        downs = [i for i, d in enumerate(adaptive.log) if d.action == "down"]
        assert downs and adaptive.log[downs[0] - 1].kind == "idle-wait", \
            log(adaptive)  # hysteresis: recommended before acted upon
        if minimum <= 1:
            survivor = next(iter(cluster.workers.values()))
            assert survivor["n_keys"] == n, survivor
        assert client.gather(futures, timeout=30) == results
        assert executions(runs) == list(range(n)), "a result was recomputed"

        # the user lets go of the results: nothing holds the last worker any more
        del futures
        wait_until(lambda: len(cluster.workers) == minimum, timeout=timeout,
                   what=f"the workers above {minimum} to retire")
        assert peak.peak <= maximum
        assert executions(runs) == list(range(n))
    finally:
        peak.detach()
