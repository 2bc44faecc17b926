"""What a worker runs for a task: its :class:`RunSpec`, as the client serialized it.

A client sends each task of an ``update-graph`` as ``{"run_spec": RunSpec(...), "deps":
[...]}``; the scheduler keeps the spec without reading it (but for checkpoints) and hands
it to the worker in ``compute-task``; the worker runs it
(:func:`~hpcsched.core.worker.execution.run_spec_call`). The scheduler checks that each
task's spec is a ``RunSpec`` as it decodes the message (:func:`task`), so a malformed one
is refused there, naming the op and the field, not found out on a worker.

>>> task({"run_spec": RunSpec(b"f", None), "deps": []}) is None
True
>>> task({"run_spec": (b"f", None, False), "deps": []})
'run_spec must be a RunSpec, got tuple'
>>> task({"run_spec": RunSpec(b"f", None), "deps": [("x", 1), {"no": "key"}]})
"contains something that is not a key: {'no': 'key'}"
"""

from __future__ import annotations

from typing import Any

from hpcsched.core.protocol import checks
from hpcsched.core.protocol.records import Record

# Neither record can be part of a reference cycle (bytes, a bool, a path and a task's key),
# so the cyclic garbage collector need not track them (msgspec's ``gc=False``,
# https://jcristharif.com/msgspec/structs.html#disabling-garbage-collection-advanced):
# a client makes one run spec per task it submits and the scheduler keeps each until the
# task is forgotten: untracked, they add nothing to a collection's traversal.


class Checkpoint(Record, gc=False):
    """A task annotated ``checkpoint=True`` (:mod:`hpcsched.core.worker.checkpoint`): its
    result is kept in file ``path`` under ``key`` or, with ``load``, read from there
    instead of running the task."""

    path: str
    key: Any
    load: bool = False


class RunSpec(Record, gc=False):
    """A task's call: ``function`` (cloudpickled; None: the task's value is its first
    argument, a literal or an alias of another task) with ``args`` (the pickled ``(args,
    kwargs)``; None: none). ``evaluate``: the arguments hold references to other tasks'
    results, to be replaced by their values before the call."""

    function: bytes | None
    args: bytes | None
    evaluate: bool = False
    checkpoint: Checkpoint | None = None


def task(x: Any) -> str | None:
    """The check of one task of an ``update-graph``: ``{"run_spec": RunSpec, "deps":
    [keys]}``."""
    if type(x) is dict and type(x.get("run_spec")) is RunSpec:
        # every task of every graph comes here: a task without dependencies (a map's) in
        # one call, one with them in two
        deps = x.get("deps", ())
        return None if type(deps) in (list, tuple) and not deps else checks.keys(deps)
    problem = checks.task(x)
    if problem:
        return problem
    spec = x["run_spec"]
    if type(spec) is not RunSpec:
        return f"run_spec must be a RunSpec, got {type(spec).__name__}"
    return None


task.what = "{run_spec: RunSpec, deps: [key]}"  # type: ignore[attr-defined]
