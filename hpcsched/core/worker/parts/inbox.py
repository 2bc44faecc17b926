"""What a worker's loop handles: one small frozen record per kind of item.

Every item put on a worker's :class:`~hpcsched.core.comm.loop.Loop` is a record, and
the worker handles each by its type through one :class:`~hpcsched.core.protocol.dispatch.
Handlers` table, as it handles the scheduler's messages:

* the scheduler's batches (:class:`FromScheduler`) and the end of its comm
  (:class:`SchedulerGone`); a peer's batches (:class:`FromPeer`) and the end of a peer's
  comm (:class:`PeerGone`): what the transports deliver, made by :class:`CommInbox`;
* a reply made off the loop for the scheduler (:class:`ToScheduler`: ``Client.run``'s);
* a batch of finished elements of bulk maps (:class:`RangesDone`);
* the worker's own events for its state machine (a task's result, a transfer's, a
  secede), records of :mod:`hpcsched.core.state.events`, each made with a
  ``stimulus_id`` from :func:`stimulus`, as distributed's worker names its own
  stimuli ("Worker State Machine" in its documentation).

A transport hands a comm's messages over as ``(source, message)`` tuples
(:meth:`~hpcsched.core.comm.base.Comm.deliver_to`); :class:`CommInbox` is the inbox the
worker gives its comms (:meth:`CommInbox.take_from`), which puts the record of each on
the loop instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hpcsched.core.comm.base import Comm, Inbox
from hpcsched.core.comm.loop import CLOSED, Loop
from hpcsched.core.protocol.records import Record


class FromScheduler(Record):
    """A batch of the scheduler's messages, not decoded yet."""

    msgs: list


class SchedulerGone(Record):
    """The comm to the scheduler closed."""


class FromPeer(Record):
    """Messages from the peer at the other end of ``comm``, not decoded yet."""

    comm: Comm
    msgs: Any  # a list, or one message


class PeerGone(Record):
    """A comm to a peer closed."""

    comm: Comm


class ToScheduler(Record):
    """A protocol record made off the loop, to leave with the next batch to the scheduler."""

    record: Any


class RangesDone(Record):
    """A batch of finished elements of a bulk map (a ``ranges.Batch``), to store and
    report."""

    batch: Any


SCHEDULER_GONE = SchedulerGone()

_stimuli = itertools.count(1)


def stimulus(kind: str) -> str:
    """A ``stimulus_id`` for an event the worker makes itself, unique in the process:

    >>> stimulus("execute-success").startswith("execute-success-")
    True
    """
    return f"{kind}-{next(_stimuli)}"


class CommInbox(Inbox):
    """The inbox the worker's comms deliver to (:meth:`take_from`), one per worker: each
    ``(source, message)`` a transport hands over goes on ``loop`` as the source's record of
    the message, and the comm's end as the source's record of it. One inbox for every comm,
    as the loop itself was: a transport that gathers what one round brought for an inbox
    (TCP's I/O thread) still hands the loop the messages of all its peers at once, and an
    idle loop may still run them on the transport's thread."""

    __slots__ = ("loop", "any_thread")

    def __init__(self, loop: Loop):
        self.loop = loop
        self.any_thread = loop.any_thread

    def take_from(self, comm: Comm, make: Callable[[Any], Any], gone: Any) -> None:
        """Have ``comm`` deliver here: each message as ``make(message)``, its end as
        ``gone``."""
        comm.deliver_to(self, _Source(make, gone), CLOSED)

    def put(self, item: Any) -> None:
        source, msg = item
        self.loop.put(source.gone if msg is CLOSED else source.make(msg))

    def offer(self, item: Any) -> None:
        source, msg = item
        self.loop.offer(source.gone if msg is CLOSED else source.make(msg))

    def offer_batch(self, items: list) -> None:
        self.loop.offer_batch([s.gone if m is CLOSED else s.make(m) for s, m in items])


class _Source:
    """What a comm's deliveries become: ``make(message)``, and ``gone`` at its end."""

    __slots__ = ("make", "gone")

    def __init__(self, make: Callable[[Any], Any], gone: Any):
        self.make, self.gone = make, gone
