"""``record``: a slots dataclass whose methods are compiled on first call behaves as the
dataclass it stands for."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import pickle
import signal
import subprocess
import sys
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import KW_ONLY, MISSING, InitVar, field
from typing import Any, ClassVar

import pytest

from hpcsched.core.protocol import wire
from hpcsched.core.protocol.wire import record
from tests.conftest import interruptible, worker_env

pytestmark = pytest.mark.timeout(30)


@record
class Base:
    key: str
    deps: list = field(default_factory=list)
    _: KW_ONLY
    stimulus_id: str = ""


@record
class Child(Base):
    _: KW_ONLY
    nbytes: int  # required, after the base's fields with defaults: keyword-only


@record(frozen=True)
class Frozen:
    a: int
    b: tuple = ()


@record
class OwnRepr:
    x: int

    def __repr__(self) -> str:
        return "mine"


def test_methods_match_the_dataclass_they_stand_for():
    @dataclasses.dataclass(slots=True)
    class Plain:
        key: str
        deps: list = field(default_factory=list)
        _: KW_ONLY
        stimulus_id: str = ""

    r, p = Base("k", [1], stimulus_id="s"), Plain("k", [1], stimulus_id="s")
    assert repr(r).replace("Base", "X") == repr(p).replace(Plain.__qualname__, "X")
    assert r == Base("k", [1], stimulus_id="s")
    assert r != Base("k", [2], stimulus_id="s")
    assert r != p  # another class is never equal, as a dataclass's __eq__ says
    assert Base("k").deps == [] and Base("k").deps is not Base("k").deps
    with pytest.raises(TypeError):
        Base("k", [], "s")  # stimulus_id is keyword-only
    with pytest.raises(TypeError, match="unhashable"):
        hash(r)
    assert not hasattr(r, "__dict__") and Base.__slots__ == ("key", "deps", "stimulus_id")


def test_inherited_fields_keyword_only_and_replace():
    c = Child("k", nbytes=3)
    assert [f.name for f in dataclasses.fields(Child)] == ["key", "deps", "stimulus_id",
                                                         "nbytes"]
    assert dataclasses.is_dataclass(c)
    assert dataclasses.replace(c, nbytes=4) == Child("k", nbytes=4)
    assert repr(c) == "Child(key='k', deps=[], stimulus_id='', nbytes=3)"
    with pytest.raises(TypeError, match="nbytes"):
        Child("k")
    # the base's methods were compiled for the base: a child's equality is its own
    assert Base("k") != Child("k", nbytes=0)


def test_positional_patterns_match_the_fields_before_keyword_only_ones():
    match Child("k", [1], nbytes=3):
        case Child(key, deps, nbytes=n):
            assert (key, deps, n) == ("k", [1], 3)
        case _:
            pytest.fail("no match")
    assert Child.__match_args__ == ("key", "deps")


def test_frozen_records_hash_by_value_and_refuse_writes():
    f = Frozen(1, (2,))
    assert f == Frozen(1, (2,)) and hash(f) == hash(Frozen(1, (2,)))
    assert len({Frozen(1), Frozen(1), Frozen(2)}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.a = 2  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(f)) == f


def test_a_record_keeps_its_own_methods_and_pickles():
    assert repr(OwnRepr(1)) == "mine" and OwnRepr(1) == OwnRepr(1)
    c = Child("k", [1], stimulus_id="s", nbytes=2)
    assert pickle.loads(pickle.dumps(c)) == c


def test_every_message_record_builds_from_its_fields():
    """Each record of the protocol and of the state machines builds, compares and prints
    (their methods compiled from their fields on first use)."""
    from hpcsched.core.protocol import messages, wire  # messages: every record registered
    from hpcsched.core.state import events

    assert messages.CLIENT_TO_SCHEDULER
    classes = {s.cls for s in wire._SPECS.values()}
    classes |= {c for c in vars(events).values()
                if isinstance(c, type) and dataclasses.is_dataclass(c)}
    assert len(classes) > 100
    for cls in classes:
        kwargs = {f.name: 0 for f in dataclasses.fields(cls)
                  if f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING}
        a, b = cls(**kwargs), cls(**kwargs)
        assert a == b, cls
        assert repr(a).startswith(cls.__name__ + "("), cls


@pytest.mark.timeout(90)  # beyond the child's 60 s: a slow start under load fails as such
def test_ctrl_c_during_a_record_first_built_at_exit_still_exits_by_sigint(tmp_path):
    """A program ended by Ctrl-C exits by SIGINT even when its cleanup at exit builds a
    record of a kind it had not built (compiling its methods must not make the
    interpreter forget the KeyboardInterrupt)."""
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent("""
        import atexit, os, signal
        from hpcsched.core.protocol.messages import CancelKeys

        atexit.register(lambda: print(repr(CancelKeys(keys=["x"], client="c")), flush=True))
        os.kill(os.getpid(), signal.SIGINT)
    """))
    r = subprocess.run(interruptible([sys.executable, str(script)]), capture_output=True,
                       text=True, timeout=60, env=worker_env())
    assert r.returncode == -signal.SIGINT, r.stderr
    assert "CancelKeys(" in r.stdout and "KeyboardInterrupt" in r.stderr


# ------------------------------------------------ the lean path against dataclass() itself
# ``record`` makes a dataclass with ``wire._lean_dataclass`` where it can, and with
# ``dataclasses.dataclass`` where it cannot (or on a Python whose dataclasses it does not
# know). Each class below is compared as both make it from copies of one class body: what
# ``dataclass()`` decided (parameters, every attribute of every field, the namespace) and
# what instances do.


def _body(cls: type) -> type:
    """A copy of class ``cls`` as its ``class`` statement made it (not yet a dataclass), its
    Field objects copied: dataclasses fills them in."""
    ns = {k: copy.copy(v) if isinstance(v, dataclasses.Field) else v
          for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    ns["__qualname__"] = cls.__qualname__
    return type(cls)(cls.__name__, cls.__bases__, ns)


def _by_dataclass(body: type, frozen: bool) -> type:
    """What ``record`` makes of ``body`` without the lean path."""
    lean, wire._DATACLASSES = wire._DATACLASSES, None
    try:
        return record(body, frozen=frozen)
    finally:
        wire._DATACLASSES = lean


def _comparable(value: Any) -> Any:
    if isinstance(value, types.FunctionType):
        return "function", value.__module__, value.__qualname__, str(inspect.signature(value))
    if isinstance(value, (types.MemberDescriptorType, types.GetSetDescriptorType)):
        return type(value).__name__, value.__name__
    if type(value).__eq__ is object.__eq__:  # one per class made (as an ABC's _abc_impl)
        return type(value).__name__
    return value


def _shape(cls: type) -> dict:
    """What ``dataclass()`` decided about ``cls``, in terms that compare."""
    params = cls.__dataclass_params__
    return {
        "class": (type(cls), cls.__module__, cls.__qualname__, cls.__bases__, cls.__mro__[1:]),
        "params": {name: getattr(params, name) for name in type(params).__slots__},
        "fields": [{name: getattr(f, name) for name in type(f).__slots__}
                   for f in cls.__dataclass_fields__.values()],
        "namespace": {key: _comparable(value) for key, value in vars(cls).items()
                      if key not in ("__dataclass_params__", "__dataclass_fields__")},
        "fields()": [f.name for f in dataclasses.fields(cls)],
    }


def _outcome(fn: Callable, *args: Any) -> Any:
    try:
        return "ok", fn(*args)
    except Exception as e:  # the outcome compared
        return type(e).__name__, str(e)


def _behaviour(cls: type) -> dict:
    """What an instance of record ``cls`` (its required fields 0) does."""
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {f.name: 0 for f in dataclasses.fields(cls)
              if f.default is MISSING and f.default_factory is MISSING}
    r = cls(**kwargs)
    return {
        "repr": repr(r), "asdict": dataclasses.asdict(r), "astuple": dataclasses.astuple(r),
        "equal": r == cls(**kwargs), "hash": _outcome(hash, r),
        # pickle's protocol (pickling itself would look the copies of a class up by name)
        "reduced": r.__reduce_ex__(pickle.HIGHEST_PROTOCOL)[2:],
        "copied": copy.copy(r) == r == copy.deepcopy(r),
        "replaced": _outcome(lambda: dataclasses.replace(r) == r),
        "no __dict__": not hasattr(r, "__dict__"),
        "set a field": _outcome(setattr, r, names[0], 1) if names else None,
        "delete a field": _outcome(delattr, r, names[0]) if names else None,
        "set another": _outcome(setattr, r, "not_a_field", 1),
    }


def _differences(lean: type, dc: type) -> list[str]:
    """How record ``lean`` differs from ``dc``, made by ``dataclass()`` from the same body."""
    out = []
    for what in (_shape, _behaviour):
        a, b = what(lean), what(dc)
        out += [f"{lean.__qualname__}: {key}: {a[key]!r} != {b[key]!r}"
                for key in a if a[key] != b[key]]
    return out


def _twins(body: type, frozen: bool = False) -> tuple[type | None, Any, Any]:
    """``body`` made by the lean path (None if it leaves it to ``dataclass()``), by
    ``record`` and by ``dataclass()``: each a class, or the error it raised."""
    lean = wire._lean_dataclass(_body(body), frozen, {}, wire._DATACLASSES)
    return lean, _outcome(record(frozen=frozen), _body(body)), \
        _outcome(_by_dataclass, _body(body), frozen)


class Fields:
    """Every kind of field a record has: required, defaults, factories, flags, metadata,
    keyword-only ones (by KW_ONLY and by field()), annotations naming a type of the
    module's (``Any``, ``typing.Any``, ``types.SimpleNamespace``)."""

    key: str
    deps: list = field(default_factory=list)
    n: int = 0
    hidden: Any = field(default=1, repr=False, compare=False, hash=True)
    meta: typing.Any = field(default="", metadata={"kind": "wire", "doc": "noted"})
    late: types.SimpleNamespace | None = field(default=None, kw_only=True)
    _: KW_ONLY
    stimulus_id: str = ""
    after: int = field(default_factory=int)


