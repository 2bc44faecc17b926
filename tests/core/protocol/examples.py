"""An example record of every message class, for tests of the wire: each field set to a
value that passes its check and differs from its default, and the receiver's context."""

from __future__ import annotations

from hpcsched.core.protocol import messages as protocol
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.protocol.serialize import serialize

# values to build example records from: for each field, the first that passes its check
# and differs from its default
CANDIDATES = [("x", 1), ["x", ("y", 0)], "text", 3, 2.5, True, False, {"x": 4},
              {"x": ["tcp://w:1"]}, {"GPU": 1.0}, {"x": {"run_spec": RunSpec(b"r", None), "deps": ["y"]}},
              {"a": {"x": 1}}, b"blob", serialize({"x": 1}), [serialize({"x": 1})],
              {"x": serialize(1)}, [2, "w-1"], ["tcp://w:1"], [1, 2], [{"blob": b"v", "keys": []}], [b"blob"],
              {"m-a-": [1, 2]}]
CONTEXT = {"worker": "tcp://w:1", "client": "client-1", "now": 12.5, "stimulus_id": "s-1"}


def example(cls: type) -> tuple[object, dict]:
    """A record of ``cls`` with every wire field set (not to its default), and its context."""
    s = protocol.spec(cls)
    kw = {}
    for f in s.wire:
        kw[f.name] = next(v for v in CANDIDATES
                          if f.check(v) is None and (f.required or v != f.default))
    context = {f.name: CONTEXT[f.name] for f in s.context}
    if s.extra is not None:
        kw[s.extra] = {"what": "status", "limit": 5}
    return cls(**kw, **context), context
