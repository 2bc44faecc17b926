"""``record``: a slots dataclass whose methods are compiled on first call behaves as the
dataclass it stands for."""

from __future__ import annotations

import dataclasses
import pickle
import signal
import subprocess
import sys
import textwrap
from dataclasses import KW_ONLY, field

import pytest

from hpcsched.core.protocol.wire import record
from tests.conftest import worker_env

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
    from hpcsched.core.protocol import wire
    from hpcsched.core.state import events

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
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=60, env=worker_env())
    assert r.returncode == -signal.SIGINT, r.stderr
    assert "CancelKeys(" in r.stdout and "KeyboardInterrupt" in r.stderr
