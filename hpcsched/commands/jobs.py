"""Jobs of command tasks, kept by the scheduler: what ``hpcsched submit`` makes and
``hpcsched job ...`` reads.

A job is an array of one command run once per entry (``--array 1-1000``, the lines of a
file, the items of a JSON list) or a set of numbered tasks with dependencies (a TOML job
file, :mod:`hpcsched.commands.jobfile`). It is published on the scheduler as the dataset ``hpcsched-job-<id>`` (the
futures and a description), so that it outlives the command that submitted it, is seen
by every client, and survives a restart of a scheduler with a journal as every dataset
does. An array job's output goes to the directory ``hpcsched-jobs/%{JOB_ID}`` under the
submitting directory, which the workers must see (a shared file system, as on every
cluster): packed into a log per worker slot with an index of each task's part
(:mod:`hpcsched.commands.slotlog`): making a file costs more than a short command. Given
``--stdout`` / ``--stderr`` templates, and in a job file's tasks (whose dependents read
their files), each task's stdout and stderr go to files of their own (default
``hpcsched-jobs/%{JOB_ID}/%{TASK_ID}.stdout`` / ``.stderr``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcsched.commands.jobfile import JobFile
from hpcsched.commands.run import run_command
from hpcsched.commands.slotlog import JobLogs

PREFIX = "hpcsched-job-"
DEFAULT_DIR = os.path.join("hpcsched-jobs", "%{JOB_ID}")
DEFAULT_OUTPUT = os.path.join(DEFAULT_DIR, "%{TASK_ID}")


@dataclass(frozen=True)
class Spec:
    """How each task of a job runs its command (the same for every task of an array)."""

    args: tuple[str, ...] | str
    job_id: int
    cwd: str
    stdout: str | None
    stderr: str | None
    env: tuple[tuple[str, str], ...] = ()
    #: where the slot logs go when neither stdout nor stderr is given
    log_dir: str | None = None


def run_entry(spec: Spec, task_id: Any, entry: Any = None, *after: Any) -> Any:
    """One task of a job: its command, for ``task_id`` / ``entry``. ``after`` are the
    results of the tasks it depends on (a TOML job file's ``after``): waited for, unused."""
    return run_command(spec.args, cwd=spec.cwd, env=dict(spec.env), stdout=spec.stdout,
                       stderr=spec.stderr, task_id=task_id, entry=entry, job_id=spec.job_id,
                       log_dir=spec.log_dir)


@dataclass
class Job:
    """A job as the scheduler keeps it (the published dataset's value)."""

    id: int
    name: str
    args: Any
    cwd: str
    stdout: str
    stderr: str
    submitted: float
    ids: list = field(default_factory=list)
    futures: list = field(default_factory=list)
    #: a job file's tasks with output templates of their own: str(task id) -> (stdout, stderr)
    outputs: dict = field(default_factory=dict)
    #: the directory of the slot logs, for a job whose output is packed there
    log_dir: str | None = None

    def logs(self) -> JobLogs | None:
        """The job's slot logs as they are now; None if its tasks write files of their own."""
        return JobLogs(self.log_dir) if self.log_dir else None

    def output_path(self, task_id: Any, stream: str) -> str:
        own = self.outputs.get(str(task_id)) if self.outputs else None
        template = (own or (self.stdout, self.stderr))[0 if stream == "stdout" else 1]
        path = template.replace("%{JOB_ID}", str(self.id)).replace("%{TASK_ID}", str(task_id))
        return path if os.path.isabs(path) else os.path.join(self.cwd, path)

    def future(self, task_id: Any) -> Any:
        for i, f in zip(self.ids, self.futures, strict=True):
            if str(i) == str(task_id):
                return f
        raise KeyError(f"job {self.id} has no task {task_id!r} (its ids: {_span(self.ids)})")


def _span(ids: Sequence) -> str:
    if not ids:
        return "none"
    return f"{ids[0]} .. {ids[-1]}" if len(ids) > 3 else ", ".join(map(str, ids))


def entries_of_lines(path: str) -> list[str]:
    """``--each-line FILE``: one task per line that is not blank; the entry is the line."""
    with open(path) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def entries_of_json(path: str) -> list[Any]:
    """``--from-json FILE``: one task per item of the JSON list; the entry is the item's
    JSON text (what ``$HPCSCHED_ENTRY`` holds)."""
    with open(path) as f:
        items = json.load(f)
    if not isinstance(items, list):
        raise ValueError(f"--from-json {path}: expected a JSON list, got {type(items).__name__}")
    return [json.dumps(x) for x in items]


def next_id(client: Any) -> int:
    taken = [int(n[len(PREFIX):]) for n in client.list_datasets()
             if n.startswith(PREFIX) and n[len(PREFIX):].isdigit()]
    return max(taken, default=0) + 1


def submit(client: Any, args: Sequence[str] | str, *, ids: Sequence[Any],
           entries: Sequence[Any] | None = None, name: str | None = None,
           cwd: str | None = None, stdout: str | None = None, stderr: str | None = None,
           env: dict[str, str] | None = None, resources: Mapping[str, float] | None = None,
           retries: int | None = None, priority: int = 0) -> Job:
    """Submit an array job: ``args`` once per id (and entry); returns the published job."""
    from hpcsched.core.client.coordination import Lock

    cwd = os.path.abspath(cwd or os.getcwd())
    with Lock("hpcsched-job-ids", client=client):
        job_id = next_id(client)
        packed = not stdout and not stderr
        log_dir = os.path.join(cwd, DEFAULT_DIR.replace("%{JOB_ID}", str(job_id)))
        spec = Spec(args if isinstance(args, str) else tuple(args), job_id, cwd,
                    None if packed else stdout or DEFAULT_OUTPUT + ".stdout",
                    None if packed else stderr or DEFAULT_OUTPUT + ".stderr",
                    tuple(sorted((env or {}).items())), log_dir if packed else None)
        n = len(ids)
        entry_list = list(entries) if entries is not None else [None] * n
        # a key prefix, not a key per task: a plain map of many elements takes the bulk
        # road (hpcsched.core.state.bulk), at a task farm's speed
        futures = client.map(run_entry, [spec] * n, list(ids), entry_list,
                             key=f"{PREFIX}{job_id}", pure=False, resources=resources,
                             retries=retries or 0, priority=priority)
        job = Job(job_id, name or _default_name(args), spec.args, cwd,
                  spec.stdout or DEFAULT_OUTPUT + ".stdout",
                  spec.stderr or DEFAULT_OUTPUT + ".stderr", time.time(), list(ids), futures,
                  log_dir=spec.log_dir)
        client.publish_dataset(**{f"{PREFIX}{job_id}": job})
    return job


def submit_file(client: Any, jf: JobFile, path: str, *, name: str | None = None,
                cwd: str | None = None) -> Job:
    """Submit a job file's job (:mod:`hpcsched.commands.jobfile`): its ``[array]`` as
    :func:`submit` does, or each ``[[task]]`` as a task depending on the tasks of its
    ``deps``; returns the published job."""
    from hpcsched.core.client.coordination import Lock

    if jf.array is not None:
        a = jf.array
        return submit(client, a.command, ids=a.ids, entries=a.entries, name=name or jf.name,
                      cwd=cwd or jf.cwd, stdout=a.stdout, stderr=a.stderr, env=dict(a.env),
                      resources=a.resources, retries=a.retries, priority=a.priority)
    cwd = os.path.abspath(cwd or jf.cwd or os.getcwd())
    out_default, err_default = DEFAULT_OUTPUT + ".stdout", DEFAULT_OUTPUT + ".stderr"
    with Lock("hpcsched-job-ids", client=client):
        job_id = next_id(client)
        futures: dict[int, Any] = {}
        outputs = {}
        for t in jf.tasks:  # dependencies first: their futures are the dependents' arguments
            spec = Spec(t.command, job_id, cwd, t.stdout or out_default, t.stderr or err_default,
                        t.env)
            futures[t.id] = client.submit(
                run_entry, spec, t.id, None, *(futures[d] for d in t.deps),
                key=f"{PREFIX}{job_id}-{t.id}", pure=False, resources=t.resources,
                retries=t.retries, priority=t.priority)
            if t.stdout or t.stderr:
                outputs[str(t.id)] = (spec.stdout, spec.stderr)
        ids = sorted(futures)
        job = Job(job_id, name or jf.name or os.path.splitext(os.path.basename(path))[0],
                  f"{len(ids)} tasks of {os.path.abspath(path)}", cwd, out_default, err_default,
                  time.time(), ids, [futures[i] for i in ids], outputs)
        client.publish_dataset(**{f"{PREFIX}{job_id}": job})
    return job


def _default_name(args: Any) -> str:
    first = args.split()[0] if isinstance(args, str) and args.split() else (
        args[0] if args else "job")
    return os.path.basename(str(first))


def jobs(client: Any) -> list[Job]:
    names = sorted((n for n in client.list_datasets() if n.startswith(PREFIX)),
                   key=lambda n: int(n[len(PREFIX):]) if n[len(PREFIX):].isdigit() else 0)
    return [client.get_dataset(n) for n in names]


def job(client: Any, job_id: Any) -> Job:
    try:
        return client.get_dataset(f"{PREFIX}{int(job_id)}")
    except (KeyError, ValueError):
        raise KeyError(f"no job {job_id!r} on this scheduler") from None


def counts(futures: Iterable[Any]) -> dict[str, int]:
    out = {"finished": 0, "error": 0, "cancelled": 0, "waiting": 0}
    for f in futures:
        status = f.status
        key = ("finished" if status == "finished" else "error" if status == "error"
               else "cancelled" if status == "cancelled" else "waiting")
        out[key] += 1
    return out
