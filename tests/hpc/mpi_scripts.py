"""Running a script under a real ``mpiexec -n N python -m hpcsched`` from a test, and
proving that no process of the run outlives it.

Every run has a timeout and a mark in its environment (inherited by mpiexec, its proxies
and the ranks, which hydra puts in sessions of their own): whatever carries the mark is
killed in ``finally``, and :func:`run` checks that no process of the run outlived
``mpiexec``. The scripts live in tests/hpc/scripts/ and examples/.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import psutil
import pytest

from tests.hpc.mpirun import REPO

# what a run needs when its tasks' functions live in the repository's tests package: the
# worker ranks import them, as a user's modules must be importable on workers
REPO_ON_PATH = {"PYTHONPATH": os.pathsep.join(
    p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
SCRIPTS = REPO / "tests" / "hpc" / "scripts"
RUN_TIMEOUT = 60.0

@dataclass
class Run:
    code: int
    out: str
    err: str
    elapsed: float  # seconds from start to mpiexec's exit
    ended: float  # time.time() when mpiexec exited

    def __str__(self) -> str:
        return f"exit {self.code} after {self.elapsed:.2f}s\n--- stdout\n{self.out[-4000:]}" \
               f"\n--- stderr\n{self.err[-6000:]}"


MARK = "HPCSCHED_TEST_RUN"  # in the environment of every process of one run


def run_members(mark: str) -> list[psutil.Process]:
    """Live processes of the run marked ``mark``: mpiexec, its proxies and the ranks.

    Found by their environment, as hydra puts proxies and ranks in sessions of
    their own and a rank outliving mpiexec is reparented.
    """
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def kill_run(proc: subprocess.Popen, mark: str) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in run_members(mark):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def assert_all_gone(mark: str, proc: subprocess.Popen, grace: float = 3.0) -> None:
    """No process of the run is left ``grace`` seconds after mpiexec exited."""
    deadline = time.monotonic() + grace
    while True:
        left = run_members(mark)
        if not left:
            return
        if time.monotonic() > deadline:
            names = []
            for p in left:
                try:
                    names.append(" ".join(p.cmdline()))
                except psutil.NoSuchProcess:
                    pass
            kill_run(proc, mark)
            pytest.fail(f"processes left after mpiexec exited: {names}")
        time.sleep(0.05)


def start(args: list[str], nprocs: int | None = 4, env: dict | None = None,
          module: bool = True) -> tuple[subprocess.Popen, str]:
    """Start ``[mpiexec -n N] python -m hpcsched *args`` (or ``python *args``); (proc, mark)."""
    cmd = [sys.executable, *(["-m", "hpcsched"] if module else []), *args]
    if nprocs is not None:
        cmd = ["mpiexec", "-n", str(nprocs), *cmd]
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, **(env or {}), MARK: mark})
    return proc, mark


def run(args: list[str], nprocs: int | None = 4, timeout: float = RUN_TIMEOUT,
        env: dict | None = None, module: bool = True) -> Run:
    """Run to the end (or kill at ``timeout``); check nothing of it is left."""
    t0 = time.monotonic()
    proc, mark = start(args, nprocs, env, module)
    try:
        out, err = proc.communicate(timeout=timeout)
        ended = time.time()
        result = Run(proc.returncode, out, err, time.monotonic() - t0, ended)
        assert_all_gone(mark, proc)
        return result
    except subprocess.TimeoutExpired:
        kill_run(proc, mark)
        out, err = proc.communicate()
        pytest.fail(f"{args} did not finish within {timeout}s\n{out[-3000:]}\n{err[-5000:]}")
    finally:
        if proc.poll() is None or run_members(mark):
            kill_run(proc, mark)


def script(name: str) -> str:
    return str(SCRIPTS / name)
