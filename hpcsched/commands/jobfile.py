"""Job files: a job of different command tasks with dependencies, in TOML.

The format follows HyperQueue's job definition file (``hq job submit-file``,
https://it4innovations.github.io/hyperqueue/stable/jobs/jobfile/), for the keys that
mean something here::

    name = "pipeline"          # optional: the job's name
    cwd = "/scratch/run"       # optional: the tasks' directory (default: the submitter's)

    [[task]]
    id = 0                     # optional: 0, 1, ... in order when left out
    command = ["./prepare", "--out", "data"]   # a list, or a string run by /bin/sh -c
    env = { SEED = "17" }
    stdout = "logs/%{TASK_ID}.out"             # templates as hpcsched submit --stdout
    stderr = "logs/%{TASK_ID}.err"
    priority = 1
    retries = 2
    resources = { GPU = 1 }    # or HyperQueue's [[task.request]] resources = {...}

    [[task]]
    id = 1
    command = "./simulate --input data"
    deps = [0]                 # runs once task 0 has succeeded

Each task is one task of the scheduler, its ``deps`` its dependencies: a task whose
dependency failed fails too, naming it. ``[array]`` (``ids = "1-100"`` and/or
``entries = [...]``, ``command``, ``env``, ...) makes an array job, as ``hpcsched
submit --array`` does. Every key is checked: an unknown one, a wrong type, a duplicate
id, a dependency on a task that is not in the file or a cycle is an error naming the
task and the key, raised before anything is submitted.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a package, before Python 3.11
    try:
        import tomli as tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:
        tomllib = None

_JOB_KEYS = {"name", "cwd", "task", "array", "max_fails", "stream"}
_TASK_KEYS = {"id", "command", "env", "stdout", "stderr", "deps", "priority", "retries",
              "resources", "request"}
_ARRAY_KEYS = {"ids", "entries", "command", "env", "stdout", "stderr", "priority", "retries",
               "resources", "request"}


class JobFileError(ValueError):
    """A job file that cannot be submitted as it is; the message names where."""


@dataclass(frozen=True)
class TaskDef:
    """One ``[[task]]`` of a job file."""

    id: int
    command: tuple[str, ...] | str
    env: tuple[tuple[str, str], ...] = ()
    stdout: str | None = None
    stderr: str | None = None
    deps: tuple[int, ...] = ()
    priority: int = 0
    retries: int = 0
    resources: Mapping[str, float] | None = None


@dataclass(frozen=True)
class ArrayDef:
    """The ``[array]`` of a job file: one command, once per id (and entry)."""

    ids: list[int]
    entries: list[str] | None
    command: tuple[str, ...] | str
    env: tuple[tuple[str, str], ...] = ()
    stdout: str | None = None
    stderr: str | None = None
    priority: int = 0
    retries: int = 0
    resources: Mapping[str, float] | None = None


@dataclass(frozen=True)
class JobFile:
    name: str | None
    cwd: str | None
    tasks: list[TaskDef] = field(default_factory=list)  # dependencies before dependents
    array: ArrayDef | None = None


def load(path: str) -> JobFile:
    """Read and check the job file at ``path``."""
    if tomllib is None:
        raise JobFileError("job files need Python >= 3.11 (tomllib) or `pip install tomli`")
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise JobFileError(f"{path}: not valid TOML: {e}") from None
    return parse(doc, path)


def parse(doc: Mapping[str, Any], where: str = "job file") -> JobFile:
    """A checked :class:`JobFile` from a TOML document's table.

    >>> parse({"task": [{"command": ["true"]}, {"command": "echo $X", "deps": [0]}]}).tasks[1]
    TaskDef(id=1, command='echo $X', env=(), stdout=None, stderr=None, deps=(0,), priority=0, retries=0, resources=None)
    """
    _known(doc, _JOB_KEYS, where)
    name = _opt(doc, "name", str, where)
    cwd = _opt(doc, "cwd", str, where)
    if ("task" in doc) == ("array" in doc):
        raise JobFileError(f"{where}: give either [[task]] tables or one [array] table")
    if "array" in doc:
        return JobFile(name, cwd, array=_array(doc["array"], f"{where}: [array]"))
    raw = doc["task"]
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) for t in raw):
        raise JobFileError(f"{where}: 'task' must be [[task]] tables, at least one")
    tasks = []
    for n, t in enumerate(raw):
        tasks.append(_task(t, n, f"{where}: [[task]] #{n + 1}"))
    return JobFile(name, cwd, tasks=_in_order(tasks, where))


def _known(table: Mapping[str, Any], keys: set[str], where: str) -> None:
    unknown = sorted(set(table) - keys)
    if unknown:
        raise JobFileError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                           f"(known: {', '.join(sorted(keys))})")


def _opt(table: Mapping[str, Any], key: str, kind: type, where: str, default: Any = None) -> Any:
    if key not in table:
        return default
    value = table[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise JobFileError(f"{where}: {key!r} must be a {kind.__name__}, got {value!r}")
    return value


def _command(table: Mapping[str, Any], where: str) -> tuple[str, ...] | str:
    if "command" not in table:
        raise JobFileError(f"{where}: no 'command'")
    cmd = table["command"]
    if isinstance(cmd, str) and cmd.strip():
        return cmd
    if isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd):
        return tuple(cmd)
    raise JobFileError(f"{where}: 'command' must be a non-empty list of strings or a "
                       f"string for /bin/sh -c, got {cmd!r}")


def _env(table: Mapping[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    env = _opt(table, "env", dict, where, {})
    for k, v in env.items():
        if not isinstance(v, str | int | float) or isinstance(v, bool) or "=" in k or not k:
            raise JobFileError(f"{where}: env {k!r} = {v!r}: a name and a string value")
    return tuple(sorted((k, str(v)) for k, v in env.items()))


def _resources(table: Mapping[str, Any], where: str) -> Mapping[str, float] | None:
    res = _opt(table, "resources", dict, where)
    request = _opt(table, "request", list, where)
    if request is not None:  # HyperQueue's [[task.request]]: one request (no alternatives)
        if res is not None or len(request) != 1 or not isinstance(request[0], dict):
            raise JobFileError(f"{where}: one [[task.request]] table, or 'resources', not both "
                               "(alternative requests are not supported)")
        _known(request[0], {"resources"}, f"{where}: [[task.request]]")
        res = _opt(request[0], "resources", dict, f"{where}: [[task.request]]", {})
    if res is None:
        return None
    out = {}
    for k, v in res.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise JobFileError(f"{where}: resource {k!r} = {v!r}: a positive number")
        out[str(k)] = float(v)
    return out


def _common(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    retries = _opt(table, "retries", int, where, 0)
    if retries < 0:
        raise JobFileError(f"{where}: 'retries' must be >= 0, got {retries}")
    return {"command": _command(table, where), "env": _env(table, where),
            "stdout": _opt(table, "stdout", str, where), "stderr": _opt(table, "stderr", str, where),
            "priority": _opt(table, "priority", int, where, 0), "retries": retries,
            "resources": _resources(table, where)}


def _task(t: Mapping[str, Any], n: int, where: str) -> TaskDef:
    _known(t, _TASK_KEYS, where)
    task_id = _opt(t, "id", int, where, n)
    if task_id < 0:
        raise JobFileError(f"{where}: 'id' must be >= 0, got {task_id}")
    deps = _opt(t, "deps", list, where, [])
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in deps):
        raise JobFileError(f"{where}: 'deps' must be a list of task ids, got {deps!r}")
    return TaskDef(task_id, deps=tuple(deps), **_common(t, f"{where} (id {task_id})"))


def parse_array(text: str) -> list[int]:
    """HyperQueue's ``--array`` ranges: ``1-1000``, ``1,5,9``, ``0-100:10`` (a step).

    >>> parse_array("1-3,7,10-20:5")
    [1, 2, 3, 7, 10, 15, 20]
    """
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\s*-\s*(\d+)(?::(\d+))?)?\s*", part)
        if not m:
            raise ValueError(f"--array {text!r}: {part!r} is not N, N-M or N-M:STEP")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3) or 1)
        if hi < lo or step < 1:
            raise ValueError(f"--array {text!r}: {part!r} is an empty range")
        out.extend(range(lo, hi + 1, step))
    return out


def _array(a: Any, where: str) -> ArrayDef:
    if not isinstance(a, dict):
        raise JobFileError(f"{where}: must be a table")
    _known(a, _ARRAY_KEYS, where)
    entries = _opt(a, "entries", list, where)
    if entries is not None:
        entries = [e if isinstance(e, str) else str(e) for e in entries]
    ids_text = _opt(a, "ids", str, where)
    if ids_text is not None:
        try:
            ids = parse_array(ids_text)
        except ValueError as e:
            raise JobFileError(f"{where}: 'ids': {e}") from None
    elif entries is not None:
        ids = list(range(len(entries)))
    else:
        raise JobFileError(f"{where}: give 'ids' (e.g. \"1-100\") or 'entries'")
    if entries is not None and len(entries) != len(ids):
        raise JobFileError(f"{where}: {len(ids)} ids for {len(entries)} entries")
    return ArrayDef(ids, entries, **_common(a, where))


def _in_order(tasks: list[TaskDef], where: str) -> list[TaskDef]:
    """The tasks, each after its dependencies; a duplicate id, an unknown dependency or a
    cycle is named."""
    by_id: dict[int, TaskDef] = {}
    for t in tasks:
        if t.id in by_id:
            raise JobFileError(f"{where}: two tasks have id {t.id}")
        by_id[t.id] = t
    for t in tasks:
        missing = [d for d in t.deps if d not in by_id]
        if missing:
            raise JobFileError(f"{where}: task {t.id} depends on {missing}, not in the file")
        if t.id in t.deps:
            raise JobFileError(f"{where}: task {t.id} depends on itself")
    order: list[TaskDef] = []
    state: dict[int, int] = {}  # 1: being visited, 2: placed
    for root in tasks:
        if state.get(root.id):
            continue
        stack: list[tuple[TaskDef, int]] = [(root, 0)]
        state[root.id] = 1
        while stack:
            t, i = stack.pop()
            if i < len(t.deps):
                stack.append((t, i + 1))
                d = by_id[t.deps[i]]
                if state.get(d.id) == 1:
                    path = [s.id for s, _ in stack] + [d.id]
                    raise JobFileError(f"{where}: the dependencies make a cycle: "
                                       + " -> ".join(map(str, path[path.index(d.id):])))
                if not state.get(d.id):
                    state[d.id] = 1
                    stack.append((d, 0))
            else:
                state[t.id] = 2
                order.append(t)
    return order
