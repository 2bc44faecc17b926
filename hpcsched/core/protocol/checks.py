"""What a message field's value must be: small check functions, and the words for them.

A check takes a value and returns ``None`` if it is fine, else a short text
saying what is wrong. Each check also carries ``what``, the words the
protocol's documentation uses for it (``describe(check)``), so a field's check
and its documented type are one definition.

A key is what dask accepts as a key: a ``str``, ``bytes``, ``int`` or
``float``, or a tuple of keys (dask documents keys this way in its graph
specification, https://docs.dask.org/en/stable/spec.html).

>>> keys(["x", ("y", 0)]) is None
True
>>> keys([[1]])
'contains something that is not a key: [1]'
>>> describe(optional(dict_of(count)))
'{key: int >= 0} or None'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hpcsched.core.protocol.serialize import Serialized

Check = Callable[[Any], str | None]  # None if fine, else what is wrong
MAX_KEY_DEPTH = 32


def describe(check: Check) -> str:
    """The documentation's words for ``check``."""
    return getattr(check, "what", None) or check.__name__


def _says(what: str) -> Callable[[Check], Check]:
    def mark(check: Check) -> Check:
        check.what = what  # type: ignore[attr-defined]
        return check
    return mark


_KEY_ATOMS = frozenset({str, bytes, int, float})


def is_key(x: Any, depth: int = 0) -> bool:
    # exact types first: every key of a large graph passes here, several times over, and a
    # type lookup in a set is cheaper than isinstance with a tuple of types, or a generator
    # per tuple key
    t = type(x)
    if t in _KEY_ATOMS:
        return True
    if t is tuple and depth < MAX_KEY_DEPTH:
        for y in x:
            if type(y) not in _KEY_ATOMS and not is_key(y, depth + 1):
                return False
        return True
    if isinstance(x, (str, bytes, int, float)):  # subclasses (a numpy integer is not one)
        return True
    if isinstance(x, tuple) and depth < MAX_KEY_DEPTH:
        return all(is_key(y, depth + 1) for y in x)
    return False


@_says("key")
def key(x: Any) -> str | None:
    return None if is_key(x) else f"not a key (str, bytes, int, float or tuple): {short(x)}"


@_says("[key]")
def keys(x: Any) -> str | None:
    if not isinstance(x, (list, tuple)):
        return f"expected a list of keys, got {type(x).__name__}"
    atoms = _KEY_ATOMS
    if set(map(type, x)) <= atoms:  # a map's keys, thousands of them: checked at C speed
        return None
    for k in x:
        if type(k) not in atoms and not is_key(k):
            return f"contains something that is not a key: {short(k)}"
    return None


@_says("str")
def string(x: Any) -> str | None:
    return None if isinstance(x, str) else f"expected a string, got {type(x).__name__}"


@_says("worker (address, name or rank)")
def worker_ref(x: Any) -> str | None:
    """A worker named by its address, its name, or its MPI rank (dask-mpi names workers by
    rank: ``submit(..., workers=2)``)."""
    if isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)):
        return None
    return f"expected a worker address, name or rank, got {short(x)}"


@_says("bool")
def boolean(x: Any) -> str | None:
    return None if isinstance(x, bool) else f"expected true or false, got {short(x)}"


@_says("number")
def number(x: Any) -> str | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return None
    return f"expected a finite number, got {short(x)}"


@_says("int >= 0")
def count(x: Any) -> str | None:
    if isinstance(x, int) and not isinstance(x, bool) and x >= 0:
        return None
    return f"expected an integer >= 0, got {short(x)}"


