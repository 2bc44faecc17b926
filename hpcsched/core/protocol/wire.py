"""How records go on and off the wire: the protocol's codec.

Every comm carries messages as dicts, ``{"op": "compute-task", "key": ..., ...}``.
Here each op is one *record* (:mod:`hpcsched.core.protocol.records`) registered with
:func:`message` under its op string in one or more :class:`Direction` tables (who sends
it to whom). Its *wire* fields travel in the dict, each with a check from
:mod:`hpcsched.core.protocol.checks`; its *context* fields are what the receiver knows
and the sender does not say -- who sent it (``worker=``, ``client=``), when it arrived
(``now``), and the ``stimulus_id`` tracing the state changes it causes (as in
distributed's worker state machine). They never travel.

:func:`encode` turns a record into its dict with a function generated per class on
first use: it is on every send's path, so it must cost about what the dict literal it
replaces costs. :func:`decode` turns a dict back into a record, given the context; an
unknown op, an unknown or missing field, or (where the direction is checked) a field of
the wrong type raises :class:`MalformedMessage` naming the op and the field: the one
error path for whatever a peer sends. A server decodes each message with
:func:`receive`, which gives a state machine's event its context (and a
``stimulus_id``) as it is built: records are frozen, never written after decoding.

>>> PINGS = Direction("pinger", "ponger")
>>> @message("ping", PINGS)
... class Ping(Record):
...     '''A peer says it is alive.'''
...     seq: int = wire(field_checks.count)
...     now: float = context(0.0)
>>> encode(Ping(3))
{'op': 'ping', 'seq': 3}
>>> decode(PINGS, dict(op="ping", seq=3), now=1.5)
Ping(seq=3, now=1.5)
>>> decode(PINGS, dict(op="ping", seq=-1))
Traceback (most recent call last):
...
hpcsched.core.protocol.wire.MalformedMessage: op 'ping', field 'seq': expected an integer >= 0, got -1
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hpcsched.core.protocol import checks as field_checks
from hpcsched.core.protocol.checks import Check, short
from hpcsched.core.protocol.records import NODEFAULT, Field, Record, context, fields, wire

__all__ = [
    "Direction",
    "MalformedMessage",
    "Record",
    "Spec",
    "context",
    "decode",
    "encode",
    "message",
    "receive",
    "spec",
    "wire",
]


class MalformedMessage(ValueError):
    """A message that is not a known op with the right fields."""


class Generated(dict):
    """Functions generated per op on first use: ``table[op]`` compiles the op's function
    then (``KeyError`` for an op without one), later lookups are a dict's. A process
    compiles only the codecs of the ops it meets, not those of every record it imports
    (start-up: hundreds of ranks import the protocol before their first task)."""

    def __init__(self) -> None:
        super().__init__()
        self._makers: dict[Any, Callable[[], Any]] = {}

    def offer(self, op: Any, make: Callable[[], Any]) -> None:
        """``make()`` gives ``op``'s function when it is first looked up."""
        self._makers[op] = make

    def ops(self) -> set:
        """Every op this table has a function for, generated yet or not."""
        return set(self._makers)

    def __missing__(self, op: Any) -> Any:
        value = self[op] = self._makers[op]()
        return value


class Direction(dict):
    """The ops one kind of peer sends another: op -> record class.

    ``checked``: :func:`decode` checks every field's value (the scheduler checks what
    workers and clients send: one peer's bad message must not break it for the others).
    Otherwise only the op and the field names are checked: the receiver trusts a sender
    it authenticated, and the message is on a hot path (a worker's ``compute-task``).
    """

    def __init__(self, sender: str, receiver: str, checked: bool = True, doc: str = ""):
        super().__init__()
        self.sender, self.receiver, self.checked, self.doc = sender, receiver, checked, doc
        #: op -> (generated decoder, allowed field names), for an unchecked direction
        self.fast = Generated()
        #: op -> (generated decoder taking the context as a dict, allowed field names):
        #: checks each field as ``checked`` says (the scheduler's path for every message)
        self.with_context = Generated()
        #: the ops whose records are a state machine's events: they take the receiver's
        #: context and a ``stimulus_id`` (:func:`receive`)
        self.stamped: set[str] = set()

    @property
    def name(self) -> str:
        return f"{self.sender} -> {self.receiver}"

    def __repr__(self) -> str:
        return f"<Direction {self.name}: {len(self)} ops>"


