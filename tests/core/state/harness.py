"""The words of the state machines' stories: no process, no thread, no clock.

:func:`step` hands one event to a :class:`SchedulerState` or a :class:`WorkerState` and
checks every invariant (``validate()``) after it; the others build the events a story
sends and pick out the commands it expects.

The scheduler's workers are ``tcp://a``, ``tcp://b``, ``tcp://c``; its client is ``c``;
run specs are opaque strings (the state machines never look inside them). The worker is
``tcp://me``; its peers are ``tcp://p1``, ``tcp://p2``.
"""

from __future__ import annotations

from typing import Any

from hpcsched.core.state import events as ev
from hpcsched.core.state.events import Execute, Send
from hpcsched.core.state.scheduler_state import SchedulerState
from hpcsched.core.state.worker_state import WorkerState

A, B, C = "tcp://a", "tcp://b", "tcp://c"
ME, P1, P2 = "tcp://me", "tcp://p1", "tcp://p2"


def step(s: SchedulerState | WorkerState, event: Any) -> list:
    """Handle one event, then check every invariant."""
    out = s.handle(event)
    s.validate()
    return out


# ---------------------------------------------------------------- the scheduler
def new_scheduler(**kw: Any) -> SchedulerState:
    kw.setdefault("work_stealing", False)
    s = SchedulerState(**kw)
    s.validate()
    return s


def with_workers(*addresses: str, nthreads: int = 1, **kw: Any) -> SchedulerState:
    s = new_scheduler(**kw)
    for a in addresses:
        step(s, ev.AddWorker(a, nthreads, name=a.split("//")[1]))
    return s


def sent(out: list[Send], op: str, **kw: Any) -> list[Send]:
    """The commands of ``out`` with this op (and matching fields / ``to=``)."""
    return [m for m in out if m.match(op=op, **kw)]


def one(out: list[Send], op: str, **kw: Any) -> Send:
    found = sent(out, op, **kw)
    assert len(found) == 1, (op, kw, out)
    return found[0]


def graph(**deps: list[str]) -> dict:
    """``graph(x=[], y=["x"])`` -> the ``tasks`` of an update-graph."""
    return {k: {"run_spec": f"spec-{k}", "deps": list(d)} for k, d in deps.items()}


def submit(s: SchedulerState, tasks: dict, keys: list, client: str = "c", **kw: Any
           ) -> list[Send]:
    if client not in s.clients:
        step(s, ev.AddClient(client))
    return step(s, ev.UpdateGraph(client, tasks, keys, **kw))


def finish(s: SchedulerState, worker: str, key: Any, nbytes: int = 8, now: float = 0.0
           ) -> list[Send]:
    """``worker`` starts ``key`` and finishes it at once."""
    step(s, ev.TaskStarted(worker, key, now=now))
    return step(s, ev.TaskFinished(worker, key, nbytes=nbytes, typename="int", start=now,
                                   stop=now + 0.01, now=now))


# ---------------------------------------------------------------- the worker
def new_worker(nthreads: int = 1, **kw: Any) -> WorkerState:
    s = WorkerState(ME, nthreads, **kw)
    s.validate()
    return s


def to_scheduler(out: list, op: str, **kw: Any) -> list[Send]:
    return [c for c in out if type(c) is Send and c.to == "scheduler" and c.match(op=op, **kw)]


def executes(out: list) -> list[Any]:
    return [c.key for c in out if type(c) is Execute]


def compute(key: Any, deps: dict | None = None, priority: tuple = (0,), **kw: Any
            ) -> ev.ComputeTask:
    return ev.ComputeTask(key, f"spec-{key}", priority=priority, who_has=deps or {},
                          nbytes={k: 10 for k in (deps or {})}, **kw)


def success(key: Any, value: Any = 1, nbytes: int = 8) -> ev.ExecuteSuccess:
    return ev.ExecuteSuccess(key, value, nbytes, type(value).__name__, start=1.0, stop=2.0)
