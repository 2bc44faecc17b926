"""How often a worker heartbeats, given the size of its cluster.

Over TCP a worker that dies with its host can leave its connection open: only the
missing heartbeats tell, and the scheduler removes a worker it has not heard from
for ``scheduler.worker-ttl`` seconds. Each heartbeat costs the scheduler a wake-up,
a decode and a handler, so a fixed interval makes an idle cluster's scheduler
busier the more workers it has. As dask.distributed's ``heartbeat_interval(n)``
does, the interval grows with the cluster so that the scheduler receives about
:data:`HEARTBEATS_PER_SECOND` heartbeats a second at most, whatever its size.

Two rules bound the growth:

* the TTL is the promise: the interval never exceeds ``worker_ttl /
  TTL_INTERVALS``, so a worker is declared dead only after missing several
  heartbeats in a row (a slow loop, a long pause of the collector), and a dead
  one is removed within ``worker_ttl`` whatever the cluster's size. Past
  ``HEARTBEATS_PER_SECOND x worker_ttl / TTL_INTERVALS`` workers the rate grows
  again: raise ``scheduler.worker-ttl`` to keep it down;
* the interval moves in powers of two of the configured one
  (``worker.heartbeat-interval``), so that a cluster growing one worker at a time
  changes it rarely: the scheduler tells each worker its interval when it
  registers, and again with the reply to a heartbeat when it changed.

    >>> heartbeat_interval(10, base=1.0, worker_ttl=30.0)
    1.0
    >>> heartbeat_interval(1000, base=1.0, worker_ttl=None)
    16.0
    >>> heartbeat_interval(1000, base=1.0, worker_ttl=30.0)  # 3 heartbeats per TTL
    10.0
    >>> heartbeat_interval(1000, base=1.0, worker_ttl=2.0)  # never below the base
    1.0
"""

from __future__ import annotations

#: heartbeats a second the scheduler is sized for, whatever the number of workers: each
#: costs it a wake-up, a read, a decode and a handler, which is all an idle scheduler does
HEARTBEATS_PER_SECOND = 100
#: the TTL spans at least this many heartbeat intervals (when the base interval allows):
#: a worker is removed only after missing two heartbeats in a row and most of a third
TTL_INTERVALS = 3


def heartbeat_interval(n_workers: int, base: float, worker_ttl: float | None) -> float:
    """Seconds between the heartbeats of each of ``n_workers`` workers (module docstring)."""
    interval = base
    while interval > 0 and n_workers > HEARTBEATS_PER_SECOND * interval:
        interval *= 2
    if worker_ttl:
        interval = min(interval, worker_ttl / TTL_INTERVALS)
    return max(interval, base)
