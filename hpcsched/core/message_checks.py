"""Checks of what peers send the scheduler: the type and range of every field, per op.

Every message from the network is untrusted until it passes here: the
scheduler calls :func:`check_scheduler_message` before a handler or the state
machine sees the message, so a wrong type (an unhashable key, ``keys=5``, a
negative ``nthreads``) is refused with :class:`~hpcsched.core.events.MalformedMessage`
naming the op and the field, instead of failing half-way through a state change.

The checks are data (one table per sender, op -> field -> check) so that they
can be read as the protocol's description of the scheduler's inbound messages.
Deep checks that need the scheduler's state (a graph's cycles, unknown
dependencies) belong to the state machine; these are the cheap ones.

A key is what dask accepts as a key: a ``str``, ``bytes``, ``int`` or
``float``, or a tuple of keys (dask documents keys this way in its graph
specification).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hpcsched.core.events import MalformedMessage
from hpcsched.core.serialize import Serialized

Check = Callable[[Any], str | None]  # None if fine, else what is wrong
_MAX_KEY_DEPTH = 32


def _is_key(x: Any, depth: int = 0) -> bool:
    if isinstance(x, (str, bytes, int, float)):
        return True
    if isinstance(x, tuple) and depth < _MAX_KEY_DEPTH:
        return all(_is_key(y, depth + 1) for y in x)
    return False


def key(x: Any) -> str | None:
    return None if _is_key(x) else f"not a key (str, bytes, int, float or tuple): {_short(x)}"


def keys(x: Any) -> str | None:
    if not isinstance(x, (list, tuple)):
        return f"expected a list of keys, got {type(x).__name__}"
    for k in x:
        if not _is_key(k):
            return f"contains something that is not a key: {_short(k)}"
    return None


def string(x: Any) -> str | None:
    return None if isinstance(x, str) else f"expected a string, got {type(x).__name__}"


def worker_ref(x: Any) -> str | None:
    """A worker named by its address, its name, or its MPI rank (dask-mpi names workers by
    rank: ``submit(..., workers=2)``)."""
    if isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)):
        return None
    return f"expected a worker address, name or rank, got {_short(x)}"


def boolean(x: Any) -> str | None:
    return None if isinstance(x, bool) else f"expected true or false, got {_short(x)}"


def number(x: Any) -> str | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return None
    return f"expected a finite number, got {_short(x)}"


def count(x: Any) -> str | None:
    if isinstance(x, int) and not isinstance(x, bool) and x >= 0:
        return None
    return f"expected an integer >= 0, got {_short(x)}"


def positive(x: Any) -> str | None:
    if isinstance(x, int) and not isinstance(x, bool) and x > 0:
        return None
    return f"expected an integer > 0, got {_short(x)}"


def mapping(x: Any) -> str | None:
    return None if isinstance(x, dict) else f"expected a dict, got {type(x).__name__}"


def blob(x: Any) -> str | None:
    return None if isinstance(x, (bytes, bytearray)) else f"expected bytes, got {_short(x)}"


def serialized(x: Any) -> str | None:
    return None if isinstance(x, Serialized) else f"expected serialized data, got {_short(x)}"


def optional(check: Check) -> Check:
    def opt(x: Any) -> str | None:
        return None if x is None else check(x)
    return opt


def list_of(check: Check) -> Check:
    def lst(x: Any) -> str | None:
        if not isinstance(x, (list, tuple)):
            return f"expected a list, got {type(x).__name__}"
        for item in x:
            problem = check(item)
            if problem:
                return f"an item is wrong: {problem}"
        return None
    return lst


def dict_of(value: Check, keyed: Check = key) -> Check:
    def dct(x: Any) -> str | None:
        if not isinstance(x, dict):
            return f"expected a dict, got {type(x).__name__}"
        for k, v in x.items():
            problem = keyed(k) or value(v)
            if problem:
                return f"entry {_short(k)}: {problem}"
        return None
    return dct


def anything(x: Any) -> str | None:
    return None


def _task(x: Any) -> str | None:
    if not isinstance(x, dict):
        return f"a task must be a dict with run_spec and deps, got {type(x).__name__}"
    if "run_spec" not in x:
        return "a task has no run_spec"
    return keys(x.get("deps", ()))


# op -> {field: (check, required)}; fields not listed are refused for state-machine ops
# (events.from_message) and ignored for the ops the server answers itself
REQUIRED, OPTIONAL = True, False
WORKER_MESSAGES: dict[str, dict[str, tuple[Check, bool]]] = {
    "task-started": {"key": (key, REQUIRED)},
    "task-finished": {"key": (key, REQUIRED), "nbytes": (count, OPTIONAL),
                      "typename": (string, OPTIONAL), "start": (number, OPTIONAL),
                      "stop": (number, OPTIONAL)},
    "task-erred": {"key": (key, REQUIRED), "exception": (anything, OPTIONAL),
                   "traceback": (string, OPTIONAL), "exception_text": (string, OPTIONAL),
                   "start": (number, OPTIONAL), "stop": (number, OPTIONAL)},
    "missing-data": {"key": (key, REQUIRED), "errant_worker": (string, REQUIRED)},
    "long-running": {"key": (key, REQUIRED), "compute_duration": (number, OPTIONAL)},
    "result-erred": {"key": (key, REQUIRED), "exception": (anything, OPTIONAL),
                     "traceback": (string, OPTIONAL), "exception_text": (string, OPTIONAL)},
    "add-keys": {"keys": (dict_of(count), REQUIRED), "scatter_id": (optional(string), OPTIONAL)},
    "release-worker-data": {"keys": (keys, REQUIRED)},
    "steal-response": {"key": (key, REQUIRED), "state": (string, REQUIRED)},
    "heartbeat": {"metrics": (mapping, OPTIONAL)},
    "worker-status-change": {"status": (string, REQUIRED)},
    "run-reply": {"request_id": (optional(string), OPTIONAL), "status": (string, OPTIONAL),
                  "traceback": (anything, OPTIONAL)},
    "data-reply": {"request_id": (string, REQUIRED), "blob": (optional(serialized), OPTIONAL),
                   "missing": (optional(keys), OPTIONAL)},
    "retire-me": {},
}
CLIENT_MESSAGES: dict[str, dict[str, tuple[Check, bool]]] = {
    "update-graph": {
        "tasks": (dict_of(_task), REQUIRED), "keys": (keys, REQUIRED),
        "priority": (number, OPTIONAL), "retries": (dict_of(count), OPTIONAL),
        "resources": (optional(dict_of(number, keyed=string)), OPTIONAL),
        "workers": (optional(list_of(worker_ref)), OPTIONAL),
        "allow_other_workers": (boolean, OPTIONAL),
        "static_priorities": (optional(dict_of(number)), OPTIONAL),
        "annotations": (optional(dict_of(mapping, keyed=string)), OPTIONAL),
    },
    "client-desires-keys": {"keys": (keys, REQUIRED)},
    "client-releases-keys": {"keys": (keys, REQUIRED)},
    "cancel-keys": {"keys": (keys, REQUIRED)},
    "retry-keys": {"keys": (keys, REQUIRED)},
    "gather": {"request_id": (string, REQUIRED), "keys": (keys, REQUIRED)},
    "scatter": {"scatter_id": (string, REQUIRED), "data": (dict_of(serialized), REQUIRED),
                "nbytes": (dict_of(count), OPTIONAL),
                "workers": (optional(list_of(worker_ref)), OPTIONAL),
                "broadcast": (boolean, OPTIONAL)},
    "scheduler-info": {"request_id": (string, REQUIRED)},
    "retire-workers": {"request_id": (string, REQUIRED),
                       "workers": (optional(list_of(string)), OPTIONAL),
                       "names": (optional(list_of(anything)), OPTIONAL),
                       "n": (optional(count), OPTIONAL), "close": (boolean, OPTIONAL)},
    "close-client": {},
    "extension": {"extension": (string, REQUIRED), "request_id": (optional(string), OPTIONAL)},
    # cluster control (core/cluster_control.py checks its fields further as it reads them)
    "run": {"request_id": (string, REQUIRED), "function": (blob, REQUIRED),
            "args": (optional(blob), OPTIONAL), "kwargs": (optional(blob), OPTIONAL),
            "wait": (boolean, OPTIONAL), "workers": (optional(list_of(anything)), OPTIONAL)},
    "run-on-scheduler": {"request_id": (string, REQUIRED), "function": (blob, REQUIRED),
                         "args": (optional(blob), OPTIONAL),
                         "kwargs": (optional(blob), OPTIONAL)},
    "who-has": {"request_id": (string, REQUIRED), "keys": (optional(keys), OPTIONAL)},
    "has-what": {"request_id": (string, REQUIRED),
                 "workers": (optional(list_of(anything)), OPTIONAL)},
    "nthreads": {"request_id": (string, REQUIRED),
                 "workers": (optional(list_of(anything)), OPTIONAL)},
    "upload-file": {"request_id": (string, REQUIRED), "filename": (string, REQUIRED),
                    "data": (blob, REQUIRED), "load": (boolean, OPTIONAL)},
    "replicate": {"request_id": (string, REQUIRED), "keys": (keys, REQUIRED),
                  "n": (optional(positive), OPTIONAL),
                  "workers": (optional(list_of(anything)), OPTIONAL)},
    "rebalance": {"request_id": (string, REQUIRED), "keys": (optional(keys), OPTIONAL),
                  "workers": (optional(list_of(anything)), OPTIONAL)},
    "restart": {"request_id": (string, REQUIRED)},
    "register-plugin": {"request_id": (string, REQUIRED), "kind": (string, REQUIRED),
                        "name": (string, REQUIRED), "plugin": (blob, REQUIRED),
                        "idempotent": (boolean, OPTIONAL)},
    "unregister-plugin": {"request_id": (string, REQUIRED), "name": (string, REQUIRED)},
    # the envelope of a coordination primitive's request; each kind's own fields are
    # checked whole by hpcsched.core.primitives before anything changes
    "primitive": {"request_id": (string, REQUIRED), "kind": (string, REQUIRED),
                  "action": (string, REQUIRED)},
}
REGISTER_WORKER: dict[str, tuple[Check, bool]] = {
    "address": (string, REQUIRED), "nthreads": (positive, OPTIONAL),
    "memory_limit": (optional(count), OPTIONAL), "name": (anything, OPTIONAL),
    "host": (string, OPTIONAL), "resources": (optional(dict_of(number, keyed=string)), OPTIONAL),
    "keys": (optional(dict_of(count)), OPTIONAL), "pid": (optional(count), OPTIONAL),
}


#: per-task annotations hpcsched acts on (dask.annotate): what each value must be; the client
#: checks them before sending, the scheduler again on arrival
ANNOTATIONS: dict[str, Check] = {
    "retries": count,
    "priority": number,
    "resources": dict_of(number, keyed=string),
    "workers": list_of(worker_ref),
    "allow_other_workers": boolean,
}


def annotation_problem(name: str, value: Any) -> str | None:
    """What is wrong with annotation ``name=value`` (None if fine, or not one we act on)."""
    check = ANNOTATIONS.get(name)
    return None if check is None else check(value)


def check_fields(op: str, msg: dict, fields: dict[str, tuple[Check, bool]]) -> None:
    for name, (check, required) in fields.items():
        if name not in msg:
            if required:
                raise MalformedMessage(f"op {op!r} lacks the field {name!r}")
            continue
        problem = check(msg[name])
        if problem:
            raise MalformedMessage(f"op {op!r}, field {name!r}: {problem}")


def check_scheduler_message(msg: Any, sender: str) -> str:
    """Refuse ``msg`` from a ``sender`` (``"worker"`` or ``"client"``) unless it is a
    known op with well-typed fields; returns the op.

    >>> check_scheduler_message({"op": "cancel-keys", "keys": ["x", ("y", 0)]}, "client")
    'cancel-keys'
    >>> check_scheduler_message({"op": "client-desires-keys", "keys": [[1]]}, "client")
    Traceback (most recent call last):
    ...
    hpcsched.core.events.MalformedMessage: op 'client-desires-keys', field 'keys': \
contains something that is not a key: [1]
    """
    if not isinstance(msg, dict):
        raise MalformedMessage(f"expected an op dict, got {type(msg).__name__}")
    op = msg.get("op")
    if not isinstance(op, str):
        raise MalformedMessage(f"the op must be a string, got {_short(op)}")
    table = WORKER_MESSAGES if sender == "worker" else CLIENT_MESSAGES
    fields = table.get(op)
    if fields is None:
        raise MalformedMessage(f"op {op!r} is not a {sender}'s op")
    check_fields(op, msg, fields)
    return op


def check_registration(msg: dict) -> None:
    """The ``register-worker`` introduction (the scheduler checks ``register-client``'s
    one field, the client id, when it reads it)."""
    check_fields("register-worker", msg, REGISTER_WORKER)


def _short(x: Any) -> str:
    try:
        r = repr(x)
    except Exception:  # a hostile __repr__
        r = f"<{type(x).__name__}>"
    return r if len(r) <= 80 else r[:77] + "..."
