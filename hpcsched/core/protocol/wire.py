"""Typed message records, and how they go on and off the wire.

Every comm carries messages as dicts, ``{"op": "compute-task", "key": ..., ...}``.
Here each op is one *record*: a slots dataclass (:func:`record`) registered with
:func:`message` under its op string in one or more :class:`Direction` tables
(who sends it to whom). A record's fields are of two kinds:

- *wire* fields (:func:`wire`): carried in the dict, each with a check from
  :mod:`hpcsched.core.protocol.checks` and, if it may be left out, a default;
- *context* fields (:func:`context`): what the receiver knows and the sender
  does not say -- who sent it (``worker=``, ``client=``), when it arrived
  (``now``), and the ``stimulus_id`` tracing the state changes it causes (as in
  distributed's worker state machine). They never travel.

:func:`encode` turns a record into its dict with a function generated per
class at registration (as :mod:`dataclasses` generates ``__init__``): it is on
every send's path, so it must cost about what the dict literal it replaces
costs. :func:`decode` turns a dict back into a record, given the context; an
unknown op, an unknown or missing field, or (where the direction is checked)
a field of the wrong type raises :class:`MalformedMessage` naming the op and
the field: the one error path for whatever a peer sends.
A server decodes each message with :func:`receive`, which gives a state
machine's event its context (and a ``stimulus_id``) as it is built: records
are never written after decoding.

>>> from dataclasses import dataclass
>>> PINGS = Direction("pinger", "ponger")
>>> @message("ping", PINGS)
... @dataclass(slots=True)
... class Ping:
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

import abc
import dataclasses
import functools
import re
import reprlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, MISSING, InitVar
from types import MemberDescriptorType
from typing import TYPE_CHECKING, Any, ClassVar, get_origin

from hpcsched.core.protocol import checks as field_checks
from hpcsched.core.protocol.checks import Check, describe, short


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


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One field of a record, as the protocol sees it."""

    name: str
    check: Check | None  # None: a context field
    required: bool
    default: Any  # MISSING if required; for a default_factory, an example (factory())
    sparse: bool  # left off the wire when it has its default
    doc: str


@dataclasses.dataclass(frozen=True, slots=True)
class Spec:
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


#: the methods :func:`record` compiles when first called, as :mod:`dataclasses` would
_LAZY_METHODS = ("__init__", "__repr__", "__eq__")


if TYPE_CHECKING:  # to a type checker a record is the slots dataclass it is at run time
    from dataclasses import dataclass as record
else:
    def record(cls: type | None = None, /, *, frozen: bool = False) -> Any:
        """``@dataclass(slots=True[, frozen=True])``, its methods compiled when first called.

        :mod:`dataclasses` compiles ``__init__``, ``__repr__`` and ``__eq__`` of every class
        as it is defined: for the protocol's and the state machines' hundred-odd records that
        is most of what importing them costs, on every process of a job, while a process
        builds a few dozen kinds. A record is an ordinary slots dataclass
        (:func:`dataclasses.fields`, :func:`~dataclasses.replace` work on it) whose
        ``__init__``, ``__repr__``, ``__eq__`` (and ``__hash__`` if frozen) are compiled, as
        :mod:`dataclasses` writes them, on the first call of any of them. The dataclass
        itself is made by :func:`_lean_dataclass` where it can, for a third of what
        :func:`dataclasses.dataclass` costs.
        """
        def wrap(c: type) -> type:
            methods = _METHODS[bool(frozen)]
            made = _lean_dataclass(c, frozen, methods, _DATACLASSES) if _DATACLASSES else None
            if made is None:
                made = dataclasses.dataclass(c, init=False, repr=False, eq=False, slots=True,
                                             frozen=frozen)
                for name, method in methods.items():
                    if name not in made.__dict__:  # not one of its own
                        setattr(made, name, method)
            return made

        return wrap if cls is None else wrap(cls)