@_says("number >= 0")
def seconds(x: Any) -> str | None:
    """A duration: a number of seconds, never negative (infinite: no limit)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0:  # NaN fails
        return None
    return f"expected a number >= 0, got {short(x)}"


@_says("int > 0")
def positive_number(x: Any) -> str | None:
    if number(x) is None and x > 0:
        return None
    return f"expected a finite number > 0, got {short(x)}"


def positive(x: Any) -> str | None:
    if isinstance(x, int) and not isinstance(x, bool) and x > 0:
        return None
    return f"expected an integer > 0, got {short(x)}"


@_says("dict")
def mapping(x: Any) -> str | None:
    return None if isinstance(x, dict) else f"expected a dict, got {type(x).__name__}"


@_says("bytes")
def blob(x: Any) -> str | None:
    return None if isinstance(x, (bytes, bytearray)) else f"expected bytes, got {short(x)}"


@_says("Serialized")
def serialized(x: Any) -> str | None:
    return None if isinstance(x, Serialized) else f"expected serialized data, got {short(x)}"


@_says("any")
def anything(x: Any) -> str | None:
    return None


def text(most: int) -> Check:
    """A non-empty string of at most ``most`` characters (a name the receiver keeps)."""
    def txt(x: Any) -> str | None:
        if isinstance(x, str) and 0 < len(x) <= most:
            return None
        return f"expected a string of 1 to {most} characters, got {short(x)}"
    txt.what = f"str of 1 to {most} characters"  # type: ignore[attr-defined]
    return txt


def int_in(low: int, high: int) -> Check:
    """An integer in ``[low, high]``."""
    def rng(x: Any) -> str | None:
        if isinstance(x, int) and not isinstance(x, bool) and low <= x <= high:
            return None
        return f"expected an integer in [{low}, {high}], got {short(x)}"
    rng.what = f"int in [{low}, {high}]"  # type: ignore[attr-defined]
    return rng


def sized(check: Check, most: int, least: int = 0) -> Check:
    """What ``check`` accepts, holding ``least`` to ``most`` items (bytes, entries)."""
    def siz(x: Any) -> str | None:
        problem = check(x)
        if problem:
            return problem
        if not least <= len(x) <= most:
            return f"expected {least} to {most} items, got {len(x)}"
        return None
    siz.what = f"{describe(check)} of {least} to {most} items"  # type: ignore[attr-defined]
    return siz


def one_of(*checks: Check) -> Check:
    """What any of ``checks`` accepts."""
    def any_of(x: Any) -> str | None:
        problems = [check(x) for check in checks]
        return None if not all(problems) else "; ".join(p for p in problems if p)
    any_of.what = " or ".join(describe(c) for c in checks)  # type: ignore[attr-defined]
    return any_of


def optional(check: Check) -> Check:
    def opt(x: Any) -> str | None:
        return None if x is None else check(x)
    opt.what = f"{describe(check)} or None"  # type: ignore[attr-defined]
    return opt


def list_of(check: Check) -> Check:
    # the types whose every value passes ``check`` (or passes with a bound that the fast
    # path below tests itself): a list of only those is checked at C speed, which matters
    # for the lists of a bulk map's reports, thousands of numbers long
    fast = _FAST_TYPES.get(check)

    def lst(x: Any) -> str | None:
        if not isinstance(x, (list, tuple)):
            return f"expected a list, got {type(x).__name__}"
        if fast is not None and set(map(type, x)) <= fast:
            if check is count and x and min(x) < 0:
                pass  # the slow path names the item
            elif check is number and not all(map(math.isfinite, x)):
                pass
            else:
                return None
        for item in x:
            problem = check(item)
            if problem:
                return f"an item is wrong: {problem}"
        return None
    lst.what = f"[{describe(check)}]"  # type: ignore[attr-defined]
    return lst


_FAST_TYPES: dict[Check, frozenset[type]] = {
    count: frozenset({int}), number: frozenset({int, float}), string: frozenset({str}),
    blob: frozenset({bytes, bytearray}),
}


def dict_of(value: Check, keyed: Check = key) -> Check:
    def dct(x: Any) -> str | None:
        if not isinstance(x, dict):
            return f"expected a dict, got {type(x).__name__}"
        for k, v in x.items():
            problem = keyed(k) or value(v)
            if problem:
                return f"entry {short(k)}: {problem}"
        return None
    dct.what = f"{{{describe(keyed)}: {describe(value)}}}"  # type: ignore[attr-defined]
    return dct


@_says("{run_spec, deps: [key]}")
def task(x: Any) -> str | None:
    """One task of an ``update-graph``: ``{"run_spec": ..., "deps": [keys]}``."""
    if not isinstance(x, dict):
        return f"a task must be a dict with run_spec and deps, got {type(x).__name__}"
    if "run_spec" not in x:
        return "a task has no run_spec"
    return keys(x.get("deps", ()))


def short(x: Any) -> str:
    """``repr(x)``, cut to 80 characters (and safe from a hostile ``__repr__``)."""
    try:
        r = repr(x)
    except Exception:  # a hostile __repr__
        r = f"<{type(x).__name__}>"
    return r if len(r) <= 80 else r[:77] + "..."