class Spec(Record):
    """What :func:`message` learned of a record class."""

    op: str
    cls: type
    wire: tuple[Field, ...]
    context: tuple[Field, ...]
    extra: str | None  # the field collecting fields not named (an open record), if any
    allowed: frozenset  # "op" and the wire fields' names
    required: tuple[str, ...]
    checks: tuple[tuple[str, Check], ...]
    context_names: frozenset


_SPECS: dict[type, Spec] = {}
#: record class -> ``encode`` function, generated on first use
_ENCODERS = Generated()


def message(op: str, *directions: Direction) -> Callable[[type], type]:
    """Class decorator: register the :class:`Record` as the record of ``op`` in each of
    ``directions``; it gets ``op`` as a class attribute."""

    def register(cls: type) -> type:
        spec = _SPECS.get(cls)
        if spec is None:
            spec = _SPECS[cls] = _spec(op, cls)
            _ENCODERS.offer(cls, functools.partial(_encoder, spec))
            cls.op = op  # type: ignore[attr-defined]
        elif spec.op != op:
            raise ValueError(f"{cls.__name__} is already the record of {spec.op!r}")
        for d in directions:
            if d.get(op, cls) is not cls:
                raise ValueError(
                    f"{d.name} has two records for {op!r}: {d[op].__name__}, {cls.__name__}"
                )
            d[op] = cls
            if not d.checked and _has_fast_decoder(spec):
                d.fast.offer(op, functools.partial(_with_allowed, _fast_decoder, spec))
            if spec.extra is None:
                d.with_context.offer(
                    op, functools.partial(_with_allowed, _context_decoder, spec, d.checked)
                )
            if "stimulus_id" in spec.context_names:
                d.stamped.add(op)
        return cls

    return register


def _with_allowed(
    make: Callable[..., Callable], spec: Spec, *args: Any
) -> tuple[Callable, frozenset]:
    """A direction's entry for ``spec``'s op: its generated decoder and the field names it
    takes."""
    return make(spec, *args), spec.allowed


def _spec(op: str, cls: type) -> Spec:
    if not isinstance(cls, type) or not issubclass(cls, Record):
        raise TypeError(f"{cls.__name__}: a message must be a Record")
    declared = fields(cls)
    for f in declared:
        if f.kind == "plain":
            raise TypeError(f"{cls.__name__}.{f.name}: say whether it is wire() or context()")
    wires = tuple(f for f in declared if f.kind == "wire")
    contexts = tuple(f for f in declared if f.kind == "context")
    extras = [f.name for f in declared if f.kind == "extra"]
    if len(extras) > 1:
        raise TypeError(f"{cls.__name__}: one extra() field at most")
    return Spec(
        op=op,
        cls=cls,
        wire=wires,
        context=contexts,
        extra=extras[0] if extras else None,
        allowed=frozenset(["op", *(f.name for f in wires)]),
        required=tuple(f.name for f in wires if f.required),
        checks=tuple(
            (f.name, f.check)
            for f in wires
            if f.check is not None and f.check is not field_checks.anything
        ),
        context_names=frozenset(f.name for f in contexts),
    )


def _encoder(spec: Spec) -> Callable[[Any], dict]:
    """``def encode(r): return {"op": OP, "key": r.key, ...}``, compiled once per class."""
    dense = ["'op': OP", *(f"{f.name!r}: r.{f.name}" for f in spec.wire if not f.sparse)]
    if spec.extra is not None:  # the record's own fields win over same-named extra ones
        dense.insert(0, f"**r.{spec.extra}")
    literal = "{" + ", ".join(dense) + "}"
    sparse = [f for f in spec.wire if f.sparse]
    env: dict[str, Any] = {"OP": spec.op}
    if not sparse:
        lines = [f"    return {literal}"]
    else:
        lines = [f"    d = {literal}"]
        for f in sparse:
            default = f.example()
            if default is None:
                test = f"r.{f.name} is not None"
            elif isinstance(default, (dict, list, tuple, set)) and not default:
                test = f"r.{f.name}"
            else:
                env[f"D_{f.name}"] = default
                test = f"r.{f.name} != D_{f.name}"
            lines += [f"    if {test}:", f"        d[{f.name!r}] = r.{f.name}"]
        lines.append("    return d")
    src = "def encode(r):\n" + "\n".join(lines) + "\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<encode {spec.op}>", "exec"), env, ns)  # noqa: S102 - our own source
    fn = ns["encode"]
    fn.__qualname__ = f"encode_{spec.cls.__name__}"
    return fn