def _first_call(name: str, frozen: bool) -> Callable:
    """What stands for method ``name`` of the (``frozen``) records until it is first called:
    it compiles the methods of the record it is found on, then calls the one compiled. One
    function for every record, found in the class as it is made: nothing is made per class."""
    def first(self: Any, *args: Any, **kwargs: Any) -> Any:
        for cls in type(self).__mro__:
            if cls.__dict__.get(name) is first:
                _compile_methods(cls, frozen)
                break
        # found nowhere: another thread compiled them since this call found the stand-in
        return getattr(type(self), name)(self, *args, **kwargs)

    first.__name__ = first.__qualname__ = name
    return first


#: frozen -> what a record has unless it defines its own: the functions standing for the
#: methods compiled on first call (a frozen dataclass hashes by its fields), and no hash for
#: a mutable record (compared by value)
_METHODS: dict[bool, dict[str, Any]] = {
    False: {**{name: _first_call(name, False) for name in _LAZY_METHODS}, "__hash__": None},
    True: {name: _first_call(name, True) for name in (*_LAZY_METHODS, "__hash__")}}


class _Dataclasses:
    """The private parts of :mod:`dataclasses` that :func:`_lean_dataclass` works with, and
    how this Python's ``dataclass(slots=True)`` makes a class again with ``__slots__``."""

    __slots__ = ("fields_attr", "params_attr", "field_kind", "params", "params_before",
                 "params_after", "leading_name", "getstate", "setstate", "replace",
                 "leave_out_inherited", "drop_weakref")

    def __init__(self, private: dict[str, Any],
                 params_args: tuple[tuple[bool, ...], tuple[bool, ...]]):
        self.fields_attr: str = private["_FIELDS"]  # "__dataclass_fields__"
        self.params_attr: str = private["_PARAMS"]  # "__dataclass_params__"
        #: what ``Field._field_type`` is for a field (not a ClassVar or an InitVar)
        self.field_kind = private["_FIELD"]
        #: ``params(*before, frozen, *after)``: a class's ``__dataclass_params__``
        self.params: Callable[..., Any] = private["_DataclassParams"]
        self.params_before, self.params_after = params_args
        #: the pattern giving the name an annotation's text begins with
        self.leading_name: re.Pattern = private["_MODULE_IDENTIFIER_RE"]
        #: a frozen slots dataclass's ``__getstate__`` and ``__setstate__`` (for pickle)
        self.getstate: Callable = private["_dataclass_getstate"]
        self.setstate: Callable = private["_dataclass_setstate"]
        #: what becomes ``__replace__``, where dataclasses adds one (Python 3.13)
        self.replace: Callable | None = private["_replace"]
        #: ``__slots__`` leaves out those of the bases (3.11, bpo-46382: 3.10 names every field)
        self.leave_out_inherited = sys.version_info >= (3, 11)
        #: the class as defined loses its ``__weakref__`` descriptor (3.11.3, gh-102069)
        self.drop_weakref = sys.version_info >= (3, 11, 3)


def _dataclasses() -> _Dataclasses | None:
    """What :func:`_lean_dataclass` needs of :mod:`dataclasses`, as Pythons 3.10 to 3.13 have
    it; None on a Python that lacks any of it, or a later one (3.14 changed how it reads
    annotations and how it makes a class again with slots), where records are made by
    ``dataclass()``: the same classes, slower to import."""
    private = {name: getattr(dataclasses, name, None) for name in (
        "_FIELDS", "_PARAMS", "_FIELD", "_DataclassParams", "_MODULE_IDENTIFIER_RE",
        "_dataclass_getstate", "_dataclass_setstate", "_replace")}
    if sys.version_info >= (3, 14) \
            or any(value is None for name, value in private.items() if name != "_replace") \
            or not {"_field_type", "kw_only"} <= set(dataclasses.Field.__slots__):
        return None
    # dataclass()'s arguments for a record, those _DataclassParams takes (3.12 added
    # match_args, kw_only, slots and weakref_slot to the first six), in their order
    given = dict(init=False, repr=False, eq=False, order=False, unsafe_hash=False,
                 match_args=True, kw_only=False, slots=True, weakref_slot=False)
    code = getattr(getattr(private["_DataclassParams"], "__init__", None), "__code__", None)
    takes = code.co_varnames[1:code.co_argcount] if code else ()
    if "frozen" not in takes or not set(takes) - {"frozen"} <= given.keys():
        return None
    at = takes.index("frozen")
    return _Dataclasses(private, (tuple(given[name] for name in takes[:at]),
                                  tuple(given[name] for name in takes[at + 1:])))


