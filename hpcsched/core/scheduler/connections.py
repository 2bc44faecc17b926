"""The scheduler's peers: their connections, by peer id, and those not introduced yet.

A transport accepts a connection on its own thread and hands it to
:meth:`Connections.on_connect`, which must not block: the connection's messages
go to the scheduler's loop from the start, with a
:class:`~hpcsched.core.scheduler.registration.Newcomer` as their source, and the
first is read there as the peer's introduction
(:meth:`Connections.introduction`, :mod:`.registration`). Once the server
accepts the peer (:meth:`Connections.accept`) its messages come with its id
(a worker's address, a client's id) as their source. A newcomer silent for
``comm.timeouts.handshake`` seconds is dropped (:meth:`Connections.expire`).

Runs on the scheduler's loop thread, except :meth:`Connections.on_connect`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hpcsched.core.comm.base import Comm
from hpcsched.core.comm.loop import CLOSED, Loop
from hpcsched.core.protocol import messages as pr
from hpcsched.core.scheduler.registration import Newcomer, read_introduction

logger = logging.getLogger("hpcsched.scheduler")

ARRIVED = object()  # payload of a newcomer's first item: it connected


class Connections:
    """Every peer's comm by peer id, which of them are workers, and the newcomers."""

    def __init__(self, loop: Loop, introduction_timeout: float):
        self._loop = loop
        self.introduction_timeout = introduction_timeout
        #: peer id (worker address / client id) -> comm
        self.comms: dict[str, Comm] = {}
        #: the peer ids of :attr:`comms` that are workers
        self.workers: set[str] = set()
        # connected peers yet to introduce themselves, oldest first
        self._newcomers: dict[Newcomer, None] = {}

    def on_connect(self, comm: Comm) -> None:
        """A transport accepted ``comm`` (on its thread): its messages go to the loop,
        where the first is read as its introduction."""
        newcomer = Newcomer(comm, self.introduction_timeout)
        self._loop.put((newcomer, ARRIVED))
        comm.deliver_to(self._loop, newcomer, CLOSED)

    def introduction(self, nc: Newcomer, payload: Any
                     ) -> tuple[str, pr.RegisterWorker | pr.RegisterClient, list] | None:
        """``(peer id, introduction, the messages after it)`` if ``payload``, an item from a
        newcomer not accepted yet, is its introduction (every field checked); else None:
        it only connected, left, was refused, or was dropped already."""
        if payload is ARRIVED:
            self._newcomers[nc] = None
            return None
        if self._newcomers.pop(nc, ARRIVED) is ARRIVED:
            return None  # dropped already (it took too long): what it sent after goes too
        if payload is CLOSED:
            logger.info("peer %s left before introducing itself", nc.comm.peer_address)
            return None
        intro = read_introduction(nc.comm, payload)
        if intro is None:
            return None
        rest = payload[1:] if isinstance(payload, list) else []
        return intro[0], intro[1], rest

    def expire(self) -> None:
        """Drop the newcomers that did not introduce themselves in time."""
        if not self._newcomers:
            return
        mono = time.monotonic()
        for nc in list(self._newcomers):  # oldest first: all share one timeout
            if nc.deadline > mono:
                return
            del self._newcomers[nc]
            logger.warning("peer %s did not introduce itself within %ss", nc.comm.peer_address,
                           self.introduction_timeout)
            nc.comm.close()

    def accept(self, peer: str, comm: Comm, worker: bool) -> None:
        """``peer`` is registered: its messages come to the loop with its id as source."""
        self.comms[peer] = comm
        if worker:
            self.workers.add(peer)
        comm.deliver_to(self._loop, peer, CLOSED)

    def drop(self, peer: str) -> bool:
        """Close ``peer``'s comm and forget it; whether it was a worker."""
        comm = self.comms.pop(peer, None)
        if comm is not None:
            comm.close()
        if peer in self.workers:
            self.workers.discard(peer)
            return True
        return False

    def lost(self, peer: str) -> None:
        """Sending to ``peer`` failed: its connection is gone (handled as its closing)."""
        self._loop.put((peer, CLOSED))

    def close(self) -> None:
        """Close every comm."""
        for comm in list(self.comms.values()):
            try:
                comm.close()
            except Exception:  # noqa: BLE001 - closing the rest matters more
                pass
        self.comms.clear()
