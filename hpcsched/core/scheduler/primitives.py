"""Coordination primitives and datasets on the scheduler: ``Lock``, ``Semaphore``, ``Event``,
``Variable``, ``Queue``, ``MultiLock``, ``publish_dataset``.

Clients (a script's, or a worker's client used by tasks) send one record per
kind of primitive and action (:mod:`hpcsched.core.protocol.primitives`: ``LockAcquire``,
``QueuePut``, ...), each with a ``request_id``; each gets one ``control-reply``.
Every field is checked when the request is decoded, and what depends on the
state here (a lease already held, a multi-lock id in use) before anything
changes: a malformed request raises
:class:`~hpcsched.core.state.events.MalformedMessage`, which disconnects that peer
alone. A request that must wait (a lock held, an event not set, an empty
queue) is answered when it can be served, or with ``status="timeout"`` once
its ``timeout`` (seconds, checked on the scheduler's tick) has passed: the
scheduler alone decides, so a lease or an item is never granted to a waiter
that gave up.

State lives here, not in the client that made a primitive: values, queued
items, events and datasets outlive it, as in distributed. Leases (locks,
semaphores, multi-locks) and waits belong to the peer that took them and end
when it leaves. Values are cloudpickle blobs relayed without unpickling; the
futures inside one are listed in ``keys``, and held on the scheduler (as a
client of their own, ``<kind>:<name>:<n>``) while the value is stored, as
distributed does.

A journaled scheduler keeps what outlives a client here in its journal too
(:meth:`Primitives.durable`, written once per loop turn in which a request changed
something): variables' values, queued items, which events are set, the leases held
(locks, semaphores, multi-locks) and by whom. Restarted, it takes them up again
(:meth:`Primitives.restore`); a holder of a lease that does not come back within
``scheduler.journal-client-grace`` loses it, as a client that leaves does. Waits in
progress are not kept: their requests end with the connection.

Runs on the scheduler's loop thread, like every server op.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from typing import Any

from hpcsched.core.protocol import primitives as pp
from hpcsched.core.protocol.calls import error_reply
from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.messages import ControlReply
from hpcsched.core.scheduler.interfaces import ServerOps
from hpcsched.core.state import events as ev

logger = logging.getLogger("hpcsched.scheduler")

#: the journal section of the primitives' state
SECTION = "primitives"
#: the requests that only read: they change nothing a journal keeps
_READ_ONLY = (pp.LockLocked, pp.SemaphoreValue, pp.EventIsSet, pp.QueueSize, pp.DatasetList,
              pp.DatasetGet)


def _plain(stored: dict) -> dict:
    """A stored value as a journal keeps it (without the holder id of this process)."""
    return {"blob": stored["blob"], "keys": list(stored["keys"])}


def _stored(msg: pp.VariableSet | pp.QueuePut | pp.DatasetPublish) -> dict:
    """A value to store: ``{"blob": bytes, "keys": [future keys inside]}``."""
    return {"blob": msg.blob, "keys": list(msg.keys)}


class Waiter:
    """A request that waits (for a lease, an event, an item) until ``deadline``."""

    __slots__ = ("peer", "rid", "deadline", "data")

    def __init__(self, peer: str, rid: str, timeout: float | None, data: Any = None):
        self.peer, self.rid, self.data = peer, rid, data
        self.deadline = None if timeout is None else time.monotonic() + timeout


class Primitives:
    """The scheduler's side: ``handle`` serves a request (one handler per record type),
    ``tick`` expires waits and ``peer_left`` ends what a departed client held."""

    handlers = Handlers("the scheduler's primitives")

    def __init__(self, scheduler: ServerOps):
        self.scheduler = scheduler
        # lock and semaphore: name -> {"max": n, "leases": {lease: peer}, "waiters": deque}
        self.semaphores: dict[str, dict[str, dict]] = {"lock": {}, "semaphore": {}}
        self.events: dict[str, dict] = {}  # name -> {"set": bool, "waiters": [Waiter]}
        self.variables: dict[str, dict] = {}  # name -> {"value": stored | None, "waiters"}
        self.queues: dict[str, dict] = {}  # name -> {"maxsize", "items", "getters", "putters"}
        self.multilocks: dict[str, list[str]] = {}  # lock name -> lock ids, holder first
        self.multi_requests: dict[str, dict] = {}  # lock id -> {names, n, peer, waiter}
        self.datasets: dict[str, dict] = {}  # name -> stored value
        self._ids = itertools.count()
        self._next_deadline: float | None = None  # earliest deadline of a waiter, if any
        self._table = self.handlers.bind(self)
        #: a request changed what a journal keeps since :meth:`write_journal` last ran
        self.changed = False

    def _waiter(self, peer: str, rid: str, timeout: float | None, data: Any = None) -> Waiter:
        w = Waiter(peer, rid, timeout, data)
        if w.deadline is not None and (self._next_deadline is None or
                                       w.deadline < self._next_deadline):
            self._next_deadline = w.deadline
        return w

    # ------------------------------------------------------------ dispatch
    def handle(self, source: str, msg: Any) -> None:
        """Serve request ``msg`` (a record of :mod:`hpcsched.core.protocol.primitives`,
        decoded: its fields checked) of peer ``source``."""
        self._table[type(msg)](source, msg)
        if not isinstance(msg, _READ_ONLY):
            self.changed = True

    # ------------------------------------------------------------ the journal
    def durable(self) -> tuple[dict, list]:
        """(the state a restarted scheduler takes up again, the keys it holds)."""
        variables = {n: _plain(v["value"]) for n, v in self.variables.items()
                     if v["value"] is not None}
        queues = {n: {"maxsize": q["maxsize"], "items": [_plain(s) for s in q["items"]]}
                  for n, q in self.queues.items() if q["items"]}
        state: dict[str, Any] = {
            "variables": variables, "queues": queues,
            "events": sorted(n for n, e in self.events.items() if e["set"]),
            "leases": {kind: {n: {"max": sem["max"], "leases": dict(sem["leases"])}
                              for n, sem in table.items() if sem["leases"]}
                       for kind, table in self.semaphores.items()},
            "multilocks": {i: {"names": list(r["names"]), "n": r["n"], "peer": r["peer"]}
                           for i, r in self.multi_requests.items() if r["waiter"] is None},
        }
        keys = [k for v in variables.values() for k in v["keys"]]
        keys += [k for q in queues.values() for s in q["items"] for k in s["keys"]]
        return state, keys

    def write_journal(self, journal: Any) -> None:
        """Put :meth:`durable` in ``journal`` (it writes nothing when nothing changed)."""
        self.changed = False
        state, keys = self.durable()
        empty = not any(v for k, v in state.items() if k != "leases") and \
            not any(state["leases"].values())
        journal.set_section(SECTION, None if empty else state, keys)

    def restore(self, state: dict | None) -> set[str]:
        """Take up a journal's :meth:`durable` state (before any peer connects); returns
        the peers holding leases (they have the client grace to come back)."""
        if not state:
            return set()
        tasks = self.scheduler.state.tasks

        def held(stored: dict, kind: str, name: str) -> dict | None:
            missing = [k for k in stored["keys"] if k not in tasks]
            if missing:  # cannot happen with a journal that kept them live; said if it does
                logger.warning("journal: the %s %r holds futures %s the journal did not "
                               "keep: dropping it", kind, name, missing[:5])
                return None
            stored = dict(stored)
            self._hold(stored, kind, name)
            return stored

        for name, value in state.get("variables", {}).items():
            stored = held(value, "variable", name)
            if stored is not None:
                self.variables[name] = {"value": stored, "waiters": []}
        for name, q in state.get("queues", {}).items():
            items = [s for s in (held(v, "queue", name) for v in q["items"]) if s is not None]
            self.queues[name] = {"maxsize": q["maxsize"], "items": deque(items),
                                 "getters": deque(), "putters": deque()}
        for name in state.get("events", ()):
            self.events[name] = {"set": True, "waiters": []}
        holders: set[str] = set()
        for kind, table in state.get("leases", {}).items():
            for name, sem in table.items():
                self.semaphores[kind][name] = {"max": sem["max"], "leases": dict(sem["leases"]),
                                               "waiters": deque()}
                holders.update(sem["leases"].values())
        for lock_id, r in state.get("multilocks", {}).items():
            self.multi_requests[lock_id] = {**r, "waiter": None}
            for name in r["names"]:
                self.multilocks.setdefault(name, []).append(lock_id)
            holders.add(r["peer"])
        self.changed = False
        return holders

    def reply(self, to: str, rid: str, **fields: Any) -> None:
        """Answer request ``rid`` of peer ``to`` with a ``control-reply`` (``status`` OK unless
        given)."""
        fields.setdefault("status", "OK")
        self.scheduler.send(to, ControlReply(rid, **fields))

    def _error(self, to: str, rid: str, e: BaseException) -> None:
        self.scheduler.send(to, ControlReply(rid, **error_reply(e)))

    # ------------------------------------------------------------ futures held here
    def _hold(self, stored: dict, kind: str, name: str) -> None:
        """Keep the keys of ``stored`` alive while it is stored (a client of its own)."""
        if stored["keys"]:
            stored["holder"] = f"{kind}:{name}:{next(self._ids)}"
            self._state_event(ev.ClientDesiresKeys(stored["holder"], list(stored["keys"]), now=time.time()))

    def _drop(self, stored: dict | None) -> None:
        if stored and stored.get("holder"):
            self._state_event(ev.ClientReleasesKeys(stored["holder"], list(stored["keys"]), now=time.time()))

    def _give(self, peer: str, rid: str, stored: dict, **fields: Any) -> None:
        """Answer with ``stored``; its keys are wanted by ``peer`` from now on (before the
        stored copy may let them go), who then asks for their state itself."""
        self.reply(peer, rid, blob=stored["blob"], keys=stored["keys"], **fields)
        if stored["keys"]:
            self._state_event(ev.ClientDesiresKeys(peer, list(stored["keys"]), now=time.time()))

    def _state_event(self, event: Any) -> None:
        self.scheduler.handle_event(event, "primitive")

    def _check_keys(self, stored: dict) -> None:
        knows = self.scheduler.state.knows  # a bulk map's elements are futures too
        missing = [k for k in stored["keys"] if not knows(k)]
        if missing:
            raise ValueError(f"futures {missing[:5]} are not known to the scheduler "
                             "(released or cancelled)")

    # ------------------------------------------------------------ lock, semaphore
    @handlers.on(pp.LockAcquire)
    def _lock_acquire(self, peer: str, msg: pp.LockAcquire) -> None:
        self._acquire(self.semaphores["lock"], peer, msg, 1)

    @handlers.on(pp.SemaphoreAcquire)
    def _semaphore_acquire(self, peer: str, msg: pp.SemaphoreAcquire) -> None:
        self._acquire(self.semaphores["semaphore"], peer, msg, msg.max_leases)

    @handlers.on(pp.LockRelease)
    def _lock_release(self, peer: str, msg: pp.LockRelease) -> None:
        self._release(self.semaphores["lock"], peer, msg)

    @handlers.on(pp.SemaphoreRelease)
    def _semaphore_release(self, peer: str, msg: pp.SemaphoreRelease) -> None:
        self._release(self.semaphores["semaphore"], peer, msg)

    @handlers.on(pp.LockLocked)
    def _lock_locked(self, peer: str, msg: pp.LockLocked) -> None:
        sem = self.semaphores["lock"].get(msg.name)
        self.reply(peer, msg.request_id, result=bool(sem and sem["leases"]))

    @handlers.on(pp.SemaphoreValue)
    def _semaphore_value(self, peer: str, msg: pp.SemaphoreValue) -> None:
        sem = self.semaphores["semaphore"].get(msg.name)
        self.reply(peer, msg.request_id, result=len(sem["leases"]) if sem else 0)

    def _acquire(self, table: dict, peer: str, msg: pp.LockAcquire | pp.SemaphoreAcquire,
                 max_leases: int) -> None:
        name, rid, lease = msg.name, msg.request_id, msg.lease
        sem = table.get(name)
        if sem is None:
            sem = table[name] = {"max": max_leases, "leases": {}, "waiters": deque()}
        elif sem["max"] != max_leases:
            self._error(peer, rid, ValueError(
                f"Inconsistent max leases: {sem['max']} (existing) vs {max_leases} for "
                f"semaphore {name!r}"))
            return
        if lease in sem["leases"]:
            if sem["leases"][lease] == peer:
                # asked again by its holder: a request resent after a reconnect, whose
                # answer the scheduler's death (or the connection's) lost
                self.reply(peer, rid, result=True)
                return
            raise ev.MalformedMessage(f"{type(msg).__name__}: lease {lease!r} is already held")
        if len(sem["leases"]) < sem["max"] and not sem["waiters"]:
            sem["leases"][lease] = peer
            self.reply(peer, rid, result=True)
        elif msg.timeout == 0:
            self.reply(peer, rid, result=False)
        else:
            sem["waiters"].append(self._waiter(peer, rid, msg.timeout, lease))

    def _release(self, table: dict, peer: str, msg: pp.LockRelease | pp.SemaphoreRelease
                 ) -> None:
        sem = table.get(msg.name)
        if sem is None or sem["leases"].get(msg.lease) != peer:
            self.reply(peer, msg.request_id, result=False)
            return
        del sem["leases"][msg.lease]
        self.reply(peer, msg.request_id, result=True)
        self._grant(table, msg.name)

    def _grant(self, table: dict, name: str) -> None:
        sem = table[name]
        while sem["waiters"] and len(sem["leases"]) < sem["max"]:
            w = sem["waiters"].popleft()
            sem["leases"][w.data] = w.peer
            self.reply(w.peer, w.rid, result=True)
        if not sem["leases"] and not sem["waiters"]:
            del table[name]

    # ------------------------------------------------------------ event
    @handlers.on(pp.EventIsSet)
    def _event_is_set(self, peer: str, msg: pp.EventIsSet) -> None:
        e = self.events.get(msg.name)
        self.reply(peer, msg.request_id, result=bool(e and e["set"]))

    @handlers.on(pp.EventSet)
    def _event_set(self, peer: str, msg: pp.EventSet) -> None:
        e = self.events.setdefault(msg.name, {"set": False, "waiters": []})
        e["set"] = True
        for w in e["waiters"]:
            self.reply(w.peer, w.rid, result=True)
        e["waiters"] = []
        self.reply(peer, msg.request_id, result=None)

    @handlers.on(pp.EventClear)
    def _event_clear(self, peer: str, msg: pp.EventClear) -> None:
        e = self.events.get(msg.name)
        if e is not None:
            e["set"] = False
            if not e["waiters"]:
                del self.events[msg.name]
        self.reply(peer, msg.request_id, result=None)

    @handlers.on(pp.EventWait)
    def _event_wait(self, peer: str, msg: pp.EventWait) -> None:
        e = self.events.get(msg.name)
        if e is not None and e["set"]:
            self.reply(peer, msg.request_id, result=True)
        elif msg.timeout == 0:
            self.reply(peer, msg.request_id, result=False)
        else:
            e = self.events.setdefault(msg.name, {"set": False, "waiters": []})
            e["waiters"].append(self._waiter(peer, msg.request_id, msg.timeout))

    # ------------------------------------------------------------ variable
    @handlers.on(pp.VariableSet)
    def _variable_set(self, peer: str, msg: pp.VariableSet) -> None:
        name, stored = msg.name, _stored(msg)
        try:
            self._check_keys(stored)
        except ValueError as e:
            self._error(peer, msg.request_id, e)
            return
        var = self.variables.setdefault(name, {"value": None, "waiters": []})
        self._hold(stored, "variable", name)
        old, var["value"] = var["value"], stored
        for w in var["waiters"]:
            self._give(w.peer, w.rid, stored)
        var["waiters"] = []
        self.reply(peer, msg.request_id, result=None)
        self._drop(old)

    @handlers.on(pp.VariableDelete)
    def _variable_delete(self, peer: str, msg: pp.VariableDelete) -> None:
        var = self.variables.get(msg.name)
        if var is not None:
            self._drop(var["value"])
            var["value"] = None
            if not var["waiters"]:
                del self.variables[msg.name]
        self.reply(peer, msg.request_id, result=None)

    @handlers.on(pp.VariableGet)
    def _variable_get(self, peer: str, msg: pp.VariableGet) -> None:
        var = self.variables.get(msg.name)
        if var is not None and var["value"] is not None:
            self._give(peer, msg.request_id, var["value"])
        elif msg.timeout == 0:
            self.reply(peer, msg.request_id, status="timeout")
        else:
            var = self.variables.setdefault(msg.name, {"value": None, "waiters": []})
            var["waiters"].append(self._waiter(peer, msg.request_id, msg.timeout))

    # ------------------------------------------------------------ queue
    def _queue(self, msg: pp.QueuePut | pp.QueueGet | pp.QueueSize) -> dict:
        """The queue ``msg`` names, made with the request's ``maxsize`` if new."""
        q = self.queues.get(msg.name)
        if q is None:
            q = self.queues[msg.name] = {"maxsize": msg.maxsize, "items": deque(),
                                         "getters": deque(), "putters": deque()}
        return q

    @handlers.on(pp.QueueSize)
    def _queue_qsize(self, peer: str, msg: pp.QueueSize) -> None:
        self.reply(peer, msg.request_id, result=len(self._queue(msg)["items"]))

    @handlers.on(pp.QueuePut)
    def _queue_put(self, peer: str, msg: pp.QueuePut) -> None:
        q, rid, stored = self._queue(msg), msg.request_id, _stored(msg)
        try:
            self._check_keys(stored)
        except ValueError as e:
            self._error(peer, rid, e)
            return
        self._hold(stored, "queue", msg.name)
        if q["maxsize"] and len(q["items"]) >= q["maxsize"]:
            if msg.timeout == 0:
                self._drop(stored)
                self.reply(peer, rid, status="timeout")
            else:
                q["putters"].append(self._waiter(peer, rid, msg.timeout, stored))
            return
        q["items"].append(stored)
        self.reply(peer, rid, result=None)
        self._pump(q)

    @handlers.on(pp.QueueGet)
    def _queue_get(self, peer: str, msg: pp.QueueGet) -> None:
        q, rid, batch = self._queue(msg), msg.request_id, msg.batch
        if batch is True:
            items = list(q["items"])
            q["items"].clear()
            self._give_items(peer, rid, items)
        elif q["getters"] or len(q["items"]) < (batch or 1):
            if msg.timeout == 0:
                self.reply(peer, rid, status="timeout")
            else:
                q["getters"].append(self._waiter(peer, rid, msg.timeout, batch or 0))
        else:
            self._serve_getter(q, peer, rid, batch)
        self._pump(q)

    def _serve_getter(self, q: dict, peer: str, rid: str, batch: int) -> None:
        if batch:
            self._give_items(peer, rid, [q["items"].popleft() for _ in range(batch)])
        else:
            stored = q["items"].popleft()
            self._give(peer, rid, stored)
            self._drop(stored)

    def _give_items(self, peer: str, rid: str, items: list[dict]) -> None:
        keys = [k for s in items for k in s["keys"]]
        self.reply(peer, rid, items=[{"blob": s["blob"], "keys": s["keys"]} for s in items])
        if keys:
            self._state_event(ev.ClientDesiresKeys(peer, keys, now=time.time()))
        for s in items:
            self._drop(s)

    def _pump(self, q: dict) -> None:
        """Serve waiting getters and putters while the queue allows."""
        while True:
            if q["getters"] and len(q["items"]) >= (q["getters"][0].data or 1):
                w = q["getters"].popleft()
                self._serve_getter(q, w.peer, w.rid, w.data)
            elif q["putters"] and (not q["maxsize"] or len(q["items"]) < q["maxsize"]):
                w = q["putters"].popleft()
                q["items"].append(w.data)
                self.reply(w.peer, w.rid, result=None)
            else:
                return

    # ------------------------------------------------------------ multi-lock
    @handlers.on(pp.MultiLockRelease)
    def _multilock_release(self, peer: str, msg: pp.MultiLockRelease) -> None:
        req = self.multi_requests.get(msg.name)
        if req is None or req["peer"] != peer:
            self.reply(peer, msg.request_id, result=False)
            return
        self._multi_remove(msg.name)
        self.reply(peer, msg.request_id, result=True)

    @handlers.on(pp.MultiLockAcquire)
    def _multilock_acquire(self, peer: str, msg: pp.MultiLockAcquire) -> None:
        """``msg.name`` is the id of one MultiLock's acquisition; it waits in the queue of
        each of its lock names and holds those where it is first."""
        lock_id, rid = msg.name, msg.request_id
        req = self.multi_requests.get(lock_id)
        if req is not None and req["peer"] == peer and req["waiter"] is None:
            self.reply(peer, rid, result=True)  # held already: a request resent (see above)
            return
        if req is not None:
            raise ev.MalformedMessage(f"MultiLockAcquire: id {lock_id!r} already in use")
        names = sorted(set(msg.names))
        n = len(names) if msg.num_locks is None else msg.num_locks
        if n > len(names):
            raise ev.MalformedMessage(f"MultiLockAcquire: num_locks must be at most "
                                      f"{len(names)}, the number of names")
        self.multi_requests[lock_id] = {"names": names, "n": n, "peer": peer, "waiter": None}
        for lock in names:
            self.multilocks.setdefault(lock, []).append(lock_id)
        if self._multi_granted(lock_id):
            self.reply(peer, rid, result=True)
        elif msg.timeout == 0:
            self._multi_remove(lock_id)
            self.reply(peer, rid, result=False)
        else:
            self.multi_requests[lock_id]["waiter"] = self._waiter(peer, rid, msg.timeout)

    def _multi_granted(self, lock_id: str) -> bool:
        req = self.multi_requests[lock_id]
        held = [n for n in req["names"] if self.multilocks[n][0] == lock_id]
        if len(held) < req["n"]:
            return False
        for n in req["names"]:  # holds what it got: leaves the other queues
            if n not in held:
                self._multi_leave(n, lock_id)
        req["names"] = held
        return True

    def _multi_leave(self, lock: str, lock_id: str) -> None:
        ids = self.multilocks[lock]
        ids.remove(lock_id)
        if not ids:
            del self.multilocks[lock]

    def _multi_remove(self, lock_id: str) -> None:
        req = self.multi_requests.pop(lock_id)
        for n in req["names"]:
            self._multi_leave(n, lock_id)
        for other, r in list(self.multi_requests.items()):
            if r["waiter"] is not None and self._multi_granted(other):
                w, r["waiter"] = r["waiter"], None
                self.reply(w.peer, w.rid, result=True)

    # ------------------------------------------------------------ datasets
    @handlers.on(pp.DatasetList)
    def _dataset_list(self, peer: str, msg: pp.DatasetList) -> None:
        self.reply(peer, msg.request_id, result=sorted(self.datasets))

    @handlers.on(pp.DatasetGet)
    def _dataset_get(self, peer: str, msg: pp.DatasetGet) -> None:
        if msg.name in self.datasets:
            self._give(peer, msg.request_id, self.datasets[msg.name])
        else:
            self._error(peer, msg.request_id, KeyError(f"Dataset '{msg.name}' not found"))

    @handlers.on(pp.DatasetUnpublish)
    def _dataset_unpublish(self, peer: str, msg: pp.DatasetUnpublish) -> None:
        self._drop(self.datasets.pop(msg.name, None))
        self.reply(peer, msg.request_id, result=None)

    @handlers.on(pp.DatasetPublish)
    def _dataset_publish(self, peer: str, msg: pp.DatasetPublish) -> None:
        name, rid, stored = msg.name, msg.request_id, _stored(msg)
        if name in self.datasets and not msg.override:
            self._error(peer, rid, KeyError(f"Dataset {name} already exists"))
            return
        try:
            self._check_keys(stored)
        except ValueError as e:
            self._error(peer, rid, e)
            return
        self._hold(stored, "dataset", name)
        old, self.datasets[name] = self.datasets.get(name), stored
        self.reply(peer, rid, result=None)
        self._drop(old)

    # ------------------------------------------------------------ time and peers
    def _waiter_lists(self) -> list:
        out: list = []
        for table in self.semaphores.values():
            out += [(s, "waiters") for s in table.values()]
        out += [(e, "waiters") for e in self.events.values()]
        out += [(v, "waiters") for v in self.variables.values()]
        for q in self.queues.values():
            out += [(q, "getters"), (q, "putters")]
        return out

    def _expire(self, keep: Any) -> None:
        """Drop the waiters ``keep(w)`` rejects, answering each with a timeout."""
        for holder, field in self._waiter_lists():
            waiters = holder[field]
            if not waiters or all(keep(w) for w in waiters):
                continue
            kept = [w for w in waiters if keep(w)]
            for w in waiters:
                if not keep(w):
                    if field == "putters":
                        self._drop(w.data)
                    self.reply(w.peer, w.rid, status="timeout",
                               result=False if field == "waiters" else None)
            holder[field] = type(waiters)(kept)
        for lock_id, r in list(self.multi_requests.items()):
            w = r["waiter"]
            if w is not None and not keep(w) and lock_id in self.multi_requests:
                self._multi_remove(lock_id)
                self.reply(w.peer, w.rid, status="timeout", result=False)
        for table in self.semaphores.values():
            for name in list(table):
                if name in table:
                    self._grant(table, name)
        for q in self.queues.values():
            self._pump(q)

    def tick(self, now: float) -> None:
        """Answer the waiters whose timeout passed (a scan only when one may have)."""
        t = time.monotonic()
        if self._next_deadline is None or self._next_deadline > t:
            return
        self._expire(lambda w: w.deadline is None or w.deadline > t)
        self.changed = True  # a lease may have gone to a waiter
        deadlines = [w.deadline for holder, field in self._waiter_lists()
                     for w in holder[field] if w.deadline is not None]
        deadlines += [r["waiter"].deadline for r in self.multi_requests.values()
                      if r["waiter"] is not None and r["waiter"].deadline is not None]
        self._next_deadline = min(deadlines, default=None)

    def peer_left(self, peer: str) -> None:
        """A client left: its waits end, its leases and multi-locks are released."""
        self.changed = True
        for table in self.semaphores.values():
            for sem in table.values():
                for lease in [k for k, p in sem["leases"].items() if p == peer]:
                    del sem["leases"][lease]
        for lock_id in [i for i, r in self.multi_requests.items() if r["peer"] == peer]:
            if lock_id in self.multi_requests:
                self._multi_remove(lock_id)
        self._expire(lambda w: w.peer != peer)
