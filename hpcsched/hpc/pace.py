"""How long the MPI progress thread of :mod:`hpcsched.hpc.mpi` naps between two polls.

MPI has no call that waits for a message without spinning a core, so the progress
thread polls and naps; each poll is a wake-up taken from the rank's other threads and
from the ranks sharing its cores. :class:`Pace` owns that decision, from what each turn
of the thread found; the endpoint owns the polling and the nap itself (a doorbell's
``select`` or an event's wait, ended early by a ring or a poke):

* **A peer on another node** rings no doorbell: the delay grows with idleness
  (:class:`~hpcsched.hpc.backoff.Backoff`'s share), so a reply is seen at most
  :data:`LATE_SHARE` of its wait late, up to ``mpi.poll-max``.
* **Every peer rings** (all on this node): between messages the rank polls only as a
  fallback, every ``mpi.doorbell-poll`` at first, up to ``mpi.poll-max`` during its
  first second of idleness, then up to ``mpi.doorbell-poll-max``: what no ring announces
  is a beat (seen in time if polled once a second; the nap ends at the next one due)
  and a lost ring, which correctness must not depend on. A ring that finds nothing (MPI
  does not show its message yet) is followed by a poll after ``mpi.doorbell-poll``.
* **A gang's member computes here** (:meth:`Pace.quiet`): the nap is ``mpi.gang-poll``
  (or to the next beat) on either road, since the slowest member sets the gang's pace
  (:mod:`hpcsched.hpc.gang`); a message from another node is then seen that late.
* Whatever the road, a message half received, a send pending or a poke (a thread of this
  rank sent a request and waits for the reply) makes the thread poll again at once.

The nap and the time to the next beat are injected, so the decisions are tested
without MPI and without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from hpcsched.core import config
from hpcsched.core.settings import MPISettings
from hpcsched.hpc.backoff import Backoff

LATE_SHARE = 1 / 32  # of its wait, at most, a message from another node is seen late


class Pace:
    """Naps between the polls of one progress thread: ``nap(seconds)`` sleeps (a ring may
    end it early), ``until_beat(seconds)`` shortens a nap to end when a beat is due;
    ``rung_by_all``: every other rank rings this one's doorbell when it sends."""

    def __init__(self, nap: Callable[[float], Any], until_beat: Callable[[float], float],
                 rung_by_all: bool, settings: MPISettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        settings = settings if settings is not None else config.read(MPISettings)
        self._nap = nap
        self._until_beat = until_beat
        self.backoff = Backoff(min=settings.poll_min, fast_max=settings.poll_fast_max,
                               max=settings.poll_max, hold=settings.poll_hold,
                               share=LATE_SHARE, clock=clock, sleep=nap)
        self.rung: Backoff | None = None
        if rung_by_all:
            every = float(settings.doorbell_poll)
            cap = max(every, self.backoff.max)
            self.rung = Backoff(min=every, fast_max=cap,
                                max=max(cap, float(settings.doorbell_poll_max)), hold=0,
                                clock=clock, sleep=lambda s: nap(until_beat(s)))
        self.gang_poll = float(settings.gang_poll)
        self._lock = threading.Lock()
        self._quiet = 0  # gang members computing on this rank

    def quiet(self, delta: int) -> None:
        """One gang member more (``+1``) or fewer (``-1``) computing on this rank."""
        with self._lock:
            self._quiet = max(0, self._quiet + delta)

    def turn(self, busy: bool, moving: bool, poked: bool, rung: bool) -> bool:
        """After a turn of polling: nap, or not. ``busy``: messages came or sends completed;
        ``moving``: a message is half received or a send pending; ``poked``: a request left
        this rank; ``rung``: the last nap ended with a ring. True when it polls again at
        once for traffic or a poke (the poke is then taken).

        >>> naps = []
        >>> pace = Pace(naps.append, lambda s: s, rung_by_all=False)
        >>> pace.quiet(1)
        >>> pace.turn(busy=False, moving=False, poked=False, rung=False), naps
        (False, [1.0])
        """
        every = self.rung
        if every is not None and not (moving or poked):
            # got everything that had arrived: nap at once (releasing Python's lock to the
            # thread just handed messages); the next ring wakes it
            if busy:
                self.backoff.reset()
            if busy or rung:
                every.reset()
                every.sleep()
            elif self._quiet:
                self._nap(self._until_beat(self.gang_poll))
            else:
                every.sleep()
            return False
        if busy or poked:
            self.backoff.reset()
            if every is not None:
                every.reset()
            return True
        if self._quiet and not moving:
            self._nap(self._until_beat(self.gang_poll))
        else:
            self.backoff.sleep()
        return False
