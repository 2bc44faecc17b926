"""Heartbeats at scale, as a story of events with a fake clock: the interval grows with
the cluster, each worker is told its own when it changes, and a silent worker is still
removed within ``worker_ttl`` (:mod:`hpcsched.core.state.liveness`)."""

from __future__ import annotations

import pytest

from hpcsched.core.protocol.messages import HeartbeatInterval
from hpcsched.core.state import events as ev
from hpcsched.core.state import liveness
from hpcsched.core.state.liveness import HEARTBEATS_PER_SECOND, TTL_INTERVALS, heartbeat_interval
from hpcsched.core.state.scheduler_state import SchedulerState


def addr(i: int) -> str:
    return f"tcp://w{i}"


@pytest.mark.parametrize("ttl", [None, 30.0, 300.0, 2.0])
@pytest.mark.parametrize("base", [0.5, 1.0])
def test_the_interval_grows_with_the_cluster_within_the_ttl(base, ttl):
    last = 0.0
    for n in [1, 10, 100, 199, 200, 201, 400, 1000, 2000, 5000, 20_000]:
        interval = heartbeat_interval(n, base, ttl)
        assert interval >= base and interval >= last  # never below the base; monotone
        last = interval
        if ttl is not None and ttl / TTL_INTERVALS >= base:
            assert interval <= ttl / TTL_INTERVALS  # several heartbeats in every TTL
        if ttl is None or n <= HEARTBEATS_PER_SECOND * ttl / TTL_INTERVALS:
            assert n / interval <= HEARTBEATS_PER_SECOND  # the scheduler's load is bounded
    # a small cluster keeps the configured interval
    assert heartbeat_interval(10, base, ttl) == base


def test_a_zero_base_interval_does_not_loop():
    assert heartbeat_interval(1000, 0.0, None) == 0.0


def state(**kw) -> SchedulerState:
    s = SchedulerState(work_stealing=False, **kw)
    s.validate()
    return s


def test_workers_are_told_the_interval_as_the_cluster_grows_and_shrinks():
    s = state(worker_ttl=30.0, heartbeat_interval=1.0)
    for i in range(10):
        s.handle(ev.AddWorker(addr(i), 1, now=0.0))
    assert s.workers[addr(0)].heartbeat_interval == 1.0
    told: dict[str, list] = {}
    for i in range(10, 1000):
        for m in s.handle(ev.AddWorker(addr(i), 1, now=1.0)):
            told.setdefault(m.to, []).append(m.msg.interval)
    s.validate()
    grown = heartbeat_interval(1000, 1.0, 30.0)
    assert grown > 1.0
    assert s.workers[addr(999)].heartbeat_interval == grown  # told when it registered
    # the others were told as the cluster outgrew each interval: at most once per doubling,
    # never an interval they had (a registration storm costs no heartbeat storm after it)
    assert told[addr(0)][-1] == grown and told[addr(0)] == sorted(set(told[addr(0)]))
    assert all(ws.heartbeat_interval == grown for ws in s.workers.values())
    assert sum(map(len, told.values())) <= 3 * 1000
    out = s.handle(ev.Heartbeat(addr(0), now=2.0))
    assert out == []
    assert s.handle(ev.Heartbeat(addr(0), now=2.0 + grown)) == []
    # the cluster shrinks: the next heartbeat brings the shorter interval
    for i in range(1, 1000):
        s.handle(ev.RemoveWorker(addr(i), "gone", now=3.0))
    out = s.handle(ev.Heartbeat(addr(0), now=4.0))
    assert [(m.to, m.msg) for m in out] == [(addr(0), HeartbeatInterval(1.0))]
    s.validate()


def test_a_silent_worker_among_a_thousand_is_removed_within_the_ttl():
    """A thousand workers heartbeat at the interval they were told; one falls silent. The
    scheduler receives HEARTBEATS_PER_SECOND heartbeats a second at most (on average),
    removes the silent worker within the TTL (plus one tick), and nobody else."""
    ttl, tick = 30.0, 0.5
    s = state(worker_ttl=ttl, heartbeat_interval=1.0)
    n = 1000
    for i in range(n):
        s.handle(ev.AddWorker(addr(i), 1, now=0.0))
    # each was told the interval of the cluster it joined, and again as the cluster grew
    interval = {a: ws.heartbeat_interval for a, ws in s.workers.items()}
    assert set(interval.values()) == {10.0}
    next_beat = {addr(i): (i % 97) / 97 * interval[addr(i)] for i in range(n)}
    silent, silent_from = addr(500), 10.0
    removed_at = None
    beats_per_second: dict[int, int] = {}
    now = 0.0
    while now < silent_from + 2 * ttl:
        now += tick
        for a, due in next_beat.items():
            if due <= now and a in s.workers and not (a == silent and now >= silent_from):
                for m in s.handle(ev.Heartbeat(a, now=now)):
                    interval[m.to] = m.msg.interval
                next_beat[a] = now + interval[a]
                beats_per_second[int(now)] = beats_per_second.get(int(now), 0) + 1
        s.handle(ev.Tick(now=now))
        if removed_at is None and silent not in s.workers:
            removed_at = now
    s.validate()
    assert set(interval.values()) == {10.0}
    assert set(s.workers) == {addr(i) for i in range(n)} - {silent}
    assert removed_at is not None
    assert removed_at - silent_from <= ttl + tick  # its last heartbeat was before silent_from
    steady = [beats_per_second.get(t, 0) for t in range(10, int(now))]
    assert sum(steady) / len(steady) <= HEARTBEATS_PER_SECOND


def test_the_rate_bound_follows_the_module_constant(monkeypatch):
    monkeypatch.setattr(liveness, "HEARTBEATS_PER_SECOND", 10)
    assert heartbeat_interval(4, 0.1, 2.0) == pytest.approx(0.4)
