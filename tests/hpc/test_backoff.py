"""Backoff: the delay sequence under a fake clock (nothing really sleeps)."""

from __future__ import annotations

import pytest

from hpcsched.core import config
from hpcsched.hpc.backoff import Backoff


class FakeTime:
    """A clock that advances only when ``sleep`` is called."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def make(t: FakeTime, **kw) -> Backoff:
    kw.setdefault("min", 0.001)
    kw.setdefault("fast_max", 0.008)
    kw.setdefault("max", 0.1)
    kw.setdefault("hold", 0.0)
    return Backoff(clock=t.clock, sleep=t.sleep, **kw)


def test_doubles_up_to_fast_max_during_fast_period():
    t = FakeTime()
    b = make(t)
    for _ in range(6):
        b.sleep()
    assert t.slept == [0.001, 0.002, 0.004, 0.008, 0.008, 0.008]


def test_after_fast_period_grows_to_max():
    t = FakeTime()
    b = make(t, fast_period=0.05)
    for _ in range(16):
        b.sleep()
    # fast phase: up to 0.008 until 0.05 s of idleness have passed (at t=0.055),
    # then doubling resumes up to max
    assert t.slept == [0.001, 0.002, 0.004] + [0.008] * 6 + [0.016, 0.032, 0.064] + [0.1] * 4


def test_reset_restarts_from_min_and_fast_cap():
    t = FakeTime()
    b = make(t, fast_period=0.05)
    for _ in range(20):
        b.sleep()
    assert b.delay == 0.1
    t.slept.clear()
    b.reset()
    for _ in range(5):
        b.sleep()
    assert t.slept == [0.001, 0.002, 0.004, 0.008, 0.008]


def test_idle_time_counts_from_reset_even_without_sleeping():
    # time spent busy (not in sleep) since reset also counts as idleness for the cap
    t = FakeTime()
    b = make(t, fast_period=1.0)
    b.reset()
    t.now += 2.0
    for _ in range(10):
        b.sleep()
    assert t.slept[-1] == 0.1


def test_hold_polls_at_min_then_doubles():
    t = FakeTime()
    b = make(t, hold=0.0035)
    for _ in range(8):
        b.sleep()
    # 0.001 until 3.5 ms have passed since the reset, then doubling
    assert t.slept == [0.001] * 4 + [0.002, 0.004, 0.008, 0.008]
    b.reset()
    t.slept.clear()
    b.sleep()
    b.sleep()
    assert t.slept == [0.001, 0.001]


def test_with_a_share_the_cap_grows_with_idleness():
    """share=1/4: after fast_max, no delay exceeds a quarter of the time idle before it,
    and the delays reach max in a handful of polls, not fast_period / fast_max of them."""
    t = FakeTime()
    b = make(t, share=0.25, fast_period=10.0)
    for _ in range(40):
        b.sleep()
    assert t.slept[:4] == [0.001, 0.002, 0.004, 0.008]  # doubling up to fast_max
    assert t.slept[-1] == 0.1  # then max, long before fast_period
    assert sorted(t.slept) == t.slept  # growing all along
    idle = 0.0
    for delay in t.slept:
        assert delay <= max(0.008, 0.25 * idle) + 1e-12
        idle += delay
    b2 = make(FakeTime(), share=0.25)
    polls = 0
    while b2.delay < 0.1:
        b2.sleep()
        polls += 1
    assert polls < 20


def test_defaults_come_from_config(monkeypatch):
    monkeypatch.setenv("HPCSCHED_MPI__POLL_MAX", "0.25")
    with config.set({"mpi.poll-min": 0.002, "mpi.poll-fast-max": 0.004, "mpi.poll-hold": 0.01}):
        b = Backoff(sleep=lambda s: None)
    assert (b.min, b.fast_max, b.max, b.hold) == (0.002, 0.004, 0.25, 0.01)
    # keyword arguments win over config
    with config.set({"mpi.poll-min": 0.002}):
        assert Backoff(min=0.0005, sleep=lambda s: None).min == 0.0005


@pytest.mark.parametrize(
    "kw",
    [dict(min=0, fast_max=1, max=2), dict(min=0.1, fast_max=0.01, max=1),
     dict(min=0.1, fast_max=1, max=0.5), dict(min=0.1, fast_max=1, max=2, fast_period=-1),
     dict(min=0.1, fast_max=1, max=2, hold=-1), dict(min=0.1, fast_max=1, max=2, share=0),
     dict(min=0.1, fast_max=1, max=2, share=2)],
)
def test_bad_parameters_raise(kw):
    # the Backoff's own check, or the setting's (a duration below 0 names its key)
    with pytest.raises(ValueError, match="Backoff|must be a finite duration"):
        Backoff(**kw)
