"""The MPI progress thread's naps (:mod:`hpcsched.hpc.pace`), without MPI or sleeping:
each turn tells the pace what polling found, and the naps it takes are recorded."""

from __future__ import annotations

from itertools import accumulate

import pytest

from hpcsched.core.settings import MPISettings
from hpcsched.hpc.pace import Pace

SETTINGS = MPISettings(poll_min=1e-5, poll_fast_max=1e-3, poll_max=0.05, poll_hold=0.0,
                       doorbell_poll=0.002, doorbell_poll_max=1.0, gang_poll=1.0)


class Clock:
    def __init__(self):
        self.now = 0.0
        self.naps: list[float] = []

    def nap(self, seconds: float) -> None:
        self.naps.append(seconds)
        self.now += seconds


def pace(rung_by_all: bool, beat_in: float = 99.0) -> tuple[Pace, Clock]:
    clock = Clock()
    p = Pace(clock.nap, lambda s: min(s, beat_in), rung_by_all, SETTINGS,
             clock=lambda: clock.now)
    return p, clock


def idle(p: Pace, turns: int) -> None:
    for _ in range(turns):
        assert p.turn(busy=False, moving=False, poked=False, rung=False) is False


def test_an_idle_rank_every_peer_rings_polls_once_a_second_after_its_first():
    p, clock = pace(rung_by_all=True)
    idle(p, 40)
    assert clock.naps[0] == 0.002
    # the first second's naps reach mpi.poll-max and no more
    first = [n for n, t in zip(clock.naps, accumulate(clock.naps), strict=True)
             if t <= 1.0]
    assert max(first) == pytest.approx(0.05)
    assert clock.naps[-1] == pytest.approx(1.0)


def test_the_fallback_nap_ends_at_the_next_beat():
    p, clock = pace(rung_by_all=True, beat_in=0.3)
    idle(p, 40)
    assert max(clock.naps) == pytest.approx(0.3)


def test_a_ring_or_traffic_brings_the_fast_poll_back():
    p, clock = pace(rung_by_all=True)
    idle(p, 40)
    p.turn(busy=False, moving=False, poked=False, rung=True)
    assert clock.naps[-1] == 0.002
    idle(p, 40)
    p.turn(busy=True, moving=False, poked=False, rung=False)
    assert clock.naps[-1] == 0.002


@pytest.mark.parametrize("rung_by_all", [True, False])
def test_while_a_gang_member_computes_the_rank_naps_gang_poll_on_either_road(rung_by_all):
    # every peer ringing (one node) or not (peers on other nodes): the same naps
    p, clock = pace(rung_by_all)
    p.quiet(1)
    idle(p, 5)
    assert clock.naps == [1.0] * 5
    p.quiet(-1)
    idle(p, 1)
    assert clock.naps[-1] < 1.0


@pytest.mark.parametrize("rung_by_all", [True, False])
def test_what_is_half_received_sent_or_poked_is_polled_for_at_once(rung_by_all):
    p, clock = pace(rung_by_all)
    p.quiet(1)
    # a poke: poll again at once, and the caller takes the poke
    assert p.turn(busy=False, moving=False, poked=True, rung=False) is True
    assert clock.naps == []
    # a message half received: never the member's long nap
    p.turn(busy=False, moving=True, poked=False, rung=False)
    assert clock.naps[-1] < 0.05


def test_a_rank_some_peers_do_not_ring_backs_off_with_idleness_to_poll_max():
    p, clock = pace(rung_by_all=False)
    idle(p, 400)
    assert clock.naps[0] == pytest.approx(1e-5)
    assert max(clock.naps) == pytest.approx(0.05)
