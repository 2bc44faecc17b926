"""The protocol of the coordination primitives and the published datasets: one record per
kind of primitive and action (see :mod:`hpcsched.core.protocol.messages`).

A client (a script's, or the client of a worker's tasks) asks the scheduler,
which holds every primitive by name (``Lock``, ``Semaphore``, ``Event``,
``Variable``, ``Queue``, ``MultiLock``, as distributed's, and the datasets of
``Client.publish_dataset``). Each request carries a ``request_id`` and is
answered by one ``control-reply``. Every field is checked on arrival, bounds
included: a name, a value or a list of names too large is refused before the
scheduler keeps anything of it. A request that may wait takes a ``timeout``
(seconds; None: no limit; 0: do not wait), which the scheduler enforces.

Values (a variable's, a queue item, a dataset) travel as a cloudpickle
``blob`` the scheduler relays without unpickling, with the ``keys`` of the
futures inside it, which the scheduler keeps alive while it stores the value.
"""

from __future__ import annotations

from hpcsched.core.protocol import checks as fc
from hpcsched.core.protocol.directions import C2S
from hpcsched.core.protocol.records import Record, wire
from hpcsched.core.protocol.wire import message

MAX_NAME = 1024  # characters of a name, a lease id or a request id
MAX_VALUE = 256 * 2**20  # bytes of one stored value
MAX_KEYS = 100_000  # futures inside one value; items of one batch
MAX_NAMES = 10_000  # names of one multi-lock
MAX_LEASES = 2**31  # a semaphore's size, a queue's size

# the checks of the fields most requests have
NAME = fc.text(MAX_NAME)
TIMEOUT = fc.optional(fc.seconds)
VALUE = fc.sized(fc.blob, MAX_VALUE)
KEYS = fc.sized(fc.keys, MAX_KEYS)


class PrimitiveRequest(Record):
    """Base of the requests to a named primitive."""

    request_id: str = wire(NAME)
    name: str = wire(NAME, doc="the primitive's name")


# ====================================================================== Lock

@message("lock-acquire", C2S)
class LockAcquire(PrimitiveRequest):
    """``Lock.acquire``: take the lock as ``lease``; answered ``result=True`` once held,
    ``False`` if ``timeout`` passed first."""

    lease: str = wire(NAME, doc="this holder's id")
    timeout: float | None = wire(TIMEOUT, None, sparse=True)


@message("lock-release", C2S)
class LockRelease(PrimitiveRequest):
    """``Lock.release``: give ``lease`` back; ``result`` says whether it was held."""

    lease: str = wire(NAME)


@message("lock-locked", C2S)
class LockLocked(PrimitiveRequest):
    """``Lock.locked``: ``result`` says whether anyone holds the lock."""


# ====================================================================== Semaphore

@message("semaphore-acquire", C2S)
class SemaphoreAcquire(PrimitiveRequest):
    """``Semaphore.acquire``: take a lease (at most ``max_leases`` are held at a time);
    answered ``result=True`` once taken, ``False`` if ``timeout`` passed first."""

    lease: str = wire(NAME, doc="this lease's id")
    max_leases: int = wire(fc.int_in(1, MAX_LEASES), doc="the semaphore's size")
    timeout: float | None = wire(TIMEOUT, None, sparse=True)


@message("semaphore-release", C2S)
class SemaphoreRelease(PrimitiveRequest):
    """``Semaphore.release``: give ``lease`` back; ``result`` says whether it was held."""

    lease: str = wire(NAME)


@message("semaphore-value", C2S)
class SemaphoreValue(PrimitiveRequest):
    """``Semaphore.get_value``: ``result`` is how many leases are held."""


# ====================================================================== Event

@message("event-set", C2S)
class EventSet(PrimitiveRequest):
    """``Event.set``: every waiter wakes up."""


@message("event-clear", C2S)
class EventClear(PrimitiveRequest):
    """``Event.clear``: later waiters wait."""


@message("event-wait", C2S)
class EventWait(PrimitiveRequest):
    """``Event.wait``: answered ``result=True`` once the event is set, ``False`` if
    ``timeout`` passed first."""

    timeout: float | None = wire(TIMEOUT, None, sparse=True)


