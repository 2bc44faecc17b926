"""Who sends what to whom: the tables of the protocol's directions, and the base of the
records that reach a state machine (see :mod:`hpcsched.core.protocol.messages`).

The records of :mod:`hpcsched.core.protocol.client` and
:mod:`hpcsched.core.protocol.worker` register themselves here, each in the directions it
travels. They live apart from both so that a worker process reads the worker's protocol
alone: every rank of an MPI job imports it at start, and the client's and the
primitives' hundred-odd records are no use to it until a task makes a client.
"""

from __future__ import annotations

from hpcsched.core.protocol.records import Record, context
from hpcsched.core.protocol.wire import Direction

CLIENT_TO_SCHEDULER = Direction("client", "scheduler", doc=(
    "Every field is checked on arrival: a client whose message is malformed gets an "
    "`error` and is disconnected; other peers are not affected."))
SCHEDULER_TO_CLIENT = Direction("scheduler", "client", checked=False)
WORKER_TO_SCHEDULER = Direction("worker", "scheduler", doc=(
    "Every field is checked on arrival: a worker whose message is malformed is told to "
    "`close` and removed; other peers are not affected."))
SCHEDULER_TO_WORKER = Direction("scheduler", "worker", checked=False)
WORKER_TO_WORKER = Direction("worker", "worker", checked=False, doc=(
    "A worker fetches the dependencies of its tasks from the workers holding them."))
C2S, S2C = CLIENT_TO_SCHEDULER, SCHEDULER_TO_CLIENT
W2S, S2W, W2W = WORKER_TO_SCHEDULER, SCHEDULER_TO_WORKER, WORKER_TO_WORKER
#: a peer's first message, read before the scheduler knows whether it is a worker or a
#: client (``register-worker``, ``register-client``; both are also in their sender's table)
INTRODUCTION = Direction("newcomer", "scheduler")


class Stimulus(Record, kw_only=True):
    """Base of the records that reach a state machine: the receiver notes when each
    arrived and names the event (``stimulus_id``, as distributed's state machines do), so
    that every state change can be traced to the message that caused it."""

    now: float = context(0.0)
    stimulus_id: str = context("")
