"""Task graphs: dask-style dicts normalized into ``{key: Task}``.

A dask-style graph maps keys to values: ``{"x": 1, "y": (inc, "x"),
"z": (add, "y", [("a", 0), ("a", 1)])}``. A tuple whose first item is callable
is a call; a string or tuple that is a key of the graph (or a known key held by
the cluster) is a reference; lists, tuples and dicts are walked; anything else
is a literal.

:func:`normalize` turns that into :class:`Task` objects whose ``expr`` is made
of :class:`Call` and :class:`Ref` nodes, with ``dependencies`` computed once.
Workers run ``evaluate(expr, data)``. Keys are ``str``, ``int`` or tuples of
those (``("x-abc", 0)``). :func:`key_split` gives a key's TaskGroup name.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

Key = Hashable


class GraphError(ValueError):
    """A graph that cannot run: a cycle, a missing key, a key depending on itself."""


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to the result of another task."""

    key: Key

    def __reduce__(self) -> tuple:  # dataclass pickling calls fields() per object: slower
        return (Ref, (self.key,))


@dataclass(frozen=True, slots=True)
class Call:
    """``func(*args, **kwargs)``; args may hold Refs, Calls, and containers of them."""

    func: Callable[..., Any]
    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __reduce__(self) -> tuple:
        return (Call, (self.func, self.args, self.kwargs))


@dataclass(slots=True)
class Task:
    key: Key
    expr: Any  # Call | Ref | literal
    dependencies: frozenset = frozenset()


_PLAIN = frozenset({int, float, bool, str, bytes, type(None)})


def _convert(x: Any, keys: Collection[Key], deps: set,
             ref_of: Callable[[Any], Key | None] | None = None) -> Any:
    """dask-style value -> expr with Ref / Call nodes; records references in deps.

    ``ref_of(obj)``, if given, is asked about objects of other types (a Client
    passes one that turns its Futures into their keys)."""
    t = type(x)
    if t is Ref:
        deps.add(x.key)
        return x
    if t is Call:
        return Call(x.func, tuple([_convert(a, keys, deps, ref_of) for a in x.args]),
                    {k: _convert(v, keys, deps, ref_of) for k, v in x.kwargs.items()})
    if t is tuple and x and callable(x[0]):
        return Call(x[0], tuple([_convert(a, keys, deps, ref_of) for a in x[1:]]))
    if t in (str, tuple, int) and _hashable_in(x, keys):
        deps.add(x)
        return Ref(x)
    if t is list:
        return [_convert(a, keys, deps, ref_of) for a in x]
    if t is tuple:
        return tuple([_convert(a, keys, deps, ref_of) for a in x])
    if t is dict:
        return {k: _convert(v, keys, deps, ref_of) for k, v in x.items()}
    if ref_of is not None and t not in _PLAIN:
        key = ref_of(x)
        if key is not None:
            deps.add(key)
            return Ref(key)
    return x


def _hashable_in(x: Any, keys: Collection[Key]) -> bool:
    try:
        return x in keys
    except TypeError:
        return False


def normalize(dsk: Mapping[Key, Any], known: Collection[Key] = (),
              ref_of: Callable[[Any], Key | None] | None = None) -> dict[Key, Task]:
    """Normalize a dask-style graph. ``known``: keys already held by the cluster;
    ``ref_of``: see :func:`_convert`.

    Raises :class:`GraphError` on a key that depends on itself or a cycle.
    """
    keys: Collection[Key] = dsk.keys() if not known else (set(dsk) | set(known))
    out: dict[Key, Task] = {}
    for k, v in dsk.items():
        deps: set = set()
        expr = _convert(v, keys, deps, ref_of)
        if k in deps:
            raise GraphError(f"key {k!r} depends on itself")
        out[k] = Task(k, expr, frozenset(deps))
    check_acyclic({k: t.dependencies for k, t in out.items()})
    return out


def find_refs(x: Any, out: set | None = None) -> set:
    """Keys referenced by Refs inside an expression."""
    out = set() if out is None else out
    t = type(x)
    if t is Ref:
        out.add(x.key)
    elif t is Call:
        for a in x.args:
            find_refs(a, out)
        for a in x.kwargs.values():
            find_refs(a, out)
    elif t in (list, tuple, set, frozenset):
        for a in x:
            find_refs(a, out)
    elif t is dict:
        for a in x.values():
            find_refs(a, out)
    return out