class ChildOfBase(Base):
    """A record's child: the base's fields first, one of them overridden."""

    deps: list = field(default_factory=lambda: [1])
    extra: bytes = b""


class ChildOfFrozen(Frozen):
    """A frozen record's frozen child."""

    c: float = 0.5


class Empty:
    """A record without fields."""


class HasClassVar:
    """A ClassVar is no field (dataclass() tells)."""

    kind: ClassVar[str] = "x"
    key: str = ""


class HasPrefixedClassVar:
    """A ClassVar named through its module (dataclass() tells)."""

    kind: typing.ClassVar[int] = 1
    key: str = ""


class HasInitVar:
    """An InitVar (dataclass() tells)."""

    seed: InitVar[int] = 0
    key: str = ""


class NoDocstring:
    key: str = ""


class MutableDefault:
    """A list as a default: dataclass() refuses it."""

    items: list = []


class TwoKwOnly:
    """KW_ONLY twice: dataclass() refuses it."""

    a: int = 0
    _: KW_ONLY
    b: int = 0
    __: KW_ONLY


class FieldWithoutAnnotation:
    """A field() without annotation: dataclass() refuses it."""

    a = field(default=0)


class FrozenChildOfMutable(Base):
    """A frozen child of a mutable record: dataclass() refuses it."""


