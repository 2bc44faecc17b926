"""The wire protocol: every op is a record, records round-trip, malformed messages have one
error path, and the reference in docs/protocol.md is the records' own."""

from __future__ import annotations

import ast
import dataclasses
import doctest
import re
from pathlib import Path

import pytest

from hpcsched.core.protocol import annotations as message_checks
from hpcsched.core.protocol import checks as field_checks
from hpcsched.core.protocol import dispatch, records, run_spec, wire
from hpcsched.core.protocol import messages as protocol
from hpcsched.core.protocol.messages import MalformedMessage, decode, encode
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.state import events as ev
from tests.core.protocol.examples import example

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "hpcsched"

RECORDS = sorted({(d.name, op, cls) for d in protocol.DIRECTIONS for op, cls in d.items()},
                 key=lambda t: (t[0], t[1]))
ALL_OPS = {op for d in protocol.DIRECTIONS for op in d}

def direction(name: str) -> wire.Direction:
    return next(d for d in protocol.DIRECTIONS if d.name == name)


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize(("where", "op", "cls"), RECORDS,
                         ids=[f"{w}:{op}" for w, op, _ in RECORDS])
def test_every_record_round_trips(where, op, cls):
    record, context = example(cls)
    msg = encode(record)
    assert msg["op"] == op == cls.op
    assert not set(msg) & set(context), "context fields never travel"
    assert decode(direction(where), msg, **context) == record
    # and what decode gives encodes to the same message (nothing is lost or added)
    assert encode(decode(direction(where), dict(msg), **context)) == msg


def test_a_missing_optional_field_takes_its_default():
    got = decode(protocol.WORKER_TO_SCHEDULER, {"op": "task-finished", "key": "x"},
                 worker="w", now=1.0)
    assert got == ev.TaskFinished("w", "x", 0, "", 0.0, 0.0, now=1.0, stimulus_id="")


def test_sparse_fields_are_left_off_the_wire_when_they_have_their_default():
    assert encode(protocol.ComputeTask("x", b"spec", (0, 1))) == {
        "op": "compute-task", "key": "x", "run_spec": b"spec", "priority": (0, 1),
        "duration": 0.5}
    assert encode(protocol.AddKeys("w", {"x": 8})) == {"op": "add-keys", "keys": {"x": 8}}
    assert encode(protocol.AddKeys("w", {"x": 8}, "s-1"))["scatter_id"] == "s-1"
    assert encode(protocol.Close("retired")) == {"op": "close", "reason": "retired"}
    assert encode(protocol.Close("failed", 1))["exit_code"] == 1


def test_an_open_record_carries_its_other_fields_beside_its_own():
    msg = {"op": "extension", "extension": "diagnostics", "request_id": "r", "what": "status"}
    got = decode(protocol.CLIENT_TO_SCHEDULER, msg)
    assert got == protocol.Extension("diagnostics", "r", {"what": "status"})
    assert encode(got) == msg
    # the record's own fields win over an extra one of the same name
    reply = protocol.ExtensionReply("r", {"request_id": "forged", "op": "x", "error": "no"})
    assert encode(reply) == {"op": "extension-reply", "request_id": "r", "error": "no"}


def test_context_fields_are_not_encoded_and_cannot_be_sent():
    record = ev.TaskFinished("tcp://w:1", "x", 8, now=3.0, stimulus_id="task-finished-x")
    assert encode(record) == {"op": "task-finished", "key": "x", "nbytes": 8, "typename": "",
                              "start": 0.0, "stop": 0.0}
    # a peer cannot say who it is or when it spoke: the receiver does
    forged = {"op": "task-finished", "key": "x", "worker": "tcp://other:1"}
    with pytest.raises(MalformedMessage, match=r"task-finished.*'worker'"):
        decode(protocol.WORKER_TO_SCHEDULER, forged, worker="tcp://w:1")


def test_a_wrong_context_field_is_the_receivers_mistake():
    msg = {"op": "task-started", "key": "x"}
    with pytest.raises(TypeError, match="client"):
        decode(protocol.WORKER_TO_SCHEDULER, msg, client="c")
    with pytest.raises(TypeError, match="worker"):
        decode(protocol.WORKER_TO_SCHEDULER, msg)


# ------------------------------------------------------------------ the one error path
@pytest.mark.parametrize(("msg", "says"), [
    (["not", "a", "dict"], "expected an op dict, got list"),
    ({"op": "no-such-op"}, "unknown op 'no-such-op' (worker -> scheduler)"),
    ({"op": ["unhashable"]}, "unknown op ['unhashable']"),
    ({"key": "x"}, "unknown op None"),
    ({"op": "missing-data", "key": "x"}, "op 'missing-data' lacks the field 'errant_worker'"),
    ({"op": "task-started", "key": "x", "colour": 1},
     "op 'task-started' has unknown fields 'colour'"),
    ({"op": "task-finished", "key": "x", "nbytes": -1},
     "op 'task-finished', field 'nbytes': expected an integer >= 0, got -1"),
    ({"op": "task-finished", "key": ["unhashable"]}, "op 'task-finished', field 'key'"),
    ({"op": "add-keys", "keys": {"x": "big"}}, "op 'add-keys', field 'keys'"),
])
def test_malformed_messages_raise_one_error_naming_op_and_field(msg, says):
    with pytest.raises(MalformedMessage) as info:
        decode(protocol.WORKER_TO_SCHEDULER, msg, worker="w")
    assert says in str(info.value)


