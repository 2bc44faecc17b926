"""Running a command under a real ``mpiexec`` from a test: a subprocess in a session of
its own with a timeout; on timeout (or any failure of the test) the whole process tree,
mpiexec, its proxies and every rank, is killed, so nothing outlives the test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]

#: skips a test where there is no mpiexec, unless HPCSCHED_REQUIRE_MPI says it must run
needs_mpiexec = pytest.mark.skipif(
    shutil.which("mpiexec") is None and not os.environ.get("HPCSCHED_REQUIRE_MPI"),
    reason="mpiexec is not on PATH")


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill mpiexec and everything it started (also children that left its group)."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(10)


def run_mpi(nprocs: int, args: list[str], timeout: float,
            env: dict[str, str] | None = None, cmd: list[str] | None = None) -> tuple[int, str]:
    cmd = cmd or ["mpiexec", "-n", str(nprocs), sys.executable, *args]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out = proc.stdout.read() if proc.stdout else ""
        pytest.fail(f"`{' '.join(cmd)}` did not finish within {timeout}s; output:\n{out[-5000:]}")
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    return proc.returncode, out


def pytest_under_mpi(nprocs: int, module: str, timeout: float,
                     env: dict[str, str] | None = None) -> str:
    code, out = run_mpi(
        nprocs,
        ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", module],
        timeout,
        env,
    )
    assert code == 0, f"mpiexec -n {nprocs} pytest {module} exited with {code}:\n{out[-8000:]}"
    assert "no tests ran" not in out
    # every rank prints its own summary: each must report passes and no failure
    # (ranks share one stdout: two summaries can land on one line, so no line anchors)
    summaries = re.findall(r"(\d+) passed(?:, \d+ \w+)* in ", out)
    assert len(summaries) == nprocs, f"expected {nprocs} pytest summaries:\n{out[-8000:]}"
    assert all(int(n) > 0 for n in summaries)
    assert not re.search(r"\d+ (failed|error)", out), out[-8000:]
    return out


