"""How a peer introduces itself to the scheduler: one ``register-worker`` or
``register-client`` message, its first.

A connection's messages reach the scheduler's loop from the start, with a
:class:`Newcomer` as their source until the first one, the introduction, is
read there (no thread waits for it: a registration storm of thousands of
workers costs messages, not threads). A newcomer that has not introduced itself
within ``comm.timeouts.handshake`` is dropped. A peer whose first message is not
a registration, or whose registration is malformed or names a worker already
registered, is told why (``register-error``), and dropped; the scheduler never
handles its messages.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hpcsched.core.comm.base import Comm, CommClosedError
from hpcsched.core.protocol.messages import (
    INTRODUCTION,
    MalformedMessage,
    RegisterClient,
    RegisterError,
    RegisterWorker,
    decode,
    encode,
)
from hpcsched.core.state import events as ev

logger = logging.getLogger("hpcsched.scheduler")


class Newcomer:
    """A connected peer that has not introduced itself yet: the source of its messages
    until then. ``peer``: its id once accepted (messages already on their way with the
    newcomer as source are that peer's)."""

    __slots__ = ("comm", "deadline", "peer")

    def __init__(self, comm: Comm, timeout: float):
        self.comm = comm
        self.deadline = time.monotonic() + timeout
        self.peer: str | None = None

    def __repr__(self) -> str:
        return f"<Newcomer {self.comm.peer_address}>"


def read_introduction(comm: Comm, first: Any) -> tuple[str, RegisterWorker | RegisterClient] | None:
    """``(peer id, introduction)`` from ``first``, a peer's first message (or batch), or
    None (the peer was refused, its comm closed). Every field is checked here; the
    scheduler then accepts the peer, or refuses a worker whose name is taken."""
    msg = first[0] if isinstance(first, list) and first else first
    try:
        intro = decode(INTRODUCTION, msg)
    except MalformedMessage as e:
        refuse(comm, comm.peer_address, f"malformed registration: {e}")
        return None
    if isinstance(intro, RegisterClient):
        if not intro.client:
            logger.warning("dropping peer %s: empty client id", comm.peer_address)
            comm.close()
            return None
        return (intro.client, intro)
    if "://" not in intro.address:
        logger.warning("dropping worker %s: bad address %r", comm.peer_address, intro.address)
        comm.close()
        return None
    return (intro.address, intro)


def refuse(comm: Comm, peer: str, message: str) -> None:
    """Tell a peer why it may not join, then close its comm."""
    logger.warning("refusing peer %s: %s", peer, message)
    try:
        comm.send([encode(RegisterError(message))])
    except (CommClosedError, OSError):
        pass
    comm.close()


def add_worker_event(peer: str, msg: RegisterWorker, name: Any, now: float,
                     stimulus_id: str = "") -> ev.AddWorker:
    """The state's event for a worker's registration ``msg``, decoded (its fields checked)."""
    return ev.AddWorker(
        address=peer, nthreads=msg.nthreads, memory_limit=msg.memory_limit or 0,
        name=worker_name(name), host=msg.host, resources=dict(msg.resources or {}),
        keys=dict(msg.keys or {}), pid=msg.pid or 0, running=list(msg.running or ()),
        lifetime_end=msg.lifetime_end, gpus=list(msg.gpus or ()),
        resources_only=bool(msg.resources_only and msg.resources), job=msg.job, now=now,
        stimulus_id=stimulus_id)


def worker_name(name: Any) -> str | int:
    """A worker's name as given if it is a str or an int (dask-mpi names workers by their
    rank, and ``submit(..., workers=2)`` then means rank 2), else its text."""
    return name if isinstance(name, (str, int)) and not isinstance(name, bool) else str(name)


def short(x: Any) -> str:
    """``repr(x)``, cut at 200 characters (for log lines and error messages)."""
    r = repr(x)
    return r if len(r) < 200 else r[:197] + "..."