@pytest.mark.parametrize(("where", "op", "cls"),
                         [r for r in RECORDS if direction(r[0]).checked],
                         ids=[f"{w}:{op}" for w, op, _ in RECORDS if direction(w).checked])
def test_every_checked_field_refuses_a_wrong_type(where, op, cls):
    record, context = example(cls)
    msg = encode(record)
    for f in protocol.spec(cls).wire:
        if f.check is field_checks.anything:
            continue
        bad = {**msg, f.name: object()}
        with pytest.raises(MalformedMessage, match=f"op '{op}', field '{f.name}'"):
            decode(direction(where), bad, **context)


def test_directions_the_receiver_trusts_check_names_not_values():
    # a worker does not re-check what its scheduler sends (a hot path), but an unknown
    # field or op is still refused
    odd = {"op": "compute-task", "key": "x", "run_spec": None, "duration": "soon"}
    assert decode(protocol.SCHEDULER_TO_WORKER, odd).duration == "soon"
    with pytest.raises(MalformedMessage, match="unknown fields"):
        decode(protocol.SCHEDULER_TO_WORKER, {**odd, "colour": 1})


# ------------------------------------------------------------------ no op without a record
OP_PATTERNS = [
    re.compile(r"""["']op["']\s*:\s*["']([a-z][\w-]*)["']"""),  # {"op": "compute-task"}
    re.compile(r"""(?:\bop|\[["']op["']\]|\.get\(["']op["']\))\s*[!=]=\s*["']([a-z][\w-]*)["']"""),
]
OP_TUPLES = re.compile(r"""(?:\bop|\.get\(["']op["']\))\s+(?:not\s+)?in\s+\(([^)]*)\)""")


def ops_in_source(text: str) -> set[str]:
    """Op strings a module sends or dispatches on: ``"op": "..."`` literals and ``op ==``,
    ``op in (...)`` comparisons."""
    found = {m for p in OP_PATTERNS for m in p.findall(text)}
    for group in OP_TUPLES.findall(text):
        found.update(re.findall(r"""["']([a-z][\w-]*)["']""", group))
    return found


def test_the_op_scanner_finds_sends_and_dispatches():
    text = '''send({"op": "brand-new", "x": 1})
if msg.get("op") == "other-op": pass
elif op in ("a-op", "b-op"): pass
if msg["op"] != "fourth": pass'''
    assert ops_in_source(text) == {"brand-new", "other-op", "a-op", "b-op", "fourth"}


def test_every_op_in_the_source_has_a_record():
    """A new op cannot be sent or handled without a record (and so a line in the docs)."""
    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "core" / "protocol" / "wire.py":  # its doctest registers a toy op of its own
            continue
        for op in ops_in_source(path.read_text()):
            found.setdefault(op, []).append(str(path.relative_to(ROOT)))
    assert {"compute-task", "extension"} <= set(found)
    missing = {op: where for op, where in found.items() if op not in ALL_OPS}
    assert not missing, f"ops without a record in hpcsched.core.protocol.messages: {missing}"


def test_every_record_a_server_dispatches_is_one_it_receives():
    from hpcsched.core.scheduler.control import ClusterControl
    from hpcsched.core.scheduler.primitives import Primitives
    from hpcsched.core.scheduler.server import Scheduler
    from hpcsched.core.worker.control import WorkerControl
    from hpcsched.core.worker.server import Worker

    inbound = set(protocol.CLIENT_TO_SCHEDULER.values()) | \
        set(protocol.WORKER_TO_SCHEDULER.values())
    # one table: every record a registered peer may send has its handler, and nothing else
    assert set(Scheduler.handlers.table) == \
        inbound - {protocol.RegisterWorker, protocol.RegisterClient}
    assert set(ClusterControl.handlers.table) <= inbound
    assert set(Primitives.handlers.table) <= inbound
    assert set(Worker.handlers.table) == set(protocol.SCHEDULER_TO_WORKER.values())
    assert set(WorkerControl.handlers.table) <= set(protocol.SCHEDULER_TO_WORKER.values())


