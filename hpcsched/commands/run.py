"""One command run as a task: where its output goes, what its result is, how it ends.

:func:`run_command` is the function a command task runs on its worker. The command
starts in a process group of its own, with ``HPCSCHED_TASK_ID`` / ``HPCSCHED_ENTRY`` /
``HPCSCHED_JOB_ID`` in its environment (the names of HyperQueue's ``HQ_TASK_ID`` and
``HQ_ENTRY``, in our words), ``%{TASK_ID}``, ``%{ENTRY}`` and ``%{JOB_ID}`` replaced in
its arguments and output paths. Its stdout and stderr go to files when paths are given
(a job file's tasks, and arrays given ``--stdout`` / ``--stderr``), or are appended to
the worker slot's logs in a directory (an array job's default: no file per task,
:mod:`hpcsched.commands.slotlog`), else they are captured (in the slot's capture files,
so that a program writing much holds no memory of the worker) and kept with the result,
the last :data:`KEEP_BYTES` of each.

The thread that runs the task is the only one to wait for the program (:func:`_reap`,
``os.wait4``: its status and resource usage in one call). The group is killed (SIGTERM,
then SIGKILL after :data:`KILL_GRACE` seconds unless that thread reaped the program by
then) when the task is cancelled or released while it runs, and by the worker's sentinel
(:mod:`hpcsched.commands.sentinel`) when the worker dies.

A command task with ``ranks=N`` (``client.submit_command("$HPCSCHED_MPI_PREFIX ./sim",
ranks=6)``) holds a slot on each of N workers, and its program runs once, from the
first of them: the others hold their slots and run nothing, so that the program can
start its processes on every slot (an MPI program through the launcher prefix its
environment gives, :mod:`hpcsched.hpc.gang`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcsched.commands.sentinel import SENTINEL
from hpcsched.commands.slotlog import SLOTS, group_alive
from hpcsched.core.worker.context import report_usage

#: bytes of a captured stream kept with the result, and of stderr quoted in an error
KEEP_BYTES = 1 << 20
TAIL_LINES = 20
KILL_GRACE = 3.0


@dataclass(frozen=True)
class CommandResult:
    """What a command that exited 0 left: its status, where its output went, and the
    output itself when it was captured rather than written to files."""

    args: tuple[str, ...]
    returncode: int
    duration: float
    host: str
    stdout_path: str | None = None
    stderr_path: str | None = None
    stdout: bytes | None = field(default=None, repr=False)
    stderr: bytes | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return f"{' '.join(self.args)}: exit {self.returncode} on {self.host} in {self.duration:.3g} s"


class CommandFailed(Exception):
    """A command task's program exited non-zero, or could not start."""

    def __init__(self, args: Sequence[str], returncode: int | None, stderr_tail: str,
                 stderr_path: str | None = None, host: str = "") -> None:
        super().__init__(args, returncode, stderr_tail, stderr_path, host)
        self.command = tuple(args)
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.stderr_path = stderr_path
        self.host = host

    def __str__(self) -> str:
        what = ("could not start" if self.returncode is None
                else f"exited with status {self.returncode}" if self.returncode >= 0
                else f"was killed by signal {-self.returncode}")
        where = f" ({self.stderr_path})" if self.stderr_path else ""
        head = f"command {list(self.command)!r} {what}" + (f" on {self.host}" if self.host else "")
        if self.returncode is None:
            return f"{head}: {self.stderr_tail}"
        if not self.stderr_tail:
            return head + f"; its stderr{where} was empty"
        return head + f"; the end of its stderr{where}:\n{self.stderr_tail}"


class CommandCancelled(Exception):
    """A command task whose result was no longer wanted before its program started."""

    def __init__(self, args: Sequence[str]) -> None:
        super().__init__(args)
        self.command = tuple(args)

    def __str__(self) -> str:
        return f"command {list(self.command)!r} not started: its task was cancelled"


