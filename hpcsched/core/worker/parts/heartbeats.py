"""A worker's heartbeats: when it reports to the scheduler, and when its lifetime is up.

Where the transport needs heartbeats (TCP), they are how the scheduler detects lost
workers: one every interval, which the scheduler lengthens as its cluster grows. Other
transports (an MPI rank that dies ends the job) report when there is news (a measured
bandwidth, transfers, logs), and otherwise only every :data:`IDLE_REPORT_EVERY`
intervals: idle ranks stay nearly silent, yet the dashboard's workers table keeps their
CPU and memory current.

``lifetime`` (a batch job's walltime, staggered so that the workers of one job do not
all leave at once, as dask's ``--lifetime-stagger``) makes the worker ask the scheduler
to retire it gracefully (``retire-me``) once it is up.

:class:`Heartbeats` is pure: the worker's loop passes the clock (``time.monotonic``)
and the metrics in, and sends the records it gets back.
"""

from __future__ import annotations

import logging
from typing import Any

from hpcsched.core.protocol.worker import Heartbeat, RetireMe

logger = logging.getLogger("hpcsched.worker")

IDLE_REPORT_EVERY = 10  # heartbeat intervals between reports of a worker without news
EARLY = 0.95  # of an interval: a heartbeat leaves this early, so that none arrives late


class Heartbeats:
    """When the worker at ``address`` reports (module docstring). ``needs_heartbeat``: the
    transport detects lost workers by their heartbeats.

    >>> hb = Heartbeats(1.0, needs_heartbeat=False, lifetime=None)
    >>> hb.start(100.0)
    >>> hb.due(100.5), hb.due(101.0)
    (False, True)
    >>> [type(r).__name__ for r in hb.reports("w", {}, 101.0)]  # the first is due at once
    ['Heartbeat']
    >>> hb.reports("w", {}, 102.0)  # then only news
    []
    """

    def __init__(self, interval: float, *, needs_heartbeat: bool, lifetime: float | None):
        self.interval = interval  # until the scheduler says otherwise
        self.needs_heartbeat = needs_heartbeat
        self.lifetime = lifetime
        self._next = 0.0
        self._started = 0.0
        self._quiet = IDLE_REPORT_EVERY  # intervals without a report: the first is due
        self._retire_asked = False

    def start(self, now: float) -> None:
        """Registering said the worker is alive: the first heartbeat is one interval away
        (nothing it would measure is worth delaying the first task for)."""
        self._started = now
        self._next = now + self.interval * EARLY

    def set_interval(self, interval: float, now: float) -> None:
        """Heartbeat every ``interval`` seconds, as the scheduler asks: the next one at most
        that far away (the scheduler's TTL counts from the last one it had)."""
        if interval > 0:
            self.interval = interval
            self._next = min(self._next, now + interval * EARLY)

    def due(self, now: float) -> bool:
        """Whether a heartbeat interval ended by ``now`` (the next one then begins)."""
        if now < self._next:
            return False
        self._next = now + self.interval * EARLY
        return True

    def reports(self, address: str, metrics: dict[str, Any], now: float) -> list:
        """What to send the scheduler at the end of an interval with ``metrics``."""
        out: list = []
        self._quiet += 1
        if (
            self.needs_heartbeat
            or "bandwidth" in metrics
            or "transfers" in metrics
            or "logs" in metrics
            or self._quiet >= IDLE_REPORT_EVERY
        ):
            self._quiet = 0
            out.append(Heartbeat(address, metrics))
        if self.lifetime and not self._retire_asked and now - self._started > self.lifetime:
            self._retire_asked = True
            logger.info("worker %s: lifetime of %.0fs is up, retiring", address, self.lifetime)
            out.append(RetireMe())
        return out