def _has_fast_decoder(spec: Spec) -> bool:
    """Whether :func:`_fast_decoder` serves the record: not one that needs context or
    collects extra fields."""
    return spec.extra is None and not any(f.required for f in spec.context)


def _fast_decoder(spec: Spec) -> Callable[[dict], Any]:
    """The decoder of an unchecked direction (the client's and the worker's hot paths: one
    ``key-in-memory`` per finished task): the fields given, the record's defaults for the
    others. A missing required field raises ``KeyError``: the general path then names it."""
    return _generated(spec, False, context=False)


class _Refused(Exception):
    """A decoder met a field it cannot take: :func:`decode`'s general path then names the
    problem."""


def _context_decoder(spec: Spec, checked: bool) -> Callable[[dict, dict], Any]:
    """The decoder of ``spec``'s op taking the receiver's context ``ctx``, each field present
    checked (if ``checked``): the path every message to the scheduler takes. Anything wrong
    raises ``_Refused``, ``KeyError`` or ``TypeError``, and the general path of
    :func:`decode` says what."""
    return _generated(spec, checked, context=True)


# checks whose common passing values a generated decoder tells inline (a condition true
# only of values the check passes): a finite float (``x - x`` is NaN for infinities and
# NaN), an int (not a bool: its class is bool) >= 0. Each finished task's report has
# several such fields; a call of the check costs more than the rest of reading one.
_PASSES = {
    field_checks.number: "{v}.__class__ is float and {v} - {v} == 0.0",
    field_checks.count: "{v}.__class__ is int and {v} >= 0",
}


def _generated(spec: Spec, checked: bool, context: bool) -> Callable[..., Any]:
    """``def decode(m, ctx)``: ``CLS(key=m["key"], nbytes=m["nbytes"] if "nbytes" in m
    else D_nbytes, ..., **ctx)`` (``decode(m)`` without ``context``), each value checked
    first if ``checked``, compiled once per op on its first use (:class:`Generated`): no
    process pays at start-up for the records it never receives. Straight-line code, not a loop over the
    fields: it runs for every message (each finished task's), and keyword names that are
    the code's own constants are matched by the record's ``__init__`` at once, where the
    names of a decoded dict's keys are compared as text."""
    env: dict[str, Any] = {"CLS": spec.cls, "REFUSED": _Refused}
    lines = ["def decode(m, ctx):" if context else "def decode(m):"]
    for i, f in enumerate(spec.wire):
        v = f"v{i}"
        check = checked and f.check is not None and f.check is not field_checks.anything
        get = [f"{v} = m[{f.name!r}]"]
        if check:
            env[f"C{i}"] = f.check
            passes = _PASSES.get(f.check) if f.check is not None else None
            if passes is None:
                get.append(f"if C{i}({v}): raise REFUSED")
            else:  # no call for the common value that passes: the check judges the rest
                get.append(f"if not ({passes.format(v=v)}) and C{i}({v}): raise REFUSED")
        if f.required:
            lines += [f"    {line}" for line in get]
            continue
        if f.factory is not NODEFAULT:
            env[f"F{i}"] = f.factory
            default = f"F{i}()"
        else:  # an empty collection is copied, as the record's own default would be
            env[f"D{i}"] = f.default
            mutable = isinstance(f.default, (list, dict, set, bytearray))
            default = f"D{i}.copy()" if mutable else f"D{i}"
        lines.append(f"    if {f.name!r} in m:")
        lines += [f"        {line}" for line in get]
        lines += ["    else:", f"        {v} = {default}"]
    args = ", ".join([f"{f.name}=v{i}" for i, f in enumerate(spec.wire)]
                     + (["**ctx"] if context else []))
    lines.append(f"    return CLS({args})")
    ns: dict[str, Any] = {}
    where = f"<decode {spec.op}{' with context' if context else ''}>"
    exec(compile("\n".join(lines) + "\n", where, "exec"), env, ns)  # noqa: S102 - our own source
    fn = ns["decode"]
    fn.__qualname__ = f"decode_{spec.cls.__name__}"
    return fn


def spec(cls: type) -> Spec:
    """What the protocol knows of record class ``cls`` (KeyError if it is not one)."""
    return _SPECS[cls]


def encode(record: Any) -> dict:
    """The wire dict of ``record``: ``{"op": ..., **its wire fields}`` (context fields stay
    behind)."""
    return _ENCODERS[record.__class__](record)


