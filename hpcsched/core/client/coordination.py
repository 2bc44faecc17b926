"""Coordination primitives, with dask.distributed's names, signatures and meaning.

``Lock``, ``Semaphore``, ``Event``, ``Variable``, ``Queue``, ``MultiLock``
(https://distributed.dask.org/en/stable/api.html#coordination-primitives)::

    from hpcsched import Client, Event

    def waiter():
        return Event("go").wait(timeout=60)   # gives its thread back while it waits

    with Client() as client:
        f = client.submit(waiter)
        Event("go").set()
        assert f.result()

They live on the scheduler (:mod:`hpcsched.core.scheduler.primitives`), named by
``name`` (a fresh one if not given): two objects with the same name, in any
client or task, are the same primitive, and they pickle by name. Made
without a client, one uses :func:`~hpcsched.get_client` on first use: inside a
task, the worker's client. A task that waits on one gives its thread slot
back meanwhile (:func:`~hpcsched.secede`, then :func:`~hpcsched.rejoin`), so
waiting tasks never fill a worker. ``timeout`` is in seconds (or a string
such as ``"2s"``); the scheduler enforces it.

Values put in a ``Variable`` or ``Queue`` may be (or contain) futures: their
keys stay alive on the scheduler while stored there, and whoever gets the
value gets futures of its own client.
"""

from __future__ import annotations

import io
import pickle
import uuid
from typing import TYPE_CHECKING, Any

import cloudpickle

from hpcsched.core.client import worker_client
from hpcsched.core.client.futures import Future
from hpcsched.core.protocol import primitives as pp
from hpcsched.core.protocol.messages import ClientDesiresKeys, ControlReply
from hpcsched.core.protocol.serialize import SerializationError, loads_object
from hpcsched.core.units import parse_interval

if TYPE_CHECKING:
    from hpcsched.core.client.futures import FutureOwner as Client


# ------------------------------------------------------------------ values with futures
class _Pickler(cloudpickle.Pickler):
    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=5)
        self.keys: list = []

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is Future:
            self.keys.append(obj.key)
            return ("hpcsched-future", obj.key)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, client: Client) -> None:
        super().__init__(file)
        self.client = client

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "hpcsched-future":
            return Future(pid[1], self.client)
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def dumps_value(value: Any) -> dict:
    """``{"blob", "keys"}``: ``value`` pickled, the futures inside it kept as their keys."""
    buf = io.BytesIO()
    p = _Pickler(buf)
    try:
        p.dump(value)
    except Exception as e:
        raise SerializationError(f"cannot serialize {type(value).__name__}: {e}") from e
    return {"blob": buf.getvalue(), "keys": list(dict.fromkeys(p.keys))}


def loads_value(client: Client, blob: bytes, keys: list | None) -> Any:
    """A stored value, ``blob``, holding the futures of ``keys``.

    Its futures are bound to ``client``, which asks the scheduler for their state.
    """
    if not keys:
        return loads_object(blob)
    value = _Unpickler(io.BytesIO(blob), client).load()
    client.scheduler_comm.send(ClientDesiresKeys(client.id, list(keys)))
    return value


# ------------------------------------------------------------------ requests
def parse_timeout(timeout: Any) -> float | None:
    """A primitive's timeout in seconds (a number or a string such as ``"5s"``); <= 0: 0."""
    if timeout is None:
        return None
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout <= 0:
        return 0.0
    return parse_interval(timeout, "timeout")


def request(client: Client, record: Any, *, timeout: float | None = 0.0) -> ControlReply:
    """Send ``record`` to the scheduler's primitives; its reply, or the error it answered.

    ``record`` is one of :mod:`hpcsched.core.protocol.primitives`, its ``request_id``
    empty: the client gives it one. ``timeout``: how long the scheduler may make it wait (None: no limit); a request that
    may wait gives a task's thread slot back meanwhile."""
    # a task that seceded itself (worker_client) stays so: it rejoins when it chooses
    seceded = timeout != 0 and worker_client.in_task() and not worker_client.seceded()
    if seceded:
        worker_client.secede()
    try:
        reply = client.request(record)
    finally:
        if seceded:
            worker_client.rejoin()
    if reply.status == "error":
        exc = loads_object(reply.exception) if reply.exception else \
            RuntimeError(str(reply.traceback))
        raise exc
    return reply


class Primitive:
    """A named primitive on the scheduler; the client is found on first use."""

    def __init__(self, name: str | None = None, client: Client | None = None):
        self.name = name or uuid.uuid4().hex
        self._client = client

    @property
    def client(self) -> Client:
        """The client given, else (on first use) the default one or the task's worker's."""
        if self._client is None:
            self._client = worker_client.get_client()
        return self._client

    def _call(self, record: Any, timeout: float | None = 0.0) -> ControlReply:
        """Send ``record``, which may wait ``timeout`` seconds (None: no limit)."""
        return request(self.client, record, timeout=timeout)

    def __reduce__(self) -> Any:
        return (type(self), (self.name,))

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.name}>"