_DATACLASSES = _dataclasses()
#: what a frozen dataclass gets from ``dataclass()``, refusing a class that has its own
#: ``__setattr__`` or ``__delattr__`` (and, before 3.11, replacing its ``__getstate__``)
_FROZEN_METHODS = frozenset({"__setattr__", "__delattr__", "__getstate__", "__setstate__"})


def _lean_dataclass(cls: type, frozen: bool, methods: dict[str, Any],
                    dc: _Dataclasses) -> type | None:
    """``dataclass(cls, init=False, repr=False, eq=False, slots=True, frozen=frozen)`` with
    ``methods`` it does not define set on it, for a fraction of the cost; None for a class
    left to ``dataclass()`` itself.

    For a record, ``dataclass()`` spends its time telling ``ClassVar``, ``InitVar`` and
    ``KW_ONLY`` annotations from fields, compiling a frozen class's ``__setattr__`` and
    ``__delattr__``, and setting attributes one by one on a class it then makes again with
    ``__slots__`` (each invalidates the interpreter's caches of the class). Annotations are
    text here (``from __future__ import annotations``): it matches each against a pattern
    three times, looking the name it begins with up in the class's module. Here that name
    is looked up once: for a field it names nothing there (``str``, ``list | None``) or a
    type. If it may name any of the three (but ``KW_ONLY`` written so), the class is left
    to ``dataclass()``, as is a class it would refuse or treat apart: without a docstring
    (it writes one from the signature), with a metaclass (an ABC's) or ``__slots__`` of its
    own, a field without annotation, a mutable default, a base frozen otherwise, with
    ``ClassVar`` or ``InitVar`` fields or without ``__slots__``, or frozen with methods it
    would refuse or replace. The frozen methods are closures doing what the compiled ones
    do, and the class is made again once, from its namespace with what ``dataclass()``
    adds and ``methods``; its ``__slots__``, and what its namespace loses, are those of
    this Python's ``dataclass()`` (:class:`_Dataclasses`).
    """
    module = sys.modules.get(cls.__module__)
    own = made = cls.__dict__.copy()  # its namespace, to become that of the class made again
    annotations = own.get("__annotations__", {})
    if module is None or not cls.__doc__ or type(annotations) is not dict \
            or type(cls) is not type or "__slots__" in own \
            or (frozen and not _FROZEN_METHODS.isdisjoint(own)):
        return None
    fields: dict[str, Any] = {}
    inherited: set[str] = set()  # the bases' slots
    for base in cls.__mro__[-2:0:-1]:  # the bases but object, the nearest last
        slots = base.__dict__.get("__slots__")
        if type(slots) is not tuple:
            return None
        inherited.update(slots)
        base_fields = getattr(base, dc.fields_attr, None)
        if base_fields is not None:
            if getattr(base, dc.params_attr).frozen != frozen:
                return None
            for f in base_fields.values():
                if f._field_type is not dc.field_kind:
                    return None
            fields.update(base_fields)
    for key, value in own.items():
        if isinstance(value, dataclasses.Field) and key not in annotations:
            return None
    ns = module.__dict__
    kw_only = False
    for name, annotation in annotations.items():
        named, prefixed = annotation, False
        if isinstance(annotation, str):
            if annotation.isascii() and annotation.isidentifier():  # the pattern's whole match
                named = ns.get(annotation)
            else:
                match = dc.leading_name.match(annotation)
                named = match and ns.get(match.group(2))
                prefixed = bool(match and match.group(1))
        if named is not None:
            if named is KW_ONLY and not prefixed and not kw_only:
                kw_only = True
                continue
            if named is KW_ONLY or named is InitVar or named is ClassVar \
                    or not isinstance(named, type) and (type(named) is InitVar
                                                        or get_origin(named) is ClassVar):
                return None
        default = getattr(cls, name, MISSING)
        if isinstance(default, dataclasses.Field):
            if name not in own:
                return None
            f = default
        else:
            f = dataclasses.field(default=MISSING if type(default) is MemberDescriptorType
                                  else default)
        if f.default.__class__.__hash__ is None or isinstance(f.default, (list, dict, set)):
            return None
        # filled in as dataclass() fills it in, should a later field leave the class to it
        f.name, f.type, f._field_type = name, annotation, dc.field_kind
        if f.kw_only is MISSING:
            f.kw_only = kw_only
        fields[name] = f
    made[dc.params_attr] = dc.params(*dc.params_before, frozen, *dc.params_after)
    made[dc.fields_attr] = fields
    if dc.replace is not None:
        made.setdefault("__replace__", dc.replace)
    if frozen:
        made["__setattr__"], made["__delattr__"] = _frozen_methods(cls, frozenset(fields))
    positional = []
    slots = []
    for name, f in fields.items():
        if f.init and not f.kw_only:
            positional.append(name)
        if name not in inherited or not dc.leave_out_inherited:
            slots.append(name)
        made.pop(name, None)
    made.setdefault("__match_args__", tuple(positional))
    made["__slots__"] = tuple(slots)
    made.pop("__dict__", None)
    if dc.drop_weakref:
        made.pop("__weakref__", None)
    for name, method in methods.items():
        made.setdefault(name, method)
    if frozen:  # pickle's way to a frozen slots class
        made["__getstate__"], made["__setstate__"] = dc.getstate, dc.setstate
    made["__qualname__"] = cls.__qualname__
    remade = type(cls.__name__, cls.__bases__, made)
    if "__abstractmethods__" in remade.__dict__:  # what update_abstractmethods looks for
        abc.update_abstractmethods(remade)
    return remade