class Meta(type):
    """A metaclass: it makes the class again, as ABCMeta does."""


class HasMetaclass(metaclass=Meta):
    """A class of another metaclass (dataclass() makes it)."""

    key: str = ""


class PrefixedKwOnly:
    """KW_ONLY named through its module (dataclass() tells: it looks ``KW_ONLY`` up here)."""

    a: int = 0
    _: dataclasses.KW_ONLY
    b: int = 0


#: annotations that are objects, not text (a module without ``from __future__ import
#: annotations``)
NotText = type("NotText", (), {"__module__": __name__, "__doc__": "Objects annotate.",
                               "__annotations__": {"a": int, "_": KW_ONLY, "b": str | None},
                               "b": None})
NotTextClassVar = type("NotTextClassVar", (), {"__module__": __name__, "__doc__": "A ClassVar.",
                                               "__annotations__": {"a": ClassVar[int]}})

LEAN = [(Fields, False), (Fields, True), (ChildOfBase, False), (ChildOfFrozen, True),
        (Empty, False), (Empty, True), (NotText, False)]
LEFT_TO_DATACLASS = [(HasClassVar, False), (HasPrefixedClassVar, False), (HasInitVar, False),
                     (NoDocstring, False), (MutableDefault, False), (TwoKwOnly, False),
                     (FieldWithoutAnnotation, False), (FrozenChildOfMutable, True),
                     (PrefixedKwOnly, False), (NotTextClassVar, False), (HasMetaclass, False)]


@pytest.mark.skipif(wire._DATACLASSES is None, reason="records are made by dataclass() here")
@pytest.mark.parametrize(("body", "frozen"), LEAN + LEFT_TO_DATACLASS,
                         ids=lambda x: getattr(x, "__name__", str(x)))
