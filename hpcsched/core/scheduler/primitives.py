"""Coordination primitives and datasets on the scheduler: ``Lock``, ``Semaphore``, ``Event``,
``Variable``, ``Queue``, ``MultiLock``, ``publish_dataset``.

Clients (a script's, or a worker's client used by tasks) send one op,
``primitive``, with ``kind`` (``lock``, ``semaphore``, ``event``, ``variable``,
``queue``, ``multilock``, ``dataset``), ``action``, ``name`` and a
``request_id``; each gets one ``control-reply``. Every field is checked
before anything changes: a malformed request raises
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

Runs on the scheduler's loop thread, like every server op.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from typing import Any

from hpcsched.core.protocol.calls import error_reply
from hpcsched.core.protocol.messages import ControlReply, Primitive
from hpcsched.core.state import events as ev

ACTIONS = {
    "lock": ("acquire", "release", "locked"),
    "semaphore": ("acquire", "release", "value"),
    "event": ("set", "clear", "wait", "is-set"),
    "variable": ("set", "get", "delete"),
    "queue": ("put", "get", "qsize"),
    "multilock": ("acquire", "release"),
    "dataset": ("publish", "get", "list", "unpublish"),
}
MAX_NAME = 1024  # characters of a name or lease id
MAX_VALUE = 256 * 2**20  # bytes of one stored value
MAX_KEYS = 100_000  # futures inside one value
MAX_NAMES = 10_000  # names of one multi-lock
MAX_LEASES = 2**31


def _name(msg: Primitive, field: str = "name") -> str:
    value = getattr(msg, field)
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise ev.MalformedMessage(f"primitive: {field} must be a string of 1 to {MAX_NAME} "
                                  f"characters")
    return value


def _int(msg: Primitive, field: str, low: int, high: int = MAX_LEASES) -> int:
    value = getattr(msg, field)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ev.MalformedMessage(f"primitive: {field} must be an integer in [{low}, {high}]")
    return value


def _timeout(msg: Primitive) -> float | None:
    value = msg.timeout
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) \
            or value < 0:
        raise ev.MalformedMessage("primitive: timeout must be None or a number >= 0")
    return float(value)


def _key_ok(key: Any) -> bool:
    if isinstance(key, tuple):
        return all(_key_ok(k) for k in key)
    return isinstance(key, (str, bytes, int, float)) and not isinstance(key, bool)


def _value(msg: Primitive) -> dict:
    """A stored value: ``{"blob": bytes, "keys": [future keys inside]}``."""
    blob, keys = msg.blob, [] if msg.keys is None else msg.keys
    if not isinstance(blob, bytes) or len(blob) > MAX_VALUE:
        raise ev.MalformedMessage(f"primitive: blob must be bytes of at most {MAX_VALUE}")
    if not isinstance(keys, list) or len(keys) > MAX_KEYS or not all(map(_key_ok, keys)):
        raise ev.MalformedMessage("primitive: keys must be a list of task keys")
    return {"blob": blob, "keys": keys}


class Waiter:
    """A request that waits (for a lease, an event, an item) until ``deadline``."""

    __slots__ = ("peer", "rid", "deadline", "data")

    def __init__(self, peer: str, rid: str, timeout: float | None, data: Any = None):
        self.peer, self.rid, self.data = peer, rid, data
        self.deadline = None if timeout is None else time.monotonic() + timeout


class Primitives:
    """The scheduler's side; ``handle`` is its one entry point, ``tick`` expires waits and
    ``peer_left`` ends what a departed client held."""

    def __init__(self, scheduler: Any):
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

    def _waiter(self, peer: str, rid: str, timeout: float | None, data: Any = None) -> Waiter:
        w = Waiter(peer, rid, timeout, data)
        if w.deadline is not None and (self._next_deadline is None or
                                       w.deadline < self._next_deadline):
            self._next_deadline = w.deadline
        return w

    # ------------------------------------------------------------ dispatch
    def handle(self, source: str, msg: Primitive) -> None:
        """Serve the decoded ``primitive`` request ``msg`` of peer ``source``; its kind's
        fields are checked here, before anything changes."""
        rid = msg.request_id
        if len(rid) > MAX_NAME:
            raise ev.MalformedMessage("primitive: request_id must be a string")
        kind, action = msg.kind, msg.action
        if kind not in ACTIONS or action not in ACTIONS[kind]:
            raise ev.MalformedMessage(f"primitive: unknown kind/action {kind!r}/{action!r}")
        name = _name(msg) if (kind, action) != ("dataset", "list") else ""
        if kind == "multilock" and action == "acquire":
            names = msg.names
            if not isinstance(names, list) or not 0 < len(names) <= MAX_NAMES or \
                    not all(isinstance(n, str) and 0 < len(n) <= MAX_NAME for n in names):
                raise ev.MalformedMessage("primitive: names must be a list of lock names")
        getattr(self, f"_{kind}")(source, rid, action, name, msg)

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
        tasks = self.scheduler.state.tasks
        missing = [k for k in stored["keys"] if k not in tasks]
        if missing:
            raise ValueError(f"futures {missing[:5]} are not known to the scheduler "
                             "(released or cancelled)")

    # ------------------------------------------------------------ lock, semaphore
    def _lock(self, peer: str, rid: str, action: str, name: str, msg: Primitive) -> None:
        self._semaphore(peer, rid, action, name, msg, kind="lock")

    def _semaphore(self, peer: str, rid: str, action: str, name: str, msg: Primitive,
                   kind: str = "semaphore") -> None:
        table = self.semaphores[kind]
        if action in ("locked", "value"):
            sem = table.get(name)
            n = len(sem["leases"]) if sem else 0
            self.reply(peer, rid, result=n > 0 if action == "locked" else n)
            return
        lease = _name(msg, "lease")
        if action == "release":
            sem = table.get(name)
            if sem is None or sem["leases"].get(lease) != peer:
                self.reply(peer, rid, result=False)
                return
            del sem["leases"][lease]
            self.reply(peer, rid, result=True)
            self._grant(table, name)
            return
        timeout = _timeout(msg)
        max_leases = _int(msg, "max_leases", 1) if kind == "semaphore" else 1
        sem = table.get(name)
        if sem is None:
            sem = table[name] = {"max": max_leases, "leases": {}, "waiters": deque()}
        elif sem["max"] != max_leases:
            self._error(peer, rid, ValueError(
                f"Inconsistent max leases: {sem['max']} (existing) vs {max_leases} for "
                f"semaphore {name!r}"))
            return
        if lease in sem["leases"]:
            raise ev.MalformedMessage(f"primitive: lease {lease!r} is already held")
        if len(sem["leases"]) < sem["max"] and not sem["waiters"]:
            sem["leases"][lease] = peer
            self.reply(peer, rid, result=True)
        elif timeout == 0:
            self.reply(peer, rid, result=False)
        else:
            sem["waiters"].append(self._waiter(peer, rid, timeout, lease))

    def _grant(self, table: dict, name: str) -> None:
        sem = table[name]
        while sem["waiters"] and len(sem["leases"]) < sem["max"]:
            w = sem["waiters"].popleft()
            sem["leases"][w.data] = w.peer
            self.reply(w.peer, w.rid, result=True)
        if not sem["leases"] and not sem["waiters"]:
            del table[name]

    # ------------------------------------------------------------ event
    def _event(self, peer: str, rid: str, action: str, name: str, msg: Primitive) -> None:
        e = self.events.get(name)
        if action == "is-set":
            self.reply(peer, rid, result=bool(e and e["set"]))
        elif action == "set":
            e = self.events.setdefault(name, {"set": False, "waiters": []})
            e["set"] = True
            for w in e["waiters"]:
                self.reply(w.peer, w.rid, result=True)
            e["waiters"] = []
            self.reply(peer, rid, result=None)
        elif action == "clear":
            if e is not None:
                e["set"] = False
                if not e["waiters"]:
                    del self.events[name]
            self.reply(peer, rid, result=None)
        else:
            timeout = _timeout(msg)
            if e is not None and e["set"]:
                self.reply(peer, rid, result=True)
            elif timeout == 0:
                self.reply(peer, rid, result=False)
            else:
                e = self.events.setdefault(name, {"set": False, "waiters": []})
                e["waiters"].append(self._waiter(peer, rid, timeout))

    # ------------------------------------------------------------ variable
    def _variable(self, peer: str, rid: str, action: str, name: str, msg: Primitive) -> None:
        var = self.variables.get(name)
        if action == "set":
            stored = _value(msg)
            try:
                self._check_keys(stored)
            except ValueError as e:
                self._error(peer, rid, e)
                return
            var = self.variables.setdefault(name, {"value": None, "waiters": []})
            self._hold(stored, "variable", name)
            old, var["value"] = var["value"], stored
            for w in var["waiters"]:
                self._give(w.peer, w.rid, stored)
            var["waiters"] = []
            self.reply(peer, rid, result=None)
            self._drop(old)
        elif action == "delete":
            if var is not None:
                self._drop(var["value"])
                var["value"] = None
                if not var["waiters"]:
                    del self.variables[name]
            self.reply(peer, rid, result=None)
        else:
            timeout = _timeout(msg)
            if var is not None and var["value"] is not None:
                self._give(peer, rid, var["value"])
            elif timeout == 0:
                self.reply(peer, rid, status="timeout")
            else:
                var = self.variables.setdefault(name, {"value": None, "waiters": []})
                var["waiters"].append(self._waiter(peer, rid, timeout))

    # ------------------------------------------------------------ queue
    def _queue(self, peer: str, rid: str, action: str, name: str, msg: Primitive) -> None:
        maxsize = _int(msg, "maxsize", 0)
        timeout = _timeout(msg)
        stored = _value(msg) if action == "put" else None
        batch = False if msg.batch is None else msg.batch
        if not (batch is True or batch is False or
                (isinstance(batch, int) and 0 < batch <= MAX_KEYS)):
            raise ev.MalformedMessage("primitive: batch must be a bool or a positive int")
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = {"maxsize": maxsize, "items": deque(),
                                     "getters": deque(), "putters": deque()}
        if action == "qsize":
            self.reply(peer, rid, result=len(q["items"]))
            return
        if stored is not None:
            try:
                self._check_keys(stored)
            except ValueError as e:
                self._error(peer, rid, e)
                return
            self._hold(stored, "queue", name)
            if q["maxsize"] and len(q["items"]) >= q["maxsize"]:
                if timeout == 0:
                    self._drop(stored)
                    self.reply(peer, rid, status="timeout")
                else:
                    q["putters"].append(self._waiter(peer, rid, timeout, stored))
                return
            q["items"].append(stored)
            self.reply(peer, rid, result=None)
        else:
            if batch is True:
                items = list(q["items"])
                q["items"].clear()
                self._give_items(peer, rid, items)
            elif q["getters"] or len(q["items"]) < (batch or 1):
                if timeout == 0:
                    self.reply(peer, rid, status="timeout")
                else:
                    q["getters"].append(self._waiter(peer, rid, timeout, batch or 0))
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
    def _multilock(self, peer: str, rid: str, action: str, name: str, msg: Primitive) -> None:
        """``name`` is the id of one MultiLock's acquisition; it waits in the queue of each
        of its lock names and holds those where it is first."""
        if action == "release":
            req = self.multi_requests.get(name)
            if req is None or req["peer"] != peer:
                self.reply(peer, rid, result=False)
                return
            self._multi_remove(name)
            self.reply(peer, rid, result=True)
            return
        if name in self.multi_requests:
            raise ev.MalformedMessage(f"primitive: multi-lock id {name!r} already in use")
        names = sorted(set(msg.names))
        n = msg.num_locks
        n = len(names) if n is None else _int(msg, "num_locks", 1, len(names))
        timeout = _timeout(msg)
        self.multi_requests[name] = {"names": names, "n": n, "peer": peer, "waiter": None}
        for lock in names:
            self.multilocks.setdefault(lock, []).append(name)
        if self._multi_granted(name):
            self.reply(peer, rid, result=True)
        elif timeout == 0:
            self._multi_remove(name)
            self.reply(peer, rid, result=False)
        else:
            self.multi_requests[name]["waiter"] = self._waiter(peer, rid, timeout)

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
    def _dataset(self, peer: str, rid: str, action: str, name: str, msg: Primitive) -> None:
        if action == "list":
            self.reply(peer, rid, result=sorted(self.datasets))
        elif action == "get":
            if name in self.datasets:
                self._give(peer, rid, self.datasets[name])
            else:
                self._error(peer, rid, KeyError(f"Dataset '{name}' not found"))
        elif action == "unpublish":
            self._drop(self.datasets.pop(name, None))
            self.reply(peer, rid, result=None)
        else:
            stored = _value(msg)
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
        deadlines = [w.deadline for holder, field in self._waiter_lists()
                     for w in holder[field] if w.deadline is not None]
        deadlines += [r["waiter"].deadline for r in self.multi_requests.values()
                      if r["waiter"] is not None and r["waiter"].deadline is not None]
        self._next_deadline = min(deadlines, default=None)

    def peer_left(self, peer: str) -> None:
        """A client left: its waits end, its leases and multi-locks are released."""
        for table in self.semaphores.values():
            for sem in table.values():
                for lease in [k for k, p in sem["leases"].items() if p == peer]:
                    del sem["leases"][lease]
        for lock_id in [i for i, r in self.multi_requests.items() if r["peer"] == peer]:
            if lock_id in self.multi_requests:
                self._multi_remove(lock_id)
        self._expire(lambda w: w.peer != peer)