def test_no_op_strings_and_no_names_from_messages_outside_the_protocol():
    """Receivers dispatch by record type: outside hpcsched/core/protocol/ no code reads or
    writes a message's op (the string ``"op"``, a record's ``.op``, an op table), and no
    handler is looked up by a name made of one (``getattr`` on an f-string)."""
    protocol_dir = PACKAGE / "core" / "protocol"
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        # an extension's request is an open dict: extensions.py hands it over as one
        if protocol_dir in path.parents or path.name == "extensions.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            what = None
            if isinstance(node, ast.Constant) and node.value == "op":
                what = 'the string "op"'
            elif isinstance(node, ast.Attribute) and node.attr == "op":
                what = "a record's .op"
            elif isinstance(node, ast.Name) and node.id.endswith("OPS"):
                what = f"an op table {node.id}"
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" \
                    and any(isinstance(a, ast.JoinedStr) for a in node.args):
                what = "getattr on an f-string"
            if what:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {what}")
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------ events are the records
def test_the_state_machines_events_are_the_protocols_records():
    assert ev.TaskFinished is protocol.TaskFinished and ev.ComputeTask is protocol.ComputeTask
    assert ev.UpdateGraph is protocol.UpdateGraph and ev.FreeKeys is protocol.FreeKeys
    assert ev.MalformedMessage is protocol.MalformedMessage


def test_every_event_has_a_stimulus_id():
    commands = {ev.Send, ev.Execute, ev.GatherDep, ev.Resume, ev.RunRanges, ev.Interrupt}
    events = [obj for obj in vars(ev).values()
              if isinstance(obj, type) and issubclass(obj, records.Record)
              and obj not in commands and obj is not records.Record]
    assert len(events) > 30
    for cls in events:
        f = {f.name: f for f in records.fields(cls)}.get("stimulus_id")
        assert f is not None and f.default == "", cls.__name__


def test_send_carries_a_dict_or_a_record():
    as_dict = ev.Send("w", {"op": "free-keys", "keys": ["x"]})
    as_record = ev.Send("w", protocol.FreeKeys(["x"]))
    for cmd in (as_dict, as_record):
        assert cmd.match(op="free-keys", keys=["x"], to="w")
        assert not cmd.match(op="compute-task")
        assert not cmd.match(to="v")
        assert cmd.wire() == {"op": "free-keys", "keys": ["x"]}


# ------------------------------------------------------------------ one definition
def test_the_scheduler_decodes_every_inbound_op_with_its_checks():
    # one path: the inbound directions check every field (a worker's or a client's bad
    # message must not break the scheduler for the others), and refuse unknown fields of
    # every op, those the server answers itself included
    assert protocol.WORKER_TO_SCHEDULER.checked and protocol.CLIENT_TO_SCHEDULER.checked
    with pytest.raises(MalformedMessage, match="unknown fields"):
        decode(protocol.CLIENT_TO_SCHEDULER, {"op": "scheduler-info", "request_id": "r",
                                              "later": 1})
    with pytest.raises(MalformedMessage, match="field 'nbytes'"):
        decode(protocol.WORKER_TO_SCHEDULER, {"op": "task-finished", "key": "x",
                                              "nbytes": -1}, worker="w")


def test_an_update_graph_whose_run_spec_is_not_a_run_spec_is_refused_naming_it():
    good = RunSpec(b"f", None)
    msg = {"op": "update-graph", "tasks": {"x": {"run_spec": good, "deps": []}}, "keys": ["x"]}
    assert decode(protocol.CLIENT_TO_SCHEDULER, msg, client="c").tasks["x"]["run_spec"] is good
    for bad in [(b"f", None, False), (b"f", None, False, ("/tmp/x", "x", True)), b"spec"]:
        msg["tasks"] = {"x": {"run_spec": bad, "deps": []}}
        with pytest.raises(MalformedMessage,
                           match=r"op 'update-graph', field 'tasks': entry 'x': run_spec must "
                                 r"be a RunSpec, got " + type(bad).__name__):
            decode(protocol.CLIENT_TO_SCHEDULER, msg, client="c")


def test_a_record_must_say_what_each_field_is():
    table = wire.Direction("a", "b")

    class Vague(records.Record):
        x: int = 0

    @dataclasses.dataclass(slots=True)
    class NotARecord:
        x: int = wire.wire()

    with pytest.raises(TypeError, match="wire"):
        wire.message("vague", table)(Vague)
    with pytest.raises(TypeError, match="must be a Record"):
        wire.message("not-a-record", table)(NotARecord)
    with pytest.raises(ValueError, match="already the record"):
        wire.message("another-name", table)(protocol.FreeKeys)
    assert "vague" not in table and "not-a-record" not in table


@pytest.mark.parametrize("module", [records, run_spec, wire, field_checks, message_checks,
                                    dispatch])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------ the reference
def test_the_reference_documents_every_op_and_is_up_to_date():
    text = protocol.reference()
    for d in protocol.DIRECTIONS:
        assert f"## {d.name}" in text
    for op in ALL_OPS:
        assert f"### `{op}`" in text
    path = ROOT / "docs" / "protocol.md"
    assert path.read_text() == text, (
        "docs/protocol.md is stale: regenerate it with "
        "`python -m hpcsched.core.protocol.messages > docs/protocol.md`")


def test_every_record_says_what_it_means():
    for _, op, cls in RECORDS:
        assert cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("), op