def _blocking_timeout(blocking: bool, timeout: Any) -> float | None:
    if not blocking:
        if timeout is not None:
            raise ValueError("can't specify a timeout for a non-blocking call")
        return 0.0
    return parse_timeout(timeout)


# ------------------------------------------------------------------ Semaphore, Lock
class Semaphore(Primitive):
    """At most ``max_leases`` holders at a time.

    ``acquire(timeout=None) -> bool``, ``release() -> bool``, ``get_value()`` (leases held
    now). Leases of a client that leaves are released."""

    def __init__(self, max_leases: int = 1, name: str | None = None,
                 scheduler_rpc: Any = None, loop: Any = None, client: Client | None = None):
        if not isinstance(max_leases, int) or isinstance(max_leases, bool) or max_leases < 1:
            raise ValueError(f"max_leases must be a positive integer, got {max_leases!r}")
        super().__init__(name, client)
        self.max_leases = max_leases
        self._leases: list[str] = []

    def acquire(self, timeout: Any = None) -> bool:
        """Take a lease, waiting at most ``timeout``; False if none came in time."""
        return self._acquire(parse_timeout(timeout))

    def _acquire(self, timeout: float | None) -> bool:
        lease = uuid.uuid4().hex
        reply = self._call(self._acquire_request(lease, timeout), timeout)
        if reply.result:
            self._leases.append(lease)
            return True
        return False

    def release(self) -> bool:
        """Give back the lease taken last (``RuntimeError`` if none is held)."""
        if not self._leases:
            raise RuntimeError("Released too often")
        lease = self._leases.pop()
        return bool(self._call(self._release_request(lease)).result)

    def _acquire_request(self, lease: str, timeout: float | None) -> Any:
        return pp.SemaphoreAcquire("", self.name, lease, self.max_leases, timeout)

    def _release_request(self, lease: str) -> Any:
        return pp.SemaphoreRelease("", self.name, lease)

    def get_value(self) -> int:
        """How many leases are held now."""
        return int(self._call(pp.SemaphoreValue("", self.name)).result)

    def __enter__(self) -> Semaphore:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __reduce__(self) -> Any:
        return (type(self), (self.max_leases, self.name))


class Lock(Semaphore):
    """A lock on the scheduler (a semaphore of one lease); a context manager.

    ``acquire(blocking=True, timeout=None) -> bool``, ``release()``, ``locked()``.
    Released if its holder's client leaves, as distributed's."""

    def __init__(self, name: str | None = None, client: Client | None = None,
                 scheduler_rpc: Any = None, loop: Any = None):
        super().__init__(1, name, client=client)

    def acquire(self, blocking: bool = True, timeout: Any = None) -> bool:  # type: ignore[override]
        """Take the lock (waiting at most ``timeout``; not at all if not ``blocking``)."""
        return self._acquire(_blocking_timeout(blocking, timeout))

    def release(self) -> None:  # type: ignore[override]
        """Release the lock (``RuntimeError`` if this object does not hold it)."""
        if not self._leases:
            raise RuntimeError("Lock is not yet acquired")
        super().release()

    def locked(self) -> bool:
        """Whether anyone holds the lock."""
        return bool(self._call(pp.LockLocked("", self.name)).result)

    def _acquire_request(self, lease: str, timeout: float | None) -> Any:
        return pp.LockAcquire("", self.name, lease, timeout)

    def _release_request(self, lease: str) -> Any:
        return pp.LockRelease("", self.name, lease)

    def __reduce__(self) -> Any:
        return (type(self), (self.name,))


# ------------------------------------------------------------------ Event
class Event(Primitive):
    """``set()``, ``clear()``, ``is_set()``, ``wait(timeout=None) -> bool``."""

    def set(self) -> None:
        """Set the event: every waiter wakes up."""
        self._call(pp.EventSet("", self.name))

    def clear(self) -> None:
        """Clear the event: later waiters wait."""
        self._call(pp.EventClear("", self.name))

    def is_set(self) -> bool:
        """Whether the event is set."""
        return bool(self._call(pp.EventIsSet("", self.name)).result)

    def wait(self, timeout: Any = None) -> bool:
        """Wait until the event is set; False if ``timeout`` passed first."""
        seconds = parse_timeout(timeout)
        return bool(self._call(pp.EventWait("", self.name, seconds), seconds).result)


