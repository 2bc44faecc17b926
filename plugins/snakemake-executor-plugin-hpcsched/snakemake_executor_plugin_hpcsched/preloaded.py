"""A Snakemake job run in a fork of a Python that has Snakemake loaded already.

Every remote executor runs each job as ``python -m snakemake --target-jobs ...``. For a
short rule that process is the whole cost: importing Snakemake and discovering its
plugins take about a second of CPU, and its exit waits up to a second more for the
timer its job scheduler leaves behind (the re-evaluation of ``--max-jobs-per-timespan``
in ``snakemake/scheduling/job_scheduler.py``, a non-daemon ``threading.Timer``).

Here each worker process keeps one forkserver (``multiprocessing``'s, started at its
first job) that has imported Snakemake and built its argument parser once, which is
when Snakemake discovers its plugins (:mod:`._warm`). A job is a fork of it: it runs
``snakemake.cli.main`` with the arguments the ``python -m snakemake`` command would
have had, in the job's directory and with the job's environment, its output in the
job's log, and ends with ``os._exit`` once ``main`` returns.

The job is a command as far as its worker is concerned: it runs in a session of its own,
whose process group the worker's sentinel (:mod:`hpcsched.commands.sentinel`) kills if
the worker dies, and which is killed (SIGTERM, then SIGKILL) when its task is cancelled
while it runs. A job that exits non-zero fails its task with
:class:`hpcsched.commands.run.CommandFailed`, naming its log and quoting its tail.

If another task of the same worker process started ``multiprocessing``'s forkserver
first, without Snakemake preloaded, jobs still run, each importing Snakemake itself.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence

#: seconds a job has to end after SIGTERM before SIGKILL
KILL_GRACE = 3.0
TAIL_LINES = 20

_context_lock = threading.Lock()
_context: multiprocessing.context.BaseContext | None = None


def _forkserver() -> multiprocessing.context.BaseContext:
    global _context
    with _context_lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload([f"{__package__}._warm"])
            _context = ctx
        return _context


def _job_main(argv: Sequence[str], cwd: str, env: Mapping[str, str], log: str) -> None:
    """The forked child: Snakemake's command line for one job, then exit at once."""
    os.setsid()  # its own process group: cancelling the job reaches its shell commands
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(cwd)
        os.environ.update(env)
        from snakemake.cli import main

        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        # not a normal interpreter exit: that would wait for the job scheduler's timer
        os._exit(code)


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode(errors="replace").rstrip("\n")
    except OSError:
        return ""
    return "\n".join(text.split("\n")[-TAIL_LINES:])


class _Job:
    """The running job, for the worker's loop thread to stop (it must not block)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self.stopped = False
        self.ended = threading.Event()

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            pid = self._pid
        if pid is not None:
            threading.Thread(target=self._terminate, args=(pid,), daemon=True,
                             name="snakemake-job-stop").start()

    def attach(self, pid: int) -> None:
        with self._lock:
            self._pid = pid
            stopped = self.stopped
        if stopped:
            self._terminate(pid)

    def _terminate(self, pgid: int) -> None:
        _kill(pgid, signal.SIGTERM)
        if not self.ended.wait(KILL_GRACE):
            _kill(pgid, signal.SIGKILL)


def _kill(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def run_job(argv: Sequence[str], cwd: str, env: Mapping[str, str], log: str) -> int:
    """The task's body on a worker: run one Snakemake job (``argv`` as for ``python -m
    snakemake``) in a fork of the preloaded forkserver and wait for it; 0 once it exits 0.

    Raises :class:`hpcsched.commands.run.CommandFailed` when it exits otherwise."""
    from hpcsched.commands.run import CommandCancelled
    from hpcsched.commands.sentinel import SENTINEL
    from hpcsched.core.worker import context

    command = ["snakemake", *argv]
    running = context.current()
    if running is not None:
        context.off_loop(running, "running a Snakemake job")
    job = _Job()
    context.on_interrupt(job.stop)
    if not context.still_wanted() or job.stopped:
        raise CommandCancelled(command)
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    proc = _forkserver().Process(target=_job_main, args=(tuple(argv), cwd, dict(env), log),
                                 name="snakemake-job")
    proc.start()
    pid = proc.pid
    assert pid is not None
    SENTINEL.started(pid)  # its group: the child's pid once its setsid() ran
    try:
        job.attach(pid)
        proc.join()
        code = proc.exitcode
    finally:
        job.ended.set()
        SENTINEL.ended(pid)
    proc.close()
    if code == 0:
        return 0
    raise _failed(command, code, log)


def _failed(command: list[str], code: int | None, log: str) -> Exception:
    from hpcsched.commands.run import CommandFailed

    return CommandFailed(command, code, _tail(log), log, socket.gethostname())
