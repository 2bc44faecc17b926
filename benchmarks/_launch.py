"""Running one benchmark sub-run in a process tree of its own, and ending all of it.

Shared by the benchmark drivers (bench_mpi.py, bench_dask.py, bench_local.py), with
:func:`timed`, the one way they time a repeated run. A sub-run is a
command (``mpiexec -n 4 python ...`` or plain ``python ...``) whose processes
all carry a mark in their environment: hydra gives each MPI rank a session of
its own and local clusters spawn worker processes, so process groups do not
catch everything, but the inherited environment does. Whatever carries the
mark is killed when the sub-run ends, fails or outlives its timeout.

A sub-run reports by printing ``RESULT <json>`` lines (and ``FIRST <time>``
for first-result latencies) on stdout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "HPCSCHED_BENCH_RUN"  # in the environment of every process of one sub-run


def compile_package(root: str = REPO) -> None:
    """Byte-compile the package of the checkout at ``root`` (this one unless given), as
    ``pip install`` does for an installed one.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (this machine sets it) nothing else writes
    ``__pycache__``, and every process of a sub-run would compile each hpcsched module from
    source while dask, distributed and mpi4py load theirs compiled: a start-up figure would
    measure the compiler. The files are git-ignored.
    """
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(root, "hpcsched")],
                   check=True, stdout=subprocess.DEVNULL)


def marked_processes(mark: str) -> list:
    """Every live process of the sub-run marked ``mark``."""
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def rank_processes(mark: str, script: str) -> list:
    """The rank processes of the sub-run marked ``mark``: those running ``script``, not
    ``mpiexec`` or its proxies."""
    import psutil

    out = []
    for p in marked_processes(mark):
        try:
            if script in p.cmdline() and "mpiexec" not in p.name():
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def kill_marked(mark: str, *procs: subprocess.Popen) -> None:
    import psutil

    for proc in procs:
        try:
            proc.kill()
        except OSError:
            pass
    for p in marked_processes(mark):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def end_on_sigterm() -> None:
    """A SIGTERM to the driver (``timeout``, a batch system's time limit) raises
    SystemExit in its main thread, so that the sub-run's processes are ended on the way
    out (:func:`launch`'s ``finally``) rather than left running."""
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


def launch(cmd: list[str], timeout: float,
           on_line: Callable[[str, str], None] | None = None,
           env: dict[str, str] | None = None,
           on_start: Callable[[str], None] | None = None,
           cwd: str = REPO) -> tuple[list[dict], str, float, float]:
    """Run ``cmd`` from ``cwd`` (the repository root), killed after ``timeout`` seconds;
    every process it started is ended before this returns or raises. ``python -m`` puts
    the working directory first on the path: a run measuring another checkout (``env``'s
    ``PYTHONPATH``) starts from that checkout's root.

    Returns (RESULT dicts, stderr tail, start time, FIRST time or nan). ``on_line(line,
    mark)`` sees every other stdout line; ``on_start(mark)`` is called once the command is
    started (to watch its processes from a thread of the caller's). A non-zero exit raises
    RuntimeError with the end of stderr.
    """
    end_on_sigterm()
    mark = uuid.uuid4().hex
    # this checkout first on the path, unless ``env`` names the one to measure (a baseline)
    path = (env or {}).get("PYTHONPATH") or REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    full_env = {**os.environ, **(env or {}), MARK: mark, "PYTHONPATH": path}
    t_start = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            env=full_env)
    results: list[dict] = []
    first = [float("nan")]
    err: list[str] = []
    timed_out = threading.Event()
    t_err = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    t_err.start()

    def expire() -> None:
        timed_out.set()
        kill_marked(mark, proc)

    killer = threading.Timer(timeout, expire)
    killer.start()
    try:
        if on_start is not None:
            on_start(mark)
        for line in proc.stdout:
            if line.startswith("RESULT "):
                results.append(json.loads(line[7:]))
            elif line.startswith("FIRST "):
                first[0] = float(line.split()[1])
            elif on_line is not None:
                on_line(line, mark)
        proc.wait(timeout)
    finally:
        killer.cancel()
        kill_marked(mark, proc)  # whatever is left of the run (also on error)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        t_err.join(5)
    if timed_out.is_set():
        raise RuntimeError(f"{' '.join(cmd)} did not finish within {timeout:.0f} s:\n"
                           + "".join(err[-40:]))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n"
                           + "".join(err[-40:]))
    return results, "".join(err[-20:]), t_start, first[0]


def timed(repeat: int, fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU of this process) of the fastest of ``repeat`` runs of ``fn``."""
    best = (float("inf"), 0.0)
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if dt < best[0]:
            best = (dt, dc)
    return best


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Terminate ``procs`` (the last started first), and kill those that have not ended
    within 20 s."""
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(20)


def checkout_label(checkout: str) -> str:
    """``hpcsched@<commit>`` of a checkout (``+`` when its work tree has changes)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", checkout, *a], capture_output=True, text=True,
                              timeout=30).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or os.path.basename(checkout)
    dirty = "+" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"hpcsched@{commit}{dirty}"
