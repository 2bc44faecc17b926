"""``decode``'s generated per-class decoders (unchecked directions: what the scheduler
sends clients and workers) give exactly what the general path gives, and leave every
malformed message to it."""

from __future__ import annotations

import pytest

from hpcsched.core.protocol import messages as protocol
from hpcsched.core.protocol.messages import MalformedMessage, decode, encode
from hpcsched.core.protocol.wire import receive
from tests.core.protocol.examples import example

FAST = sorted({(d.name, op) for d in protocol.DIRECTIONS for op in d.fast.ops()})


def test_the_unchecked_directions_have_fast_decoders_and_the_checked_none():
    for d in protocol.DIRECTIONS:
        if d.checked:
            assert d.fast.ops() == set(), d
        else:
            assert d.fast.ops(), d
    assert ("scheduler -> client", "key-in-memory") in FAST


@pytest.mark.parametrize(("where", "op"), FAST, ids=[f"{w}:{op}" for w, op in FAST])
def test_fast_and_general_paths_agree(where, op):
    d = next(d for d in protocol.DIRECTIONS if d.name == where)
    cls = d[op]
    record, context = example(cls)  # context fields with defaults only: none required
    full = encode(record)
    general = dict(d)  # a plain dict table: the general (checked) path
    assert decode(d, full) == decode(general, full)  # no context given: the fast path
    assert decode(d, full, **context) == record  # context given: the general path
    minimal = {"op": op, **{f.name: full[f.name] for f in protocol.spec(cls).wire
                            if f.required}}
    a, b = decode(d, minimal), decode(d, minimal)
    assert a == decode(general, minimal)
    for f in protocol.spec(cls).wire:  # a default made by a factory is a fresh object
        if not f.required and isinstance(f.default, (list, dict)):
            assert getattr(a, f.name) is not getattr(b, f.name)


def test_malformed_messages_leave_the_fast_path_and_are_named():
    d = protocol.SCHEDULER_TO_CLIENT
    with pytest.raises(MalformedMessage, match="'key-in-memory' lacks the field 'key'"):
        decode(d, {"op": "key-in-memory", "type": "int"})
    with pytest.raises(MalformedMessage, match="'key-in-memory' has unknown fields 'zz'"):
        decode(d, {"op": "key-in-memory", "key": "x", "zz": 1})
    with pytest.raises(MalformedMessage, match="unknown op"):
        decode(d, {"op": ["unhashable"]})
    with pytest.raises(MalformedMessage, match="unknown op"):
        decode(d, {"key": "x"})
    with pytest.raises(MalformedMessage, match="expected an op dict"):
        decode(d, ["key-in-memory"])


WITH_CONTEXT = sorted({(d.name, op) for d in protocol.DIRECTIONS for op in d.with_context.ops()})


@pytest.mark.parametrize(("where", "op"), WITH_CONTEXT, ids=[f"{w}:{op}" for w, op in WITH_CONTEXT])
def test_context_decoders_and_the_general_path_agree(where, op):
    """With the receiver's context (the scheduler's path for every message), the generated
    decoder gives what the general path gives, for every field set and for only the
    required ones."""
    d = next(d for d in protocol.DIRECTIONS if d.name == where)
    cls = d[op]
    record, context = example(cls)
    names = protocol.spec(cls).context_names
    context.update({k: v for k, v in (("now", 2.5), ("stimulus_id", f"{op}-7")) if k in names})
    general = dict(d)  # a plain dict table has no generated decoders
    full = encode(record)
    assert decode(d, full, **context) == decode(general, full, **context)
    minimal = {"op": op, **{f.name: full[f.name] for f in protocol.spec(cls).wire
                            if f.required}}
    assert decode(d, minimal, **context) == decode(general, minimal, **context)


def test_the_context_decoder_leaves_every_problem_to_the_general_path():
    d = protocol.WORKER_TO_SCHEDULER
    ok = {"op": "task-finished", "key": "x", "nbytes": 8}
    ctx = {"worker": "tcp://w:1", "now": 1.0, "stimulus_id": "s"}
    assert d.with_context["task-finished"]
    with pytest.raises(MalformedMessage, match="field 'nbytes': expected an integer"):
        decode(d, {**ok, "nbytes": -1}, **ctx)
    with pytest.raises(MalformedMessage, match="lacks the field 'key'"):
        decode(d, {"op": "task-finished"}, **ctx)
    with pytest.raises(MalformedMessage, match="unknown fields 'zz'"):
        decode(d, {**ok, "zz": 1}, **ctx)
    with pytest.raises(TypeError, match="no context fields"):
        decode(d, ok, wrker="tcp://w:1", now=1.0)


def test_receive_takes_the_generated_decoder_and_leaves_problems_to_the_general_path():
    """A server's ``receive`` of a state machine's event: the record with the context
    and the stimulus id; a malformed one named as ``decode`` names it."""
    d = protocol.WORKER_TO_SCHEDULER
    ok = {"op": "task-finished", "key": "x", "nbytes": 8, "start": 1.0, "stop": 2.0}
    got = receive(d, ok, lambda op: f"{op}-3", worker="tcp://w:1", now=4.0)
    assert got == decode(dict(d), ok, worker="tcp://w:1", now=4.0, stimulus_id="task-finished-3")
    assert (got.cpu, got.memory, got.typename) == (0.0, 0, "")
    for bad, why in [({**ok, "nbytes": -1}, "field 'nbytes': expected an integer"),
                     ({**ok, "cpu": float("nan")}, "field 'cpu': expected a finite number"),
                     ({"op": "task-finished"}, "lacks the field 'key'"),
                     ({**ok, "zz": 1}, "unknown fields 'zz'")]:
        with pytest.raises(MalformedMessage, match=why):
            receive(d, bad, lambda op: "s", worker="tcp://w:1", now=4.0)


@pytest.mark.parametrize(("field", "value"), [
    ("start", float("inf")), ("start", float("-inf")), ("cpu", float("nan")), ("start", True),
    ("start", "1.0"), ("start", None), ("nbytes", -1), ("nbytes", True), ("nbytes", 1.0),
    ("memory", -(2**70)), ("memory", "8"),
])
def test_the_checks_told_inline_refuse_what_their_check_refuses(field, value):
    """The generated decoder of the scheduler's path tells a finite float and an int >= 0
    inline, without calling their check: every other value still goes to the check, and is
    refused with its name."""
    d = protocol.WORKER_TO_SCHEDULER
    ok = {"op": "task-finished", "key": "x", "nbytes": 8, "start": 1.0, "stop": 2.0,
          "cpu": 0.5, "memory": 2**40}
    got = receive(d, ok, lambda op: "s", worker="tcp://w:1", now=4.0)
    assert (got.nbytes, got.start, got.cpu, got.memory) == (8, 1.0, 0.5, 2**40)
    assert receive(d, {**ok, "start": 3, "cpu": 0}, lambda op: "s", worker="tcp://w:1",
                   now=4.0).start == 3  # an int where a number is asked: the check says yes
    with pytest.raises(MalformedMessage, match=f"field '{field}': expected"):
        receive(d, {**ok, field: value}, lambda op: "s", worker="tcp://w:1", now=4.0)