def test_a_class_made_by_the_lean_path_is_the_one_dataclass_makes(body, frozen):
    """The lean path makes what ``dataclass()`` makes of the same class body, or leaves the
    class to it (a ClassVar or InitVar, no docstring) and ``record`` then makes it, or
    raises, as ``dataclass()`` does."""
    lean, made, by_dataclass = _twins(body, frozen)
    assert (lean is not None) == ((body, frozen) in LEAN)
    if made[0] != "ok" or by_dataclass[0] != "ok":
        assert made == by_dataclass and (body, frozen) in LEFT_TO_DATACLASS
        return
    assert _differences(made[1], by_dataclass[1]) == []
    if body is HasClassVar:
        assert made[1].kind == "x" and [f.name for f in dataclasses.fields(made[1])] == ["key"]


@pytest.mark.skipif(wire._DATACLASSES is None, reason="records are made by dataclass() here")
def test_every_record_is_made_by_the_lean_path_as_dataclass_makes_it():
    """In a process importing the protocol and the state machines, every record (those in
    the registry of messages among them) is made by the lean path, and is what
    ``dataclass()`` makes of a copy of its class body: the same fields, parameters,
    namespace, and instances that do the same."""
    script = textwrap.dedent("""
        import json, sys
        from tests.core.protocol import test_record as t
        print(json.dumps(t.records_made_twice()))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, env=worker_env())
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["records"] > 100 and report["unmade"] == []
    assert report["left to dataclass()"] == []
    assert report["differences"] == []


def records_made_twice() -> dict:
    """Import the records as a process does, each made by ``record`` and, beside it, by
    ``dataclass()`` from a copy of its class body; say how they differ. For a process that
    has not imported them."""
    assert "hpcsched.core.protocol.client" not in sys.modules
    made: list[type] = []
    differences: list[str] = []
    left: list[str] = []

    def twice(cls: type | None = None, /, *, frozen: bool = False) -> Any:
        def wrap(body: type) -> type:  # compared as record returns it (message() adds op)
            copied = _body(body)
            made.append(record(body, frozen=frozen))
            differences.extend(_differences(made[-1], _by_dataclass(copied, frozen)))
            return made[-1]
        return wrap if cls is None else wrap(cls)

    def lean(cls: type, *args: Any) -> type | None:
        lean_made = lean_dataclass(cls, *args)
        if lean_made is None:
            left.append(cls.__qualname__)
        return lean_made

    lean_dataclass, wire._lean_dataclass = wire._lean_dataclass, lean
    wire.record = twice
    import hpcsched.core.protocol.messages  # noqa: F401
    import hpcsched.core.state.events  # noqa: F401
    return {"records": len(made), "left to dataclass()": left, "differences": differences,
            "unmade": sorted(s.cls.__qualname__ for s in wire._SPECS.values()
                             if s.cls not in made)}


def test_without_the_lean_path_dataclass_makes_the_records(monkeypatch):
    """Where the lean path is off (a Python whose dataclasses lacks what it needs, or is
    newer than it knows), ``record`` makes records with ``dataclass()``: the same classes."""
    monkeypatch.setattr(wire, "_DATACLASSES", None)
    made = record(_body(Fields))
    frozen = record(frozen=True)(_body(ChildOfFrozen))
    assert made.__match_args__ == ("key", "deps", "n", "hidden", "meta")
    assert made("k", stimulus_id="s") == made("k", stimulus_id="s", after=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen(1).c = 1.5  # type: ignore[misc]
    # dataclasses compiled __setattr__: the lean path's is a closure of wire's
    assert frozen.__setattr__.__code__.co_filename != wire.__file__
    for cls in (made, frozen):
        assert _behaviour(cls)["copied"] and _behaviour(cls)["replaced"] == ("ok", True)


def test_the_lean_path_is_off_where_dataclasses_differs(monkeypatch):
    """The lean path needs dataclasses' private parts as Pythons 3.10 to 3.13 have them: off
    where one is missing, and from Python 3.14 on."""
    assert (wire._dataclasses() is not None) == (sys.version_info < (3, 14))
    monkeypatch.delattr(dataclasses, "_FIELD")
    assert wire._dataclasses() is None
    monkeypatch.undo()
    monkeypatch.setattr(sys, "version_info", (3, 14, 0, "final", 0))
    assert wire._dataclasses() is None


def test_a_record_first_built_by_two_threads_at_once_is_built_by_both():
    # a thread that found the stand-in __init__ while another compiled the methods
    @record
    class Pair:
        """Two numbers."""

        a: int
        b: int = 2

    stand_in = Pair.__init__
    made = Pair.__new__(Pair)
    Pair(1)  # compiles: the stand-in is gone from the class
    stand_in(made, 3)  # as the second thread, which looked __init__ up before that
    assert (made.a, made.b) == (3, 2) and made == Pair(3)