@message("event-is-set", C2S)
class EventIsSet(PrimitiveRequest):
    """``Event.is_set``: ``result`` says whether the event is set."""


# ====================================================================== Variable

@message("variable-set", C2S)
class VariableSet(PrimitiveRequest):
    """``Variable.set``: store a value (its futures are kept alive while it is stored)."""

    blob: bytes = wire(VALUE, doc="the value, cloudpickled")
    keys: list = wire(KEYS, factory=list, sparse=True, doc="the futures' keys inside it")


@message("variable-get", C2S)
class VariableGet(PrimitiveRequest):
    """``Variable.get``: answered with the value (``blob``, ``keys``) once set,
    ``status="timeout"`` if ``timeout`` passed first."""

    timeout: float | None = wire(TIMEOUT, None, sparse=True)


@message("variable-delete", C2S)
class VariableDelete(PrimitiveRequest):
    """``Variable.delete``: forget the value."""


# ====================================================================== Queue

@message("queue-put", C2S)
class QueuePut(PrimitiveRequest):
    """``Queue.put``: append a value, waiting while the queue is full; ``status="timeout"``
    if ``timeout`` passed first."""

    maxsize: int = wire(fc.int_in(0, MAX_LEASES), doc="the queue's size (0: unbounded)")
    blob: bytes = wire(VALUE, doc="the value, cloudpickled")
    keys: list = wire(KEYS, factory=list, sparse=True, doc="the futures' keys inside it")
    timeout: float | None = wire(TIMEOUT, None, sparse=True)


@message("queue-get", C2S)
class QueueGet(PrimitiveRequest):
    """``Queue.get``: the oldest item (``blob``, ``keys``), or a batch of them (``items``);
    ``status="timeout"`` if ``timeout`` passed first."""

    maxsize: int = wire(fc.int_in(0, MAX_LEASES), doc="the queue's size (0: unbounded)")
    timeout: float | None = wire(TIMEOUT, None, sparse=True)
    batch: bool | int = wire(fc.one_of(fc.boolean, fc.int_in(1, MAX_KEYS)), False,
                             sparse=True, doc="this many items (True: all there are now)")


@message("queue-qsize", C2S)
class QueueSize(PrimitiveRequest):
    """``Queue.qsize``: ``result`` is how many items are in the queue."""

    maxsize: int = wire(fc.int_in(0, MAX_LEASES), doc="the queue's size (0: unbounded)")


# ====================================================================== MultiLock

@message("multilock-acquire", C2S)
class MultiLockAcquire(PrimitiveRequest):
    """``MultiLock.acquire``: acquisition ``name`` waits in line for each lock of ``names``
    and holds ``num_locks`` of them (all: None) once first in line for that many; answered
    ``result=True`` then, ``False`` if ``timeout`` passed first."""

    names: list = wire(fc.sized(fc.list_of(NAME), MAX_NAMES, 1), doc="the lock names")
    num_locks: int | None = wire(fc.optional(fc.int_in(1, MAX_NAMES)), None,
                                 doc="how many of `names` to hold (at most as many)")
    timeout: float | None = wire(TIMEOUT, None, sparse=True)


@message("multilock-release", C2S)
class MultiLockRelease(PrimitiveRequest):
    """``MultiLock.release``: acquisition ``name`` gives its locks back."""


# ====================================================================== datasets

@message("dataset-publish", C2S)
class DatasetPublish(PrimitiveRequest):
    """``Client.publish_dataset``: store a value under ``name`` until it is unpublished."""

    blob: bytes = wire(VALUE, doc="the value, cloudpickled")
    keys: list = wire(KEYS, factory=list, sparse=True, doc="the futures' keys inside it")
    override: bool = wire(fc.boolean, False, sparse=True,
                          doc="replace a dataset of that name (else it is an error)")


@message("dataset-get", C2S)
class DatasetGet(PrimitiveRequest):
    """``Client.get_dataset``: answered with the value (``blob``, ``keys``), or a
    ``KeyError``."""


@message("dataset-unpublish", C2S)
class DatasetUnpublish(PrimitiveRequest):
    """``Client.unpublish_dataset``: forget the dataset."""


@message("dataset-list", C2S)
class DatasetList(Record):
    """``Client.list_datasets``: ``result`` is the datasets' names."""

    request_id: str = wire(NAME)