def _frozen_methods(cls: type[Any], names: frozenset[str]) -> tuple[Callable, Callable]:
    """``__setattr__`` and ``__delattr__`` of frozen dataclass ``cls`` with fields ``names``,
    as :mod:`dataclasses` writes them (unannotated; ``cls`` is the class as defined, before
    it is made again with ``__slots__``, there too)."""
    def __setattr__(self, name, value):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self, name):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    for fn in (__setattr__, __delattr__):
        fn.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"
        fn.__module__ = cls.__module__
    return __setattr__, __delattr__


def _compile_methods(cls: type, frozen: bool) -> None:
    """Put on ``cls`` the methods it has yet to compile, as :mod:`dataclasses` makes them for
    its fields.

    The source is compiled, then run as a code object: ``exec`` of a string would clear
    the interpreter's note that a KeyboardInterrupt ended the program (a record first
    built during the exit's cleanup would make Ctrl-C exit with status 1, not by SIGINT).
    """
    names = [name for name, first in _METHODS[frozen].items()
             if first is not None and cls.__dict__.get(name) is first]
    fields = [f for f in dataclasses.fields(cls) if f.init]
    env: dict[str, Any] = {"MISSING": MISSING, "set_": object.__setattr__, "cls": cls}
    params: list[str] = []
    kw_params: list[str] = []
    body: list[str] = []
    for f in fields:
        param = f.name
        if f.default is not MISSING:
            env[f"d_{f.name}"] = f.default
            param += f"=d_{f.name}"
            value = f.name
        elif f.default_factory is not MISSING:
            env[f"f_{f.name}"] = f.default_factory
            param += "=MISSING"
            value = f"f_{f.name}() if {f.name} is MISSING else {f.name}"
        else:
            value = f.name
        (kw_params if f.kw_only else params).append(param)
        body.append(f"set_(self, {f.name!r}, {value})" if frozen
                    else f"self.{f.name} = {value}")
    signature = ", ".join(["self", *params, *(["*", *kw_params] if kw_params else [])])
    shown = [f.name for f in fields if f.repr]
    compared = [f.name for f in dataclasses.fields(cls) if f.compare]
    hashed = [f.name for f in dataclasses.fields(cls)
              if (f.compare if f.hash is None else f.hash)]

    def values(of: str, names: list[str]) -> str:
        return "(" + "".join(f"{of}.{n}, " for n in names) + ")"

    src = "\n".join([
        f"def __init__({signature}):",
        *(f"    {line}" for line in body or ["pass"]),
        "def __repr__(self):",
        "    return self.__class__.__qualname__ + f'(" +
        ", ".join(f"{n}={{self.{n}!r}}" for n in shown) + ")'",
        "def __eq__(self, other):",
        "    if other.__class__ is self.__class__:",
        f"        return {values('self', compared)} == {values('other', compared)}",
        "    return NotImplemented",
        "def __hash__(self):",
        f"    return hash({values('self', hashed)})",
    ]) + "\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<record {cls.__qualname__}>", "exec"), env, ns)  # noqa: S102 - ours
    ns["__repr__"] = reprlib.recursive_repr()(ns["__repr__"])
    for name in names:
        fn = ns[name]
        fn.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, fn)