def decode(table: Direction | dict, msg: Any, /, **context: Any) -> Any:
    """The record of op dict ``msg``, one of ``table``'s ops, with the receiver's
    ``context`` fields (``now=``, ``worker=``, ...) filled in.

    Raises :class:`MalformedMessage` naming the op and the field for an unknown op, an
    unknown or missing field, and (if ``table.checked``, as a plain dict is) a field of
    the wrong type; ``TypeError`` for a context field the record does not have or lacks
    (the receiver's mistake, not the peer's).
    """
    if context and type(msg) is dict:
        try:
            fast_ctx, allowed = table.with_context[msg["op"]]  # type: ignore[union-attr]
        except (KeyError, TypeError, AttributeError):  # no op, an unknown one; a plain dict
            pass
        else:
            if msg.keys() <= allowed:
                try:
                    return fast_ctx(msg, context)
                except (KeyError, TypeError, _Refused):
                    pass  # named below
    fast_ops = getattr(table, "fast", None)
    if fast_ops and not context and type(msg) is dict:
        try:
            fast, allowed = fast_ops[msg["op"]]
        except (KeyError, TypeError):  # no op, an unknown or unhashable one: said below
            pass
        else:
            if msg.keys() <= allowed:
                try:
                    return fast(msg)
                except (KeyError, TypeError):
                    pass  # a required field is missing: named below
    if not isinstance(msg, dict):
        raise MalformedMessage(f"expected an op dict, got {type(msg).__name__}")
    op = msg.get("op")
    try:
        cls = table.get(op)
    except TypeError:  # an unhashable op
        cls = None
    if cls is None:
        where = f" ({table.name})" if isinstance(table, Direction) else ""
        if not isinstance(op, str):
            why = ": the op must be a string"
        elif isinstance(table, Direction):
            why = f": not a {table.sender}'s op"
        else:
            why = ""
        raise MalformedMessage(f"unknown op {short(op)}{where}{why}")
    s = _SPECS[cls]
    unknown = msg.keys() - s.allowed
    if unknown:
        if s.extra is None:
            raise MalformedMessage(
                f"op {op!r} has unknown fields {', '.join(sorted(short(k) for k in unknown))}"
            )
        kw = {k: v for k, v in msg.items() if k in s.allowed}
        kw[s.extra] = {k: msg[k] for k in unknown}
    else:
        kw = dict(msg)
    del kw["op"]
    for name in s.required:
        if name not in kw:
            raise MalformedMessage(f"op {op!r} lacks the field {name!r}")
    if getattr(table, "checked", True):
        for name, check in s.checks:
            if name in kw:
                problem = check(kw[name])
                if problem:
                    raise MalformedMessage(f"op {op!r}, field {name!r}: {problem}")
    if context:
        wrong = context.keys() - s.context_names
        if wrong:
            raise TypeError(f"{cls.__name__} has no context fields {sorted(wrong)}")
        kw.update(context)
    try:
        return cls(**kw)
    except TypeError as e:  # a required context field not given
        raise TypeError(f"decoding {op!r}: {e}") from None


def receive(table: Direction, msg: Any, stimulus: Callable[[str], str], /, **context: Any) -> Any:
    """What a server makes of each message that arrives: the record of ``msg``.

    A record that is a state machine's event (it declares a ``stimulus_id``) is given the
    receiver's ``context`` (``worker=`` or ``client=``, ``now=``) and the stimulus id
    ``stimulus(op)`` names for it (``"task-finished-12"``, as distributed's); any other
    record is decoded as it came. The context is in the record from its construction:
    nothing writes a record after it is decoded. Errors are :func:`decode`'s.

    >>> TICKS = Direction("clock", "machine")
    >>> @message("tick", TICKS)
    ... class Tick(Record):
    ...     now: float = context(0.0)
    ...     stimulus_id: str = context("")
    >>> receive(TICKS, {"op": "tick"}, lambda op: f"{op}-1", now=2.0)
    Tick(now=2.0, stimulus_id='tick-1')
    """
    op = msg.get("op") if msg.__class__ is dict else None
    if op.__class__ is str and op in table.stamped:
        context["stimulus_id"] = stimulus(op)
        # decode()'s first path, without a second call packing the context again: every
        # finished task's message comes here
        try:
            fast_ctx, allowed = table.with_context[op]  # generated on first use
        except KeyError:  # an open record: decode() takes it
            pass
        else:
            if msg.keys() <= allowed:
                try:
                    return fast_ctx(msg, context)
                except (KeyError, TypeError, _Refused):
                    pass  # named by decode()
        return decode(table, msg, **context)
    return decode(table, msg)
