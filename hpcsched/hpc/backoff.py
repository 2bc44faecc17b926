"""Exponential back-off for polling loops, so an idle MPI rank uses ~0% CPU.

MPI offers no way to block on "a message arrived" without spinning a core
(MPICH's blocking calls busy-wait), so the MPI progress thread polls with
``Iprobe`` and sleeps between polls. :class:`Backoff` decides how long:

* after traffic (``reset()``) it polls every ``mpi.poll-min`` for ``hold``
  seconds (``mpi.poll-hold``): a reply to what was just sent usually comes
  soon. Without the hold, in a ping-pong each side's delay has grown by the
  time the reply comes, and the latency of every hop creeps up to the fast cap;
* each idle ``sleep()`` doubles the delay, capped at ``mpi.poll-fast-max``
  during the first ``fast_period`` seconds of idleness (a reply is usually
  near), then at ``mpi.poll-max`` (an idle rank polls a few dozen times a
  second);
* or, with ``share``, the cap grows with idleness itself: the delay is at most
  ``share`` of the time idle so far (and at least ``fast_max``, at most
  ``max``), so what is waited for arrives at most that share late, and the
  polls until the cap is reached number about ``ln(idle)/share`` instead of
  ``fast_period/fast_max`` (a hundred or two instead of a thousand after each
  message of a rank that no doorbell wakes).

The clock and the sleep function are injectable, so the sequence is tested
without sleeping. Example::

    >>> b = Backoff(min=0.001, fast_max=0.004, max=0.1, hold=0, sleep=lambda s: None)
    >>> [b.sleep() for _ in range(4)]
    [0.001, 0.002, 0.004, 0.004]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hpcsched.core import config
from hpcsched.core.settings import MPISettings


class Backoff:
    """Sleep ``delay`` then double it; caps grow with the length of idleness."""

    def __init__(
        self,
        min: float | None = None,  # noqa: A002 - the natural name, mirrors the config key
        fast_max: float | None = None,
        max: float | None = None,  # noqa: A002
        fast_period: float = 1.0,
        hold: float | None = None,
        share: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = time.sleep,
    ):
        settings = config.read(MPISettings, poll_min=min, poll_fast_max=fast_max,
                               poll_max=max, poll_hold=hold)
        self.min = float(settings.poll_min)
        self.fast_max = float(settings.poll_fast_max)
        self.max = float(settings.poll_max)
        self.fast_period = float(fast_period)
        self.hold = float(settings.poll_hold)
        if not 0 < self.min <= self.fast_max <= self.max:
            raise ValueError(
                "Backoff needs 0 < min <= fast_max <= max (config mpi.poll-min, "
                f"mpi.poll-fast-max, mpi.poll-max); got min={self.min}, "
                f"fast_max={self.fast_max}, max={self.max}"
            )
        self.share = share
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"Backoff share must be in (0, 1], got {share}")
        if self.fast_period < 0 or self.hold < 0:
            raise ValueError(f"Backoff fast_period and hold must be >= 0, got "
                             f"fast_period={self.fast_period}, hold={self.hold}")
        self._clock = clock
        self._sleep = sleep
        self.delay = self.min
        self._idle_since = clock()

    def reset(self) -> None:
        """Traffic seen: poll eagerly again."""
        self.delay = self.min
        self._idle_since = self._clock()

    def sleep(self) -> float:
        """Sleep the current delay, then double it (capped). Returns the delay slept."""
        slept = self.delay
        self._sleep(slept)
        idle = self._clock() - self._idle_since
        if idle < self.hold:
            self.delay = self.min
        elif self.share is not None:
            self.delay = min(self.delay * 2, self.max, max(self.fast_max, idle * self.share))
        else:
            self.delay = min(self.delay * 2, self.fast_max if idle < self.fast_period else self.max)
        return slept

    def __repr__(self) -> str:
        return (f"<Backoff delay={self.delay:g}s min={self.min:g} fast_max={self.fast_max:g} "
                f"max={self.max:g} fast_period={self.fast_period:g} hold={self.hold:g} "
                f"share={self.share}>")
