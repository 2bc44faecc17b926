"""The scheduler state's settings and their defaults, written once.

:class:`SchedulerSettings` holds the numbers :class:`~.scheduler_state.SchedulerState`
decides with; its defaults are the defaults of the ``scheduler.*`` keys of
:mod:`hpcsched.core.config`, which reads them from here. Values are already
parsed (bytes as an int, not ``"1 MiB"``): the server parses the configuration.

    >>> SchedulerSettings().queue_block_bytes
    1048576
    >>> SchedulerSettings(rootish_policy="round-robin")
    Traceback (most recent call last):
    ...
    ValueError: scheduler.rootish-policy must be queue, co-assign or mars, not 'round-robin'
"""

from __future__ import annotations

from dataclasses import dataclass

ROOTISH_POLICIES = ("queue", "co-assign", "mars")


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """What the scheduler state decides with (see ``scheduler.*`` in the configuration)."""

    #: a worker holds at most ceil(saturation x threads) tasks under queuing (inf: no queue)
    worker_saturation: float = 1.1
    #: queue | co-assign | mars (queue needs a finite saturation)
    rootish_policy: str = "queue"
    #: a TaskGroup larger than factor x the cluster's threads is root-ish ...
    rootish_factor: float = 2
    #: ... if it has fewer than this many distinct dependencies
    rootish_max_deps: int = 5
    #: queued root-ish tasks a worker takes as one run (:mod:`.blocks`); 1: off
    queue_block_size: int = 4
    #: ... of results at most (the group's mean result size), in bytes
    queue_block_bytes: int = 2**20
    #: workers a task may kill before it is marked erred
    allowed_failures: int = 3
    #: seconds a task is thought to take before anything of its group was measured
    unknown_task_duration: float = 0.5
    #: bytes/s between workers, before anything is measured
    bandwidth: float = 100e6
    work_stealing: bool = True
    #: seconds without a heartbeat before a worker is removed (None: never)
    worker_ttl: float | None = None
    #: seconds between a worker's heartbeats in a small cluster (``worker.heartbeat-interval``);
    #: it grows with the cluster, within the TTL (:mod:`.liveness`)
    heartbeat_interval: float = 1.0
    #: seconds a graceful retirement (or a rebalance) may take before it is forced
    retire_timeout: float = 120.0
    #: transitions kept in ``transition_log``, as distributed's ``low-level-log-length``
    transition_log_length: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rootish_policy not in ROOTISH_POLICIES:
            raise ValueError(f"scheduler.rootish-policy must be queue, co-assign or mars, "
                             f"not {self.rootish_policy!r}")
