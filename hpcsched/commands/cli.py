"""``hpcsched submit`` and ``hpcsched job ...``: jobs of command tasks from a shell.

    hpcsched submit [--scheduler-file F | --address A] [--array 1-1000 | --each-line FILE
                    | --from-json FILE | --file JOB.toml] [--name N] [--cwd DIR] [--stdout T] [--stderr T]
                    [--env K=V ...] [--resources GPU=1,...] [--retries N] [--wait]
                    -- COMMAND [ARG ...]
    hpcsched job list | info J | wait J | cancel J | cat J [--task I] [stdout|stderr]

The scheduler is found as the other commands find it: ``--scheduler-file``, else
``--address``, else ``$HPCSCHED_SCHEDULER_FILE``. Each task of an array sees
``HPCSCHED_TASK_ID``, ``HPCSCHED_ENTRY`` and ``HPCSCHED_JOB_ID``, and ``%{TASK_ID}``,
``%{ENTRY}``, ``%{JOB_ID}`` in its arguments are replaced, as HyperQueue's ``hq submit``
does with ``HQ_TASK_ID`` / ``HQ_ENTRY``. ``job wait`` shows progress on stderr and exits
1 when a task failed (``job info`` names them), 0 when all finished.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from hpcsched.commands import jobs as jobs_mod
from hpcsched.commands.jobfile import parse_array


def _connect(args: argparse.Namespace) -> Any:
    from hpcsched.core.client.client import Client

    scheduler_file = args.scheduler_file or os.environ.get("HPCSCHED_SCHEDULER_FILE")
    if args.address:
        return Client(args.address, timeout=args.timeout)
    if scheduler_file:
        return Client(scheduler_file=scheduler_file, timeout=args.timeout)
    raise SystemExit("hpcsched: no scheduler: give --scheduler-file F or --address A "
                     "(or set HPCSCHED_SCHEDULER_FILE)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler-file", help="the scheduler's file (as `hpcsched scheduler` wrote it)")
    p.add_argument("--address", help="the scheduler's address, if not from a file")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to connect")


def _parse_env(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        k, sep, v = pair.partition("=")
        if not sep or not k:
            raise SystemExit(f"hpcsched submit: --env {pair!r} is not NAME=VALUE")
        out[k] = v
    return out


def submit_main(argv: list[str]) -> int:
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    else:
        command = []
    p = argparse.ArgumentParser(prog="hpcsched submit",
                                description="Submit a job of command tasks to a running scheduler.")
    _common(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--array", help="task ids: 1-1000, 1,5,9, 0-100:10")
    src.add_argument("--each-line", metavar="FILE", help="a task per non-blank line of FILE")
    src.add_argument("--from-json", metavar="FILE", help="a task per item of a JSON list")
    src.add_argument("--file", metavar="JOB.toml",
                     help="a job file: tasks with dependencies (HyperQueue's job file format)")
    p.add_argument("--name", help="the job's name (default: the program's)")
    p.add_argument("--cwd", help="the tasks' directory (default: this one)")
    p.add_argument("--stdout", help="path template of a file per task for its stdout (default: "
                   f"none, a log per worker slot in {jobs_mod.DEFAULT_DIR} under --cwd, read "
                   "with `hpcsched job cat`)".replace("%", "%%"))
    p.add_argument("--stderr", help="path template of a file per task for its stderr")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--resources", help="what each task holds, e.g. GPU=1 (workers' --resources)")
    p.add_argument("--retries", type=int, default=0)
    p.add_argument("--wait", action="store_true", help="then wait for it, as `job wait`")
    args = p.parse_args(argv)
    if args.file:
        return _submit_file(p, args, command)
    if not command:
        p.error("no command: put it after --, e.g. hpcsched submit --array 1-10 -- ./sim")
    from hpcsched.launchers.cli import parse_resources

    if args.array:
        ids: list[Any] = parse_array(args.array)
        entries = None
    elif args.each_line or args.from_json:
        entries = (jobs_mod.entries_of_lines(args.each_line) if args.each_line
                   else jobs_mod.entries_of_json(args.from_json))
        ids = list(range(len(entries)))
    else:
        ids, entries = [0], None
    client = _connect(args)
    try:
        job = jobs_mod.submit(client, command, ids=ids, entries=entries, name=args.name,
                              cwd=args.cwd, stdout=args.stdout, stderr=args.stderr,
                              env=_parse_env(args.env),
                              resources=parse_resources(args.resources) or None,
                              retries=args.retries)
        print(f"Job submitted successfully, job ID: {job.id}")
        sys.stdout.flush()
        if args.wait:
            return _wait(client, job)
        return 0
    finally:
        client.close()


def _submit_file(p: argparse.ArgumentParser, args: argparse.Namespace, command: list) -> int:
    from hpcsched.commands import jobfile

    if command:
        p.error("--file: the commands are in the job file; nothing goes after --")
    given = [opt for opt, value in (("--stdout", args.stdout), ("--stderr", args.stderr),
                                    ("--env", args.env), ("--resources", args.resources),
                                    ("--retries", args.retries)) if value]
    if given:
        p.error(f"--file: set {', '.join(given)} in the job file, per task")
    try:
        jf = jobfile.load(args.file)
    except (OSError, jobfile.JobFileError) as e:
        print(f"hpcsched submit: {e}", file=sys.stderr)
        return 2
    client = _connect(args)
    try:
        job = jobs_mod.submit_file(client, jf, args.file, name=args.name, cwd=args.cwd)
        print(f"Job submitted successfully, job ID: {job.id}")
        sys.stdout.flush()
        return _wait(client, job) if args.wait else 0
    finally:
        client.close()


def _wait(client: Any, job: jobs_mod.Job, quiet: bool = False) -> int:
    from hpcsched.core.client.futures import wait_futures

    total = len(job.futures)
    last = 0.0
    while True:
        try:
            wait_futures(job.futures, timeout=1.0)
            done = True
        except TimeoutError:
            done = False
        c = jobs_mod.counts(job.futures)
        now = time.monotonic()
        if not quiet and (done or now - last >= 1.0):
            last = now
            print(f"job {job.id}: {c['finished']}/{total} finished, {c['error']} failed, "
                  f"{c['cancelled']} cancelled", file=sys.stderr, flush=True)
        if done or c["waiting"] == 0:
            break
    return 0 if c["finished"] == total else 1


def job_main(argv: list[str]) -> int:
    stream = "stdout"
    if argv[:1] == ["cat"]:  # `job cat J [--task I] [stdout|stderr]`, in any order
        streams = [a for a in argv[1:] if a in ("stdout", "stderr")]
        stream = streams[-1] if streams else stream
        argv = ["cat", *[a for a in argv[1:] if a not in ("stdout", "stderr")]]
    common = argparse.ArgumentParser(add_help=False)
    _common(common)
    p = argparse.ArgumentParser(prog="hpcsched job", description="Jobs of command tasks.")
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("list", help="every job: id, name, tasks, state", parents=[common])
    for name, text in (("info", "a job's tasks, and the failed ones named"),
                       ("wait", "wait for a job; exit 1 if a task failed"),
                       ("cancel", "cancel a job's tasks that have not ended")):
        sub.add_parser(name, help=text, parents=[common]).add_argument("job")
    cat = sub.add_parser("cat", help="a task's stdout (or, with the word stderr, its stderr)",
                         parents=[common])
    cat.add_argument("job")
    cat.add_argument("--task", default=None, help="the task id (default: every task, in order)")
    args = p.parse_args(argv)
    client = _connect(args)
    try:
        if args.what == "list":
            print(f"{'ID':>4}  {'NAME':<20} {'TASKS':>7} {'DONE':>7} {'FAILED':>7} {'WAITING':>7}")
            for job in jobs_mod.jobs(client):
                c = _settled_counts(job)
                print(f"{job.id:>4}  {job.name[:20]:<20} {len(job.futures):>7} "
                      f"{c['finished']:>7} {c['error']:>7} {c['waiting']:>7}")
            return 0
        try:
            job = jobs_mod.job(client, args.job)
        except KeyError as e:
            print(f"hpcsched job: {e.args[0]}", file=sys.stderr)
            return 2
        if args.what == "wait":
            return _wait(client, job)
        if args.what == "cancel":
            client.cancel([f for f in job.futures if f.status == "pending"])
            print(f"job {job.id}: cancelled what had not ended")
            return 0
        if args.what == "info":
            return _info(job)
        return _cat(job, args.task, stream)
    finally:
        client.close()


def _settled_counts(job: jobs_mod.Job) -> dict[str, int]:
    """Counts once the client has heard of what already ended (a short wait)."""
    from hpcsched.core.client.futures import wait_futures

    try:
        wait_futures(job.futures, timeout=0.5)
    except TimeoutError:
        pass
    return jobs_mod.counts(job.futures)


def _info(job: jobs_mod.Job) -> int:
    c = _settled_counts(job)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.submitted))
    print(f"job {job.id} ({job.name}), submitted {when}, in {job.cwd}")
    print(f"  command: {job.args if isinstance(job.args, str) else ' '.join(job.args)}")
    print(f"  tasks: {len(job.futures)}: {c['finished']} finished, {c['error']} failed, "
          f"{c['cancelled']} cancelled, {c['waiting']} waiting or running")
    if job.log_dir:
        print(f"  output: {job.log_dir}, a log per worker slot (hpcsched job cat {job.id})")
    else:
        print(f"  output: {job.stdout}, {job.stderr}")
    failed = [(i, f) for i, f in zip(job.ids, job.futures, strict=True) if f.status == "error"]
    for i, f in failed[:20]:
        print(f"  task {i} failed: {str(f.exception()).splitlines()[0]}")
    if len(failed) > 20:
        print(f"  ... and {len(failed) - 20} more failed tasks")
    return 0


def _cat(job: jobs_mod.Job, task: Any, stream: str) -> int:
    ids = job.ids if task is None else [task]
    status = 0
    logs = job.logs()
    for i in ids:
        if task is not None:
            try:
                job.future(i)
            except KeyError as e:
                print(f"hpcsched job cat: {e.args[0]}", file=sys.stderr)
                return 2
        if logs is not None:
            data = logs.output(i, stream)
            if data is None:
                print(f"hpcsched job cat: task {i} has no {stream} yet (in the logs of "
                      f"{job.log_dir})", file=sys.stderr)
                status = 1
            else:
                sys.stdout.buffer.write(data)
            continue
        path = job.output_path(i, stream)
        try:
            with open(path, "rb") as f:
                sys.stdout.buffer.write(f.read())
        except FileNotFoundError:
            print(f"hpcsched job cat: task {i} has no {stream} yet ({path})", file=sys.stderr)
            status = 1
    sys.stdout.flush()
    return status


def history_main(argv: list[str]) -> int:
    """``hpcsched history FILE | --journal J [filters] [--csv]``: the task history."""
    import csv

    from hpcsched.diagnostics import history

    p = argparse.ArgumentParser(prog="hpcsched history",
                                description="Every task a scheduler ran, from its history file.")
    p.add_argument("file", nargs="?", help="the history file (scheduler --history FILE)")
    p.add_argument("--journal", help="the scheduler's journal: its history lies beside it")
    p.add_argument("--job", help="the tasks of this job (hpcsched submit)")
    p.add_argument("--group", help="the tasks of this group")
    p.add_argument("--outcome", choices=("memory", "erred"))
    p.add_argument("--worker", help="the tasks this worker (address) ran")
    p.add_argument("--limit", type=int, default=None, help="at most this many rows")
    p.add_argument("--csv", action="store_true", help="CSV on stdout, with a header")
    args = p.parse_args(argv)
    path = args.file or history.default_path(args.journal)
    if not path:
        p.error("name the history file, or the scheduler's --journal")
    try:
        columns, rows = history.read(path, job=args.job, group=args.group,
                                     outcome=args.outcome, worker=args.worker,
                                     limit=args.limit)
    except (FileNotFoundError, ValueError) as e:
        print(f"hpcsched history: {e}", file=sys.stderr)
        return 2
    if args.csv:
        w = csv.writer(sys.stdout)
        w.writerow(columns)
        w.writerows(rows)
        return 0
    shown = ("key", "worker", "start", "stop", "cpu", "memory", "retries", "outcome")
    idx = [columns.index(c) for c in shown]
    print(f"{'KEY':<44} {'WORKER':<24} {'START':<19} {'SECONDS':>9} {'CPU':>8} "
          f"{'PEAK MiB':>9} {'RETRIES':>7} {'OUTCOME':<7}")
    for r in rows:
        key, worker, start, stop, cpu, memory, retries, outcome = (r[i] for i in idx)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))
        cpu_text = "-" if cpu is None else f"{cpu:.3f}"
        mem_text = "-" if not memory else f"{memory / 2**20:.1f}"
        print(f"{str(key)[:44]:<44} {str(worker)[:24]:<24} {when:<19} {stop - start:>9.3f} "
              f"{cpu_text:>8} {mem_text:>9} {retries:>7} {outcome:<7}")
    print(f"{len(rows)} tasks", file=sys.stderr)
    return 0
