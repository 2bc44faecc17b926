"""``Record``: a frozen ``msgspec.Struct`` that keeps what each field was declared as."""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from hpcsched.core.protocol import checks, records, wire
from hpcsched.core.protocol.records import Record, context, extra, field, fields
from tests.conftest import interruptible, worker_env

pytestmark = pytest.mark.timeout(30)


class Base(Record, kw_only=True):
    stimulus_id: str = ""


class Child(Base):
    key: str
    deps: list = field(factory=list)


class Declared(Record):
    """A message-like record: each field says what it is."""

    key: Any = wire.wire(checks.key, doc="the key")
    nbytes: int = wire.wire(checks.count, 0, sparse=True)
    who_has: dict = wire.wire(checks.anything, factory=dict)
    worker: str = context("")
    others: dict = extra("the rest")


class OwnRepr(Record):
    x: int

    def __repr__(self) -> str:
        return "mine"


def test_a_record_compares_prints_and_defaults_by_its_fields():
    r = Child("k", [1], stimulus_id="s")
    assert r == Child("k", [1], stimulus_id="s")
    assert r != Child("k", [2], stimulus_id="s")
    assert repr(r) == "Child(key='k', deps=[1], stimulus_id='s')"
    assert Child("k").deps == [] and Child("k").deps is not Child("k").deps
    with pytest.raises(TypeError):
        Child("k", [], "s")  # stimulus_id is keyword-only
    with pytest.raises(TypeError, match="key"):
        Child()  # type: ignore[call-arg]
    assert not hasattr(r, "__dict__")


def test_every_record_is_frozen_hashes_by_value_and_pickles():
    r = Child("k", stimulus_id="s")
    with pytest.raises(AttributeError):
        r.key = "other"  # type: ignore[misc]
    assert records.replace(r, key="j") == Child("j", stimulus_id="s") and r.key == "k"
    assert len({OwnRepr(1), OwnRepr(1), OwnRepr(2)}) == 2  # hashed by value
    with pytest.raises(TypeError, match="unhashable"):
        hash(r)  # as a tuple holding a list is
    assert pickle.loads(pickle.dumps(r)) == r
    assert repr(OwnRepr(1)) == "mine" and OwnRepr(1) == OwnRepr(1)


def test_positional_patterns_match_the_fields_before_keyword_only_ones():
    match Child("k", [1], stimulus_id="s"):
        case Child(key, deps, stimulus_id=sid):
            assert (key, deps, sid) == ("k", [1], "s")
        case _:
            pytest.fail("no match")
    assert Child.__match_args__ == ("key", "deps")


def test_fields_say_what_each_was_declared_as_bases_first():
    assert [(f.name, f.kind, f.required) for f in fields(Child)] == [
        ("stimulus_id", "plain", False), ("key", "plain", True), ("deps", "plain", False)]
    by_name = {f.name: f for f in fields(Declared)}
    assert by_name["key"].check is checks.key and by_name["key"].doc == "the key"
    assert by_name["nbytes"].sparse and by_name["nbytes"].default == 0
    assert by_name["who_has"].example() == {} and by_name["who_has"].required is False
    assert [by_name[n].kind for n in ("worker", "others")] == ["context", "extra"]
    assert Declared("k") == Declared(key="k", nbytes=0, who_has={}, worker="", others={})


def test_every_record_of_the_protocol_and_the_state_machines_is_frozen_and_builds():
    """Each record builds from its required fields, compares, prints and refuses a
    write."""
    from hpcsched.core.protocol import messages  # every record registered
    from hpcsched.core.state import events

    classes = {messages.spec(cls).cls for d in messages.DIRECTIONS for cls in d.values()}
    classes |= {c for c in vars(events).values()
                if isinstance(c, type) and issubclass(c, Record) and c is not Record}
    assert len(classes) > 100
    for cls in classes:
        kwargs = {f.name: 0 for f in fields(cls) if f.required}
        a, b = cls(**kwargs), cls(**kwargs)
        assert a == b, cls
        assert repr(a).startswith(cls.__name__ + "("), cls
        for f in fields(cls)[:1]:  # (some commands have no fields)
            with pytest.raises(AttributeError):
                setattr(a, f.name, 1)


@pytest.mark.timeout(90)  # beyond the child's 60 s: a slow start under load fails as such
def test_ctrl_c_during_a_record_first_encoded_at_exit_still_exits_by_sigint(tmp_path):
    """A program ended by Ctrl-C exits by SIGINT even when its cleanup at exit encodes a
    record of a kind it had not encoded (generating its encoder must not make the
    interpreter forget the KeyboardInterrupt)."""
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent("""
        import atexit, os, signal
        from hpcsched.core.protocol.messages import CancelKeys, encode

        atexit.register(lambda: print(encode(CancelKeys(keys=["x"], client="c")), flush=True))
        os.kill(os.getpid(), signal.SIGINT)
    """))
    r = subprocess.run(interruptible([sys.executable, str(script)]), capture_output=True,
                       text=True, timeout=60, env=worker_env())
    assert r.returncode == -signal.SIGINT, r.stderr
    assert "'cancel-keys'" in r.stdout and "KeyboardInterrupt" in r.stderr
