"""A worker's heartbeats (hpcsched.core.worker.parts.heartbeats), told as a story on a
clock the test moves: when a report is due, what it carries, and the lifetime's end. No
process, no thread."""

from __future__ import annotations

import pytest

from hpcsched.core.protocol.worker import Heartbeat, RetireMe
from hpcsched.core.worker.parts.heartbeats import EARLY, IDLE_REPORT_EVERY, Heartbeats

pytestmark = pytest.mark.timeout(30)


def kinds(records: list) -> list[str]:
    return [type(r).__name__ for r in records]


def test_over_tcp_every_interval_sends_a_heartbeat():
    hb = Heartbeats(2.0, needs_heartbeat=True, lifetime=None)
    hb.start(100.0)
    assert not hb.due(100.0 + 2.0 * EARLY - 0.01)  # registering said it is alive
    now = 100.0
    for n in range(1, 4):
        now += 2.0 * EARLY + 0.001
        assert hb.due(now) and not hb.due(now + 0.01)
        (beat,) = hb.reports("tcp://w:1", {"executing": n}, now)
        assert type(beat) is Heartbeat and beat.worker == "tcp://w:1"
        assert beat.metrics == {"executing": n}


def test_an_idle_rank_reports_once_then_only_news_or_every_tenth_interval():
    hb = Heartbeats(1.0, needs_heartbeat=False, lifetime=None)
    hb.start(0.0)
    assert kinds(hb.reports("mpi://1", {}, 1.0)) == ["Heartbeat"]  # the first is due
    silent = [hb.reports("mpi://1", {}, 1.0 + i) for i in range(1, IDLE_REPORT_EVERY)]
    assert silent == [[]] * (IDLE_REPORT_EVERY - 1)
    assert kinds(hb.reports("mpi://1", {}, 20.0)) == ["Heartbeat"]  # the tenth interval
    # news leaves at the end of its interval, whatever the count
    for news in ("bandwidth", "transfers", "logs"):
        assert kinds(hb.reports("mpi://1", {news: 1}, 21.0)) == ["Heartbeat"]
    assert hb.reports("mpi://1", {"memory": 5}, 22.0) == []  # memory alone is no news


def test_the_scheduler_shortens_the_interval_at_once_and_lengthens_it_from_the_next():
    hb = Heartbeats(10.0, needs_heartbeat=True, lifetime=None)
    hb.start(0.0)
    hb.set_interval(1.0, 2.0)  # the next heartbeat at most 1 s away
    assert hb.interval == 1.0
    assert not hb.due(2.0 + EARLY - 0.01) and hb.due(2.0 + EARLY)
    hb.set_interval(30.0, 3.0)  # longer: the heartbeat already planned stays
    assert hb.due(3.0 + EARLY)
    assert not hb.due(3.0 + 29.0 * EARLY) and hb.due(3.0 + EARLY + 30.0 * EARLY)
    hb.set_interval(0.0, 4.0)  # not an interval: ignored
    hb.set_interval(-1.0, 4.0)
    assert hb.interval == 30.0


def test_a_lifetime_asks_to_retire_once_it_is_up():
    hb = Heartbeats(1.0, needs_heartbeat=True, lifetime=5.0)
    hb.start(100.0)
    assert kinds(hb.reports("w", {}, 104.0)) == ["Heartbeat"]
    assert kinds(hb.reports("w", {}, 105.5)) == ["Heartbeat", "RetireMe"]
    later = hb.reports("w", {}, 110.0)
    assert not any(type(r) is RetireMe for r in later)  # asked once