# ------------------------------------------------------------------ Variable
class Variable(Primitive):
    """One value shared by name.

    ``set(value)``, ``get(timeout=None)`` (waits until set; ``TimeoutError`` when
    ``timeout`` passes first), ``delete()``."""

    def set(self, value: Any, timeout: Any = None) -> None:
        """Set the value (futures in it are kept alive by the scheduler)."""
        self._call(pp.VariableSet("", self.name, **dumps_value(value)))

    def get(self, timeout: Any = None) -> Any:
        """The value, once set (``TimeoutError`` after ``timeout``)."""
        seconds = parse_timeout(timeout)
        reply = self._call(pp.VariableGet("", self.name, seconds), seconds)
        if reply.status == "timeout":
            raise TimeoutError(f"Variable {self.name!r} was not set within {timeout}")
        return loads_value(self.client, reply.blob, reply.keys)

    def delete(self) -> None:
        """Delete the variable on the scheduler."""
        self._call(pp.VariableDelete("", self.name))


# ------------------------------------------------------------------ Queue
class Queue(Primitive):
    """A FIFO queue by name.

    ``put(value, timeout=None)`` (waits while ``maxsize`` items are in it),
    ``get(timeout=None, batch=False)`` (``batch=True``: every item there now; ``batch=n``:
    waits for ``n``), ``qsize()``. ``TimeoutError`` when a wait times out."""

    def __init__(self, name: str | None = None, client: Client | None = None, maxsize: int = 0):
        if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 0:
            raise ValueError(f"maxsize must be an integer >= 0, got {maxsize!r}")
        super().__init__(name, client)
        self.maxsize = maxsize

    def put(self, value: Any, timeout: Any = None) -> None:
        """Append ``value``, waiting while the queue is full (``TimeoutError`` after ``timeout``)."""
        seconds = parse_timeout(timeout)
        reply = self._call(pp.QueuePut("", self.name, self.maxsize, timeout=seconds,
                                       **dumps_value(value)), seconds)
        if reply.status == "timeout":
            raise TimeoutError(f"Queue {self.name!r} stayed full for {timeout}")

    def get(self, timeout: Any = None, batch: bool | int = False) -> Any:
        """Take the oldest item (or a batch, see the class), waiting at most ``timeout``."""
        if not (isinstance(batch, bool) or (isinstance(batch, int) and batch > 0)):
            raise ValueError(f"batch must be a bool or a positive integer, got {batch!r}")
        seconds = parse_timeout(timeout)
        reply = self._call(pp.QueueGet("", self.name, self.maxsize, seconds, batch),
                           0.0 if batch is True else seconds)
        if reply.status == "timeout":
            raise TimeoutError(f"nothing came in Queue {self.name!r} within {timeout}")
        if reply.items is not None:
            return [loads_value(self.client, item["blob"], item.get("keys"))
                    for item in reply.items]
        return loads_value(self.client, reply.blob, reply.keys)

    def qsize(self) -> int:
        """How many items are in the queue now."""
        return int(self._call(pp.QueueSize("", self.name, self.maxsize)).result)

    def __reduce__(self) -> Any:
        return (type(self), (self.name, None, self.maxsize))


# ------------------------------------------------------------------ MultiLock
class MultiLock(Primitive):
    """Several locks by name, taken together.

    ``acquire(blocking=True, timeout=None, num_locks=None) -> bool`` holds ``num_locks`` of
    them (all by default) once it is first in line for that many; ``release()``.
    Released if its client leaves."""

    def __init__(self, names: list[str] | None = None, client: Client | None = None):
        names = list(names or [])
        if not all(isinstance(n, str) for n in names):
            raise TypeError("MultiLock names must be strings")
        super().__init__(None, client)
        self.names = names
        self._held: str | None = None

    def acquire(self, blocking: bool = True, timeout: Any = None,
                num_locks: int | None = None) -> bool:
        """Hold ``num_locks`` of the locks (all by default) once first in line for them.

        False if ``timeout`` passed first (not waiting at all if not ``blocking``)."""
        if self._held is not None:
            raise RuntimeError("MultiLock is already acquired")
        if not self.names:
            return True
        lock_id = uuid.uuid4().hex
        seconds = _blocking_timeout(blocking, timeout)
        reply = self._call(pp.MultiLockAcquire("", lock_id, self.names, num_locks, seconds),
                           seconds)
        if reply.result:
            self._held = lock_id
            return True
        return False

    def release(self) -> None:
        """Release the locks held (``ValueError`` if none are)."""
        if not self.names:
            return
        if self._held is None:
            raise ValueError("Lock is not yet acquired")
        lock_id, self._held = self._held, None
        self._call(pp.MultiLockRelease("", lock_id))

    def __enter__(self) -> MultiLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __reduce__(self) -> Any:
        return (type(self), (self.names,))
