"""Records: the frozen value types of the protocol, the state machines and the rest of the
package (settings, a worker's memory limits, a transport's ``Backend``...).

A record is a :class:`Record`, a ``msgspec.Struct`` (https://jcristharif.com/msgspec/
structs.html): frozen, with ``__slots__``, its ``__init__``, ``__repr__``, ``__eq__`` and
``__hash__`` written in C. Defining one costs a few microseconds, where a
:mod:`dataclasses` class compiles its methods with ``exec`` as it is defined: every rank
of a job imports the protocol's hundred-odd records before its first task, so that cost
is paid on every process at start-up, and a value type on the way of a worker's start
is a record for the same reason.

Nothing writes a record once it is built (``msgspec.structs.replace`` makes a changed
copy): what a receiver knows of a message -- who sent it, when it arrived, the
``stimulus_id`` naming the event -- is given to the record as it is decoded
(:func:`hpcsched.core.protocol.wire.receive`).

A message record declares each field with :func:`wire` (carried on the wire, with its
check from :mod:`hpcsched.core.protocol.checks`), :func:`context` (what the receiver
fills in) or :func:`extra` (the other fields of an open record); a record that is not a
message (a state machine's event or command) uses plain defaults or :func:`field`.
``fields(cls)`` lists what was declared, base classes' fields first.

>>> class Ping(Record):
...     '''A peer says it is alive.'''
...     seq: int = wire(checks.count)
...     now: float = context(0.0)
>>> Ping(3, now=1.5)
Ping(seq=3, now=1.5)
>>> [(f.name, f.kind, f.required) for f in fields(Ping)]
[('seq', 'wire', True), ('now', 'context', False)]
>>> Ping(3).seq = 4
Traceback (most recent call last):
...
AttributeError: immutable type: 'Ping'
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from msgspec import NODEFAULT
from msgspec.structs import replace
from typing_extensions import dataclass_transform

from hpcsched.core.protocol import checks
from hpcsched.core.protocol.checks import Check

__all__ = ["NODEFAULT", "Field", "Record", "context", "extra", "field", "fields", "replace", "wire"]


class Field:
    """One declared field of a record. ``kind``: ``"wire"``, ``"context"``, ``"extra"``, or
    ``"plain"`` (a record that is not a message); ``default`` is ``NODEFAULT`` if the field
    is required, and an example (``factory()``) if it has a ``factory``."""

    __slots__ = ("name", "kind", "check", "default", "factory", "sparse", "doc")

    def __init__(
        self,
        kind: str,
        check: Check | None = None,
        default: Any = NODEFAULT,
        factory: Any = NODEFAULT,
        sparse: bool = False,
        doc: str = "",
    ):
        self.name = ""
        self.kind, self.check, self.default, self.factory = kind, check, default, factory
        self.sparse, self.doc = sparse, doc

    @property
    def required(self) -> bool:
        return self.default is NODEFAULT and self.factory is NODEFAULT

    def example(self) -> Any:
        """The default value (a fresh one from the factory), NODEFAULT if required."""
        return self.default if self.factory is NODEFAULT else self.factory()

    def struct_default(self) -> Any:
        """What the struct's class body holds for this field (nothing if required)."""
        if self.factory is not NODEFAULT:
            return msgspec.field(default_factory=self.factory)
        return self.default

    def __repr__(self) -> str:
        return f"Field({self.name!r}, {self.kind!r})"


@dataclass_transform(frozen_default=True)  # for type checkers: every record is frozen
class RecordMeta(msgspec.StructMeta):
    """Makes a :class:`Record`: the :class:`Field` declarations in the class body become
    the struct's defaults, and the class keeps them (``__record_fields__``, bases first)."""

    def __new__(mcls, name: str, bases: tuple, ns: dict[str, Any], **kw: Any) -> Any:
        annotations = ns.get("__annotations__", {})
        own: dict[str, Field] = {}
        for key, annotation in annotations.items():
            if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
                continue
            value = ns.get(key, NODEFAULT)
            if isinstance(value, Field):
                f = value
            else:
                f = Field("plain", default=value)
            f.name = key
            own[key] = f
            if f.required:
                ns.pop(key, None)
            else:
                ns[key] = f.struct_default()
        inherited: dict[str, Field] = {}
        for base in reversed(bases):
            inherited.update(getattr(base, "__record_fields__", {}))
        ns["__record_fields__"] = {**inherited, **own}
        return super().__new__(mcls, name, bases, ns, **kw)


class Record(msgspec.Struct, metaclass=RecordMeta, frozen=True):
    """Base of every record: frozen, compared and hashed by value, pickled by value."""

    __record_fields__: ClassVar[dict[str, Field]]


def fields(cls: Any) -> tuple[Field, ...]:
    """The declared fields of record class (or record) ``cls``, bases' first."""
    return tuple(cls.__record_fields__.values())


def field(default: Any = NODEFAULT, *, factory: Any = NODEFAULT) -> Any:
    """A field of a record that is not a message, with a default made by ``factory()``
    (a fresh ``dict``, ``list``) or a plain ``default``."""
    return Field("plain", default=default, factory=factory)


def wire(
    check: Check = checks.anything,
    default: Any = NODEFAULT,
    *,
    factory: Any = NODEFAULT,
    sparse: bool = False,
    doc: str = "",
) -> Any:
    """A field carried on the wire, checked by ``check``; without ``default`` or
    ``factory`` it is required. ``sparse``: left off the wire when it has its default."""
    return Field("wire", check, default, factory, sparse, doc)


def context(default: Any = NODEFAULT, *, factory: Any = NODEFAULT, doc: str = "") -> Any:
    """A field the receiver fills in as it decodes the record; never sent."""
    return Field("context", None, default, factory, doc=doc)


def extra(doc: str = "") -> Any:
    """The dict of an *open* record's other fields: an op whose fields are defined by
    whoever serves it (a scheduler extension). They travel at the top level of the
    message, beside the record's own fields."""
    return Field("extra", None, factory=dict, doc=doc)
