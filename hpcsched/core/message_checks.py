"""Checks of what peers send the scheduler: the type and range of every field, per op.

Every message from the network is untrusted until it passes here: the
scheduler calls :func:`check_scheduler_message` before a handler or the state
machine sees the message, so a wrong type (an unhashable key, ``keys=5``, a
negative ``nthreads``) is refused with :class:`~hpcsched.core.wire.MalformedMessage`
naming the op and the field, instead of failing half-way through a state change.

The checks are the protocol's: each table here (one per sender, op -> field ->
(check, required)) is read off the records of :mod:`hpcsched.core.protocol`,
where each field is defined once with its check (the functions of
:mod:`hpcsched.core.field_checks`, re-exported here). Fields a table does not
name are refused for state-machine ops (by :func:`hpcsched.core.events.from_message`)
and ignored for the ops the server answers itself. Deep checks that need the
scheduler's state (a graph's cycles, unknown dependencies) belong to the state
machine; these are the cheap ones.
"""

from __future__ import annotations

from typing import Any

from hpcsched.core import protocol
from hpcsched.core.field_checks import (  # noqa: F401 - the checks, as this module named them
    Check,
    anything,
    blob,
    boolean,
    count,
    dict_of,
    key,
    keys,
    list_of,
    mapping,
    number,
    optional,
    positive,
    serialized,
    short,
    string,
    worker_ref,
)
from hpcsched.core.wire import Direction, MalformedMessage

REQUIRED, OPTIONAL = True, False
Fields = dict[str, tuple[Check, bool]]


def fields_of(record: type) -> Fields:
    """``{field: (check, required)}`` of a protocol record's wire fields."""
    return {f.name: (f.check or anything, f.required) for f in protocol.spec(record).wire}


def _table(direction: Direction, introduction: str) -> dict[str, Fields]:
    return {op: fields_of(cls) for op, cls in direction.items() if op != introduction}


WORKER_MESSAGES: dict[str, Fields] = _table(protocol.WORKER_TO_SCHEDULER, "register-worker")
CLIENT_MESSAGES: dict[str, Fields] = _table(protocol.CLIENT_TO_SCHEDULER, "register-client")
REGISTER_WORKER: Fields = fields_of(protocol.RegisterWorker)


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
    hpcsched.core.wire.MalformedMessage: op 'client-desires-keys', field 'keys': \
contains something that is not a key: [1]
    """
    if not isinstance(msg, dict):
        raise MalformedMessage(f"expected an op dict, got {type(msg).__name__}")
    op = msg.get("op")
    if not isinstance(op, str):
        raise MalformedMessage(f"the op must be a string, got {short(op)}")
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