def evaluate(x: Any, data: Mapping[Key, Any]) -> Any:
    """Run an expression, reading Refs from ``data``."""
    t = type(x)
    if t is Call:
        args = [evaluate(a, data) for a in x.args]
        if x.kwargs:
            return x.func(*args, **{k: evaluate(v, data) for k, v in x.kwargs.items()})
        return x.func(*args)
    if t is Ref:
        return data[x.key]
    if t is list:
        return [evaluate(a, data) for a in x]
    if t is tuple:
        return tuple(evaluate(a, data) for a in x)
    if t is dict:
        return {k: evaluate(v, data) for k, v in x.items()}
    return x


def substitute(x: Any, key: Key, replacement: Any) -> Any:
    """``x`` with every ``Ref(key)`` replaced by ``replacement`` (used by fusion)."""
    t = type(x)
    if t is Ref:
        return replacement if x.key == key else x
    if t is Call:
        return Call(x.func, tuple(substitute(a, key, replacement) for a in x.args),
                    {k: substitute(v, key, replacement) for k, v in x.kwargs.items()})
    if t is list:
        return [substitute(a, key, replacement) for a in x]
    if t is tuple:
        return tuple(substitute(a, key, replacement) for a in x)
    if t is dict:
        return {k: substitute(v, key, replacement) for k, v in x.items()}
    return x


def check_acyclic(dependencies: Mapping[Key, Iterable[Key]]) -> None:
    """Raise :class:`GraphError` naming the keys of a cycle, if there is one.

    Iterative DFS (no recursion limit); dependencies outside the mapping are
    taken as already computed.
    """
    WHITE, GREY, BLACK = 0, 1, 2
    color: dict[Key, int] = {}
    for root in dependencies:
        if color.get(root, WHITE) != WHITE:
            continue
        stack: list[tuple[Key, Any]] = [(root, iter(dependencies[root]))]
        color[root] = GREY
        path = [root]
        while stack:
            node, it = stack[-1]
            for dep in it:
                if dep not in dependencies:
                    continue
                c = color.get(dep, WHITE)
                if c == GREY:
                    cycle = path[path.index(dep):] + [dep]
                    raise GraphError("cycle in graph: " + " -> ".join(map(repr, cycle)))
                if c == WHITE:
                    color[dep] = GREY
                    stack.append((dep, iter(dependencies[dep])))
                    path.append(dep)
                    break
            else:
                color[node] = BLACK
                stack.pop()
                path.pop()


_hex = re.compile(r"^[0-9a-f]{5,}$")


def key_split(key: Key) -> str:
    """The TaskGroup name of a key: ``"inc-1a2b3c4d5e"`` -> ``"inc"``, ``("x-abc12", 3)`` -> ``"x"``.

    Like dask: dash-separated words, dropping trailing hex tokens and numbers.
    """
    if isinstance(key, tuple):
        key = key[0] if key else ""
    if isinstance(key, bytes):
        key = key.decode(errors="replace")
    if not isinstance(key, str):
        return str(type(key).__name__)
    return _split_name(key)


@functools.lru_cache(maxsize=100_000)
def _split_name(key: str) -> str:
    # cached, as dask's ``key_split``: the keys of a collection share their name part
    # (``("x-abc12", 0)``, ``("x-abc12", 1)``, ...), and the scheduler splits every new key
    words = key.split("-")
    out = [words[0]]
    for w in words[1:]:
        if _hex.match(w) or w.isdigit() or (len(w) == 8 and w.isalnum() and not w.isalpha()):
            break
        out.append(w)
    name = "-".join(out)
    return name.strip("'\"()[] ") or key


@contextlib.contextmanager
def gc_paused(n_tasks: int, threshold: int = 1000) -> Iterator[None]:
    """Pause the cyclic garbage collector while building a graph of ``n_tasks``.

    A graph arrives as many new objects and no garbage: the collector's passes
    during the build (several, over a heap that grows with the graph) find
    nothing to free, and take a large share of the time the client spends
    preparing a large graph and the scheduler inserting it.
    """
    if n_tasks < threshold or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        resume_collector()


def resume_collector() -> None:
    """Turn the cyclic garbage collector back on after a pause in which long-lived objects
    were made (a graph, a process's start), moving them to the oldest generation.

    What the pause allocated still counts towards a young collection, which would run at
    the first allocation after ``gc.enable()`` and walk all of it, then again as it ages
    through the middle generation. Freezing and unfreezing moves every tracked object to
    the oldest generation at once and resets that count (CPython's ``gc.freeze`` /
    ``gc.unfreeze``). Skipped where the program froze objects itself, which ``unfreeze``
    would undo.
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
    gc.enable()