def substitute(text: str, fields: Mapping[str, str]) -> str:
    """``%{TASK_ID}`` and the like replaced by their values.

    >>> substitute("out/%{JOB_ID}/%{TASK_ID}.txt", {"JOB_ID": "3", "TASK_ID": "17"})
    'out/3/17.txt'
    """
    if "%{" not in text:
        return text
    for name, value in fields.items():
        text = text.replace("%{" + name + "}", value)
    return text


def tail(data: bytes, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``data``, decoded leniently.

    >>> tail(b"a\\nb\\nc\\n", 2)
    'b\\nc'
    """
    text = data.decode(errors="replace").rstrip("\n")
    return "\n".join(text.split("\n")[-lines:])


def _under(cwd: str | None, path: str) -> str:
    return os.path.join(cwd, path) if cwd and not os.path.isabs(path) else path


def _file_tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return tail(f.read())
    except OSError:
        return ""


def _terminate(pid: int, reaped: threading.Event, grace: float = KILL_GRACE) -> None:
    """SIGTERM to the group of ``pid``, SIGKILL after ``grace`` seconds unless its program
    was reaped by then (by the thread that runs it: :func:`_reap` is the only reaper, so a
    status is never taken from under it)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        if reaped.is_set():
            return
        try:
            os.killpg(pid, sig)
        except OSError:
            return
        if wait is not None and reaped.wait(wait):
            return


class _Stopper:
    """Registered before the program starts (a release may come at any time): stops the
    program once it exists, or at once if the release came first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self.reaped = threading.Event()  # set by the running thread once it reaped the program
        self.stopped = False

    def stop(self) -> None:  # the worker's loop thread: must not block
        with self._lock:
            self.stopped = True
            pid = self._pid
        if pid:
            threading.Thread(target=_terminate, args=(pid, self.reaped), daemon=True,
                             name="hpcsched-command-stop").start()

    def attach(self, pid: int) -> None:
        with self._lock:
            self._pid = pid
            stopped = self.stopped
        if stopped:
            _terminate(pid, self.reaped, grace=0.0)


def _stopper(key: Any) -> _Stopper | None:
    """Cancelling the task (or releasing its key) kills the program's group; None: the
    task's result is no longer wanted already, do not start it."""
    if key is None:
        return _Stopper()
    from hpcsched.core.worker import context

    stopper = _Stopper()
    context.on_interrupt(stopper.stop)
    return stopper if context.still_wanted() else None


def _current_key() -> Any:
    """The key of the task running this command, moved off the worker's loop thread
    first (a command blocks); None outside a task."""
    from hpcsched.core.worker import context

    running = context.current()
    if running is None:
        return None
    context.off_loop(running, "running a command")
    return running.key


def _first_member() -> bool:
    """Whether this task runs the program: any task but a gang's members after the first."""
    from hpcsched.core.worker import context

    running = context.current()
    if running is None or not running.gang:
        return True
    return getattr(running.worker, "address", None) == running.gang[0]


def _environment(env: Mapping[str, str] | None, fields: Mapping[str, str]) -> dict:
    """The program's environment: the worker's, ``env`` on top, then ``HPCSCHED_*``.

    Built as bytes from ``os.environ``'s own store where CPython keeps one (the mapping
    behind ``os.environb``): copying through the ``os.environ`` view decodes every entry
    and ``Popen`` encodes them back, the largest cost of starting a short command."""
    data = getattr(os.environ, "_data", None)
    out = dict(data) if isinstance(data, dict) else dict(os.environb)
    for k, v in (env or {}).items():
        out[os.fsencode(str(k))] = os.fsencode(substitute(str(v), fields))
    for name, value in fields.items():
        if value:
            out[b"HPCSCHED_" + name.encode()] = os.fsencode(value)
    return out


def _open_output(path: str) -> int:
    """A descriptor of ``path`` truncated for writing, its directory made if missing
    (tried after the open fails: a job's directory exists for all but its first task)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o666)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return os.open(path, flags, 0o666)


_host: str | None = None


def _hostname() -> str:
    global _host
    if _host is None:
        _host = socket.gethostname()
    return _host


def _reap(proc: subprocess.Popen) -> Any:
    """Wait for ``proc``'s program with ``os.wait4``, which also gives its resource usage
    (user and system time, maximum RSS: getrusage(2)) for the task's history, and set its
    ``returncode``; the usage, or None if there is none to get (SIGCHLD ignored: the
    kernel reaped the child itself, and as ``Popen.wait`` does then, its status is 0)."""
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:
        proc.returncode = 0
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage


def _start(argv: list[str], cwd: str | None, env: dict, out: Any, err: Any, key: Any,
           host: str) -> tuple[subprocess.Popen, Any]:
    """Start the program (unless its task was cancelled first), wait for it, and give it
    with its resource usage; its group killed if the task is cancelled meanwhile."""
    stopper = _stopper(key)
    if stopper is None or stopper.stopped:
        raise CommandCancelled(argv)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
    except OSError as e:
        raise CommandFailed(argv, None, f"{type(e).__name__}: {e}", None, host) from None
    SENTINEL.started(proc.pid)
    stopper.attach(proc.pid)
    try:
        usage = _reap(proc)
    finally:
        stopper.reaped.set()
        SENTINEL.ended(proc.pid)
    return proc, usage


def _report(usage: Any) -> None:
    if usage is not None:  # ru_maxrss is in kilobytes on Linux (getrusage(2))
        report_usage(usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)


def _run_logged(argv: list[str], cwd: str | None, env: dict, log_dir: str, task_id: str,
                key: Any, host: str) -> CommandResult:
    """The program with its output appended to this slot's logs in ``log_dir``."""
    if "\t" in task_id or "\n" in task_id:
        raise ValueError(f"task id {task_id!r}: a tab or a newline cannot be indexed")
    logs = SLOTS.logs(log_dir)
    out, err = logs.begin(task_id)
    start = time.monotonic()
    try:
        proc, usage = _start(argv, cwd, env, out, err, key, host)
    except BaseException:  # not started (cancelled, or no such program): its ranges empty
        logs.end(task_id, False)
        raise
    duration = time.monotonic() - start
    record = logs.end(task_id, group_alive(proc.pid))
    _report(usage)
    if proc.returncode != 0:
        stderr_tail = tail(logs.tail(record, 64 * 1024))
        raise CommandFailed(argv, proc.returncode, stderr_tail, None, host)
    return CommandResult(tuple(argv), proc.returncode, duration, host)


def run_command(args: Sequence[str] | str, *, cwd: str | None = None,
                env: Mapping[str, str] | None = None, stdout: str | None = None,
                stderr: str | None = None, task_id: Any = None, entry: Any = None,
                job_id: Any = None, log_dir: str | None = None) -> CommandResult | None:
    """Run ``args`` (a list, or a string for ``sh -c``) and wait for it; the task's body.

    ``log_dir`` (a template, as the output paths are): when neither ``stdout`` nor
    ``stderr`` is given, both go to the slot's logs in that directory, indexed by
    ``task_id`` (:mod:`hpcsched.commands.slotlog`).

    Raises :class:`CommandFailed` when it exits non-zero or cannot start. Returns None
    on a member of a task with ``ranks=N`` other than its first (module docstring).
    """
    if not _first_member():
        return None  # a gang member's value is dropped: the task's is the first's
    fields = {"TASK_ID": "" if task_id is None else str(task_id),
              "ENTRY": "" if entry is None else str(entry),
              "JOB_ID": "" if job_id is None else str(job_id)}
    argv = (["/bin/sh", "-c", substitute(args, fields)] if isinstance(args, str)
            else [substitute(str(a), fields) for a in args])
    full_env = _environment(env, fields)
    host = _hostname()
    key = _current_key()
    if log_dir and not stdout and not stderr:
        return _run_logged(argv, cwd, full_env, _under(cwd, substitute(log_dir, fields)),
                           fields["TASK_ID"], key, host)
    # relative output paths are the command's own: under its cwd, as its shell would see them
    out_path = _under(cwd, substitute(stdout, fields)) if stdout else None
    err_path = _under(cwd, substitute(stderr, fields)) if stderr else None
    fds: list[int] = []
    # a stream that no path was given for goes to the slot's capture files
    scratch = None if out_path and err_path else SLOTS.scratch()
    try:
        out: Any
        err: Any
        if scratch is not None:
            out, err = scratch.begin()
        if out_path:
            out = _open_output(out_path)
            fds.append(out)
        if err_path == out_path and out_path:
            err = out
        elif err_path:
            err = _open_output(err_path)
            fds.append(err)
        start = time.monotonic()
        proc, usage = _start(argv, cwd, full_env, out, err, key, host)
        duration = time.monotonic() - start
        captured_out = captured_err = None
        if scratch is not None:
            captured_out, captured_err = scratch.end(group_alive(proc.pid), KEEP_BYTES)
            captured_out = None if out_path else captured_out
            captured_err = None if err_path else captured_err
    finally:
        for fd in fds:
            os.close(fd)
    _report(usage)
    if proc.returncode != 0:
        stderr_tail = (tail(captured_err) if captured_err is not None
                       else _file_tail(err_path) if err_path else "")
        raise CommandFailed(argv, proc.returncode, stderr_tail, err_path, host)
    return CommandResult(tuple(argv), proc.returncode, duration, host, out_path, err_path,
                         captured_out, captured_err)


def run_command_entry(spec: tuple, task_id: int, entry: str) -> CommandResult | None:
    """One element of ``Client.map_command``: ``spec`` is (args, cwd, env items, stdout,
    stderr), the same for every element."""
    args, cwd, env, stdout, stderr = spec
    return run_command(args, cwd=cwd, env=dict(env), stdout=stdout, stderr=stderr,
                       task_id=task_id, entry=entry)


def _program(args: Any) -> str:
    """The name a command's tasks are grouped under: its program's.

    >>> _program(["/opt/sim/simulate", "--seed", "17"]), _program("echo hi")
    ('simulate', 'echo')
    """
    words = args.split() if isinstance(args, str) else [str(a) for a in args]
    return os.path.basename(words[0]) if words else "command"


def submit_command(client: Any, args: Sequence[str] | str, *, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, stdout: str | None = None,
                   stderr: str | None = None, key: Any = None, **options: Any) -> Any:
    """``Client.submit_command``: a future of :func:`run_command`'s
    :class:`CommandResult`.

    Its stdout and stderr go to the files ``stdout`` / ``stderr`` name (``%{TASK_ID}``
    and the like replaced; relative to ``cwd``), else are captured and kept in the
    result. ``options`` are ``Client.submit``'s (``resources=``, ``retries=``,
    ``workers=``, ``priority=``); each call runs the program anew (never ``pure``)."""
    import uuid

    if key is None:
        key = f"{_program(args)}-{uuid.uuid4().hex}"
    return client.submit(run_command, args, cwd=cwd, env=env, stdout=stdout, stderr=stderr,
                         key=key, pure=False, **options)


def map_command(client: Any, args: Sequence[str] | str, entries: Any, *,
                cwd: str | None = None, env: Mapping[str, str] | None = None,
                stdout: str | None = None, stderr: str | None = None,
                **options: Any) -> list:
    """``Client.map_command``: :func:`submit_command` once per entry, as one map (the bulk
    road above its threshold). Each run sees its index as ``HPCSCHED_TASK_ID`` and its
    entry as ``HPCSCHED_ENTRY``; ``%{TASK_ID}`` / ``%{ENTRY}`` in ``args``, ``env`` and
    the output paths are replaced by them."""
    items = [str(e) for e in entries]
    spec = (args if isinstance(args, str) else tuple(args), cwd,
            tuple(sorted((env or {}).items())), stdout, stderr)
    return client.map(run_command_entry, [spec] * len(items), range(len(items)), items,
                      key=options.pop("key", _program(args)), pure=False, **options)

