"""Checks of the per-task annotations hpcsched acts on (``dask.annotate``).

What peers send is checked where it is decoded: each field of each op is
defined once, with its check, in the records of :mod:`hpcsched.core.protocol.messages`,
and :func:`hpcsched.core.protocol.messages.decode` refuses a message with a
:class:`~hpcsched.core.protocol.wire.MalformedMessage` naming the op and the field.
An annotation is a value inside a field (``update-graph``'s ``annotations``,
name -> {key: value}); the client checks the ones hpcsched acts on before it
sends a graph, the scheduler again when it reads them.
Each annotation's value is checked with the field checks of
:mod:`hpcsched.core.protocol.checks`.

>>> annotation_problem("retries", 2) is None
True
>>> annotation_problem("retries", -1)
'expected an integer >= 0, got -1'
>>> annotation_problem("color", object()) is None  # not one hpcsched acts on
True
"""

from __future__ import annotations

from typing import Any

from hpcsched.core.protocol.checks import (
    Check,
    boolean,
    count,
    dict_of,
    int_in,
    list_of,
    number,
    positive_number,
    string,
    worker_ref,
)

#: per-task annotations hpcsched acts on (dask.annotate): what each value must be; the client
#: checks them before sending, the scheduler again on arrival
ANNOTATIONS: dict[str, Check] = {
    "retries": count,
    "priority": number,
    "resources": dict_of(number, keyed=string),
    "workers": list_of(worker_ref),
    "allow_other_workers": boolean,
    "checkpoint": boolean,  # keep the result in the scheduler's checkpoint directory
    "ranks": int_in(1, 1 << 20),  # worker slots it holds at once, on as many workers
    # seconds it is expected to run: kept off workers that leave sooner (placement.py)
    "duration": positive_number,
    "ranks_per_node": int_in(1, 1 << 20),  # of those, at most this many on one host
}


def annotation_problem(name: str, value: Any) -> str | None:
    """What is wrong with annotation ``name=value`` (None if fine, or not one we act on)."""
    check = ANNOTATIONS.get(name)
    return None if check is None else check(value)
