"""From what a user calls to what the scheduler receives: keys, task specs, key nesting.

A task travels as ``(function blob, arguments blob, needs evaluation)``: the function
cloudpickled once per function (cached), the arguments pickled per task, and a flag
telling the worker whether arguments hold references to other results (or nested
calls) to evaluate first. Dask collections' newer task objects are turned back into
the classic tuple form here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcsched.core.graph import Call, Task
from hpcsched.core.serialize import dumps_function, dumps_object

_SCALARS = frozenset({int, float, str, bytes, bool, type(None), complex})


def funcname(func: Any) -> str:
    while hasattr(func, "func") and not hasattr(func, "__name__"):
        func = func.func  # functools.partial
    name = getattr(func, "__name__", None) or type(func).__name__
    return "lambda" if name == "<lambda>" else name.replace("-", "_")


def task_run_spec(task: Task) -> tuple:
    """The wire form of a normalized graph task: (function blob, args blob, needs evaluation)."""
    expr = task.expr
    if type(expr) is Call:
        return (dumps_function(expr.func), dumps_object((expr.args, dict(expr.kwargs))), True)
    return (None, dumps_object(((expr,), {})), True)


def _legacy(v: Any) -> Any:
    """A dask task-spec object (dask >= 2024.12) as a legacy tuple, when needed."""
    try:
        from dask._task_spec import Alias, DataNode, TaskRef  # type: ignore
        from dask._task_spec import Task as DTask
    except Exception:  # pragma: no cover - older dask: graphs are tuples already
        return v
    if isinstance(v, DataNode):
        return v.value
    if isinstance(v, Alias):
        return v.target.key if hasattr(v.target, "key") else v.target
    if isinstance(v, TaskRef):
        return v.key
    if isinstance(v, DTask):
        args = tuple(_legacy(a) for a in v.args)
        if v.kwargs:
            from functools import partial

            return (partial(_apply_kwargs, v.func), list(args),
                    {k: _legacy(x) for k, x in v.kwargs.items()})
        return (v.func, *args)
    if isinstance(v, (list, tuple)):
        return type(v)(_legacy(a) for a in v)
    if isinstance(v, dict):
        return {k: _legacy(x) for k, x in v.items()}
    return v


def _apply_kwargs(func: Callable, args: list, kwargs: dict) -> Any:
    return func(*args, **kwargs)


def _as_list(x: Any) -> list | None:
    if x is None:
        return None
    if isinstance(x, str):
        return [x]
    return list(x)


def _flatten_keys(keys: Any) -> list:
    out: list = []

    def walk(k: Any) -> None:
        if isinstance(k, list):
            for i in k:
                walk(i)
        else:
            out.append(k)

    walk(keys)
    return out


def _pack_keys(keys: Any, mapping: dict) -> Any:
    if isinstance(keys, list):
        return [_pack_keys(k, mapping) for k in keys]
    return mapping[keys]
