"""Real ``hpcsched`` processes started by a test, as a user on a login node starts them:
each with its output in a file of its own, and whatever is left killed at the end (the
``procs`` fixture of tests/launchers/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import wait_until, worker_env

HPCSCHED = shutil.which("hpcsched")
# explicit threads and memory: no resource detection in these tests
WORKER_OPTS = ["--nthreads", "1", "--memory-limit", "0"]


def inc(x: int) -> int:
    """A task for the workers those processes run."""
    return x + 1


class Procs:
    """Starts subprocesses with output to files; ``kill_all`` ends whatever is left."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], name: str, **kw: Any) -> subprocess.Popen:
        env = dict(os.environ)
        env.update(worker_env())
        for var in ("HPCSCHED_SECRET", "HPCSCHED_SECRET_FILE", "HPCSCHED_SCHEDULER_FILE",
                    "HPCSCHED_SCHEDULER_ADDRESS"):
            env.pop(var, None)
        env.update(kw.pop("env", {}))
        out = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env, **kw)
        out.close()
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass


def hpcsched_cmd() -> list[str]:
    return [HPCSCHED] if HPCSCHED else [sys.executable, "-m", "hpcsched"]


def start_scheduler(procs: Procs, sfile: Path, *options: str) -> subprocess.Popen:
    p = procs.start([*hpcsched_cmd(), "scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--scheduler-file", str(sfile), *options], "scheduler")
    wait_until(lambda: sfile.exists() or p.poll() is not None, timeout=30,
               what="the scheduler file")
    assert p.poll() is None, procs.log("scheduler")
    return p
