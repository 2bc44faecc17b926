"""From what a user calls to what the scheduler receives: keys, task specs, key nesting.

A task travels as ``(function blob, arguments blob, needs evaluation)``: the function
cloudpickled once per function (cached), the arguments pickled per task, and a flag
telling the worker whether arguments hold references to other results (or nested
calls) to evaluate first. With ``pure=True`` a task's key is derived from those blobs,
so the same call submitted twice is one task (dask's pure functions).
"""

from __future__ import annotations

from typing import Any

try:  # CPython's own BLAKE2, which hashlib hands out too, without loading OpenSSL (~3 ms)
    from _blake2 import blake2b
except ImportError:  # a Python built without its own hashes
    from hashlib import blake2b

from hpcsched.core.graph.dsk import Call, Task
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.protocol.serialize import dumps_function, dumps_object

SCALARS = frozenset({int, float, str, bytes, bool, type(None), complex})


def funcname(func: Any) -> str:
    while hasattr(func, "func") and not hasattr(func, "__name__"):
        func = func.func  # functools.partial
    name = getattr(func, "__name__", None) or type(func).__name__
    return "lambda" if name == "<lambda>" else name.replace("-", "_")


def pure_token(func_blob: bytes, args_blob: bytes | None) -> str:
    """A deterministic token of a call from its pickled function and arguments (hex, so that
    :func:`~hpcsched.core.graph.dsk.key_split` drops it from the task's group name)."""
    h = blake2b(func_blob, digest_size=16)
    if args_blob is not None:
        h.update(args_blob)
    return h.hexdigest()


def task_run_spec(task: Task) -> RunSpec:
    """The wire form of a normalized graph task."""
    expr = task.expr
    if type(expr) is Call:
        return RunSpec(dumps_function(expr.func), dumps_object((expr.args, dict(expr.kwargs))),
                       True)
    return RunSpec(None, dumps_object(((expr,), {})), True)


def as_list(x: Any) -> list | None:
    if x is None:
        return None
    if isinstance(x, (str, int)):  # one worker: an address, a name, a rank (dask-mpi's names)
        return [x]
    return list(x)


def flatten_keys(keys: Any) -> list:
    out: list = []

    def walk(k: Any) -> None:
        if isinstance(k, list):
            for i in k:
                walk(i)
        else:
            out.append(k)

    walk(keys)
    return out


def pack_keys(keys: Any, mapping: dict) -> Any:
    if isinstance(keys, list):
        return [pack_keys(k, mapping) for k in keys]
    return mapping[keys]