def wire(check: Check = field_checks.anything, default: Any = MISSING, *,
         factory: Any = MISSING, sparse: bool = False, doc: str = "") -> Any:
    """A field carried on the wire, checked by ``check``; without ``default`` or
    ``factory`` it is required. ``sparse``: left off the wire when it has its default."""
    return dataclasses.field(default=default, default_factory=factory, metadata={
        "kind": "wire", "check": check, "sparse": sparse, "doc": doc})


def context(default: Any = MISSING, *, factory: Any = MISSING, doc: str = "") -> Any:
    """A field the receiver fills in (:func:`decode`'s keyword arguments); never sent."""
    return dataclasses.field(default=default, default_factory=factory, metadata={
        "kind": "context", "doc": doc})


def extra(doc: str = "") -> Any:
    """The dict of an *open* record's other fields: an op whose fields are defined by
    whoever serves it (a scheduler extension). They travel at the top level of the
    message, beside the record's own fields."""
    return dataclasses.field(default_factory=dict, metadata={"kind": "extra", "doc": doc})


def message(op: str, *directions: Direction) -> Callable[[type], type]:
    """Class decorator: register the dataclass as the record of ``op`` in each of
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
                raise ValueError(f"{d.name} has two records for {op!r}: {d[op].__name__}, "
                                 f"{cls.__name__}")
            d[op] = cls
            if not d.checked and _has_fast_decoder(spec):
                d.fast.offer(op, functools.partial(_with_allowed, _fast_decoder, spec))
            if spec.extra is None:
                d.with_context.offer(op, functools.partial(_with_allowed, _context_decoder,
                                                           spec, d.checked))
            if "stimulus_id" in spec.context_names:
                d.stamped.add(op)
        return cls
    return register


def _with_allowed(make: Callable[..., Callable], spec: Spec, *args: Any
                  ) -> tuple[Callable, frozenset]:
    """A direction's entry for ``spec``'s op: its generated decoder and the field names it
    takes."""
    return make(spec, *args), spec.allowed


def _spec(op: str, cls: type) -> Spec:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__}: a record must be a dataclass")
    wires: list = []
    contexts: list = []
    extras: list = []
    for f in dataclasses.fields(cls):
        kind = f.metadata.get("kind")
        if kind is None:
            raise TypeError(f"{cls.__name__}.{f.name}: say whether it is wire() or context()")
        required = f.default is MISSING and f.default_factory is MISSING
        default = f.default if f.default_factory is MISSING else f.default_factory()
        if kind == "extra":
            extras.append(f.name)
            continue
        entry = Field(f.name, f.metadata.get("check"), required, default,
                      bool(f.metadata.get("sparse")), f.metadata.get("doc", ""))
        (wires if kind == "wire" else contexts).append(entry)
    if len(extras) > 1:
        raise TypeError(f"{cls.__name__}: one extra() field at most")
    return Spec(op, cls, tuple(wires), tuple(contexts), extras[0] if extras else None,
                frozenset(["op", *(f.name for f in wires)]),
                tuple(f.name for f in wires if f.required),
                tuple((f.name, f.check) for f in wires if f.check is not field_checks.anything),
                frozenset(f.name for f in contexts))


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
            if f.default is None:
                test = f"r.{f.name} is not None"
            elif isinstance(f.default, (dict, list, tuple, set)) and not f.default:
                test = f"r.{f.name}"
            else:
                env[f"D_{f.name}"] = f.default
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
    """``def decode(m): return CLS(key=m["key"], type=m.get("type", D_type))``, compiled once
    per class, for :func:`decode` of an unchecked direction (the client's and the worker's
    hot paths: one ``key-in-memory`` per finished task). A missing required field raises
    ``KeyError``: the general path then names it."""
    factories = {f.name: f.default_factory for f in dataclasses.fields(spec.cls)
                 if f.default_factory is not MISSING}
    env: dict[str, Any] = {"CLS": spec.cls}
    args = []
    for f in spec.wire:
        if f.required:
            args.append(f"{f.name}=m[{f.name!r}]")
        elif f.name in factories:
            env[f"F_{f.name}"] = factories[f.name]
            args.append(f"{f.name}=m[{f.name!r}] if {f.name!r} in m else F_{f.name}()")
        else:
            env[f"D_{f.name}"] = f.default
            args.append(f"{f.name}=m.get({f.name!r}, D_{f.name})")
    src = f"def decode(m):\n    return CLS({', '.join(args)})\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<decode {spec.op}>", "exec"), env, ns)  # noqa: S102 - our own source
    return ns["decode"]


class _Refused(Exception):
    """A generated decoder met a field it cannot take: :func:`decode`'s general path then
    names the problem."""


def _context_decoder(spec: Spec, checked: bool) -> Callable[[dict, dict], Any]:
    """``def decode(m, ctx)``: the record of ``m`` with the receiver's context ``ctx``,
    each field present checked (if ``checked``), compiled once per class and direction.
    The general path of :func:`decode` copies the message, loops over the checks and
    builds the keyword arguments; this does the same work in straight-line code, on
    the path every message takes (``benchmarks/RESULTS.md`` has the figures). Anything
    wrong raises ``_Refused`` or ``KeyError``, and the general path says what."""
    factories = {f.name: f.default_factory for f in dataclasses.fields(spec.cls)
                 if f.default_factory is not MISSING}
    env: dict[str, Any] = {"CLS": spec.cls, "REFUSED": _Refused}
    lines = ["def decode(m, ctx):"]
    for f in spec.wire:
        check = checked and f.check is not None and f.check is not field_checks.anything
        if check:
            env[f"C_{f.name}"] = f.check
        get = [f"v_{f.name} = m[{f.name!r}]"]
        if check:
            get.append(f"if C_{f.name}(v_{f.name}): raise REFUSED")
        if f.required:
            lines += [f"    {line}" for line in get]
            continue
        if f.name in factories:
            env[f"F_{f.name}"] = factories[f.name]
            default = f"F_{f.name}()"
        else:
            env[f"D_{f.name}"] = f.default
            default = f"D_{f.name}"
        lines.append(f"    if {f.name!r} in m:")
        lines += [f"        {line}" for line in get]
        lines += ["    else:", f"        v_{f.name} = {default}"]
    args = ", ".join([f"{f.name}=v_{f.name}" for f in spec.wire] + ["**ctx"])
    lines.append(f"    return CLS({args})")
    ns: dict[str, Any] = {}
    exec(compile("\n".join(lines) + "\n", f"<decode {spec.op} with context>", "exec"),  # noqa: S102
         env, ns)
    return ns["decode"]


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
                except KeyError:
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
            raise MalformedMessage(f"op {op!r} has unknown fields "
                                   f"{', '.join(sorted(short(k) for k in unknown))}")
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


def receive(table: Direction, msg: Any, stimulus: Callable[[str], str], /,
            **context: Any) -> Any:
    """What a server makes of each message that arrives: the record of ``msg``.

    A record that is a state machine's event (it declares a ``stimulus_id``) is given the
    receiver's ``context`` (``worker=`` or ``client=``, ``now=``) and the stimulus id
    ``stimulus(op)`` names for it (``"task-finished-12"``, as distributed's); any other
    record is decoded as it came. The context is in the record from its construction:
    nothing writes a record after it is decoded. Errors are :func:`decode`'s.

    >>> from dataclasses import dataclass
    >>> TICKS = Direction("clock", "machine")
    >>> @message("tick", TICKS)
    ... @dataclass(slots=True)
    ... class Tick:
    ...     now: float = context(0.0)
    ...     stimulus_id: str = context("")
    >>> receive(TICKS, {"op": "tick"}, lambda op: f"{op}-1", now=2.0)
    Tick(now=2.0, stimulus_id='tick-1')
    """
    op = msg.get("op") if msg.__class__ is dict else None
    if op.__class__ is str and op in table.stamped:
        return decode(table, msg, **context, stimulus_id=stimulus(op))
    return decode(table, msg)


# ------------------------------------------------------------------ documentation
def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(f: Field) -> str:
    if f.required:
        return "required"
    text = f"`{f.default!r}`"
    return f"{text}, left out" if f.sparse else text


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def markdown(title: str, intro: str, directions: Iterable[Direction],
             common: dict[str, str] | None = None) -> str:
    """The protocol's reference: a section per direction, a table per op (field, check,
    required or default, meaning). ``common``: meanings of fields that recur (a field's
    own ``doc`` wins)."""
    common = common or {}
    out = [f"# {title}", "", intro.strip(), ""]
    for d in directions:
        out += [f"## {d.name}", ""]
        if d.doc:
            out += [d.doc.strip(), ""]
        if not d.checked:
            out += ["Field values are not checked on arrival (only the op and the field "
                    "names).", ""]
        for op in sorted(d):
            s = _SPECS[d[op]]
            out += [f"### `{op}`", "", f"`{s.cls.__name__}`: {_first_paragraph(s.cls.__doc__)}",
                    ""]
            rows = [(f"`{f.name}`", _cell(describe(f.check) if f.check else ""), _default(f),
                     _cell(f.doc or common.get(f.name, ""))) for f in s.wire]
            if s.extra is not None:
                rows.append(("*others*", "any", "optional", _extra_doc(s)))
            if rows:
                out += ["| field | type | required / default | meaning |",
                        "| --- | --- | --- | --- |"]
                out += [f"| {' | '.join(r)} |" for r in rows]
            else:
                out.append("No fields.")
            if s.context:
                names = ", ".join(f"`{f.name}`" for f in s.context)
                out += ["", f"Filled in by the receiver (not sent): {names}."]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _extra_doc(s: Spec) -> str:
    f = next(f for f in dataclasses.fields(s.cls) if f.name == s.extra)
    return _cell(f.metadata.get("doc", ""))
