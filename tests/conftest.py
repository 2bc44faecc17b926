"""Fixtures shared by the whole test suite.

* ``cluster`` / ``client``: a fresh ``LocalCluster(processes=True, n_workers=2,
  threads_per_worker=1)`` (real worker processes over authenticated TCP) and a
  Client on it, both closed in ``finally`` — for tests that break things.
* ``shared_cluster`` / ``shared_client``: the same, once per test module, for
  tests that leave the cluster as they found it (worker start-up costs ~1 s).
* ``no_leaked_processes`` (autouse, per test and per module): no hpcsched
  scheduler or worker process started during a test (or a module) outlives it.
* ``wait_until(predicate, timeout)``: poll a condition with a deadline (tests
  wait on conditions, never on bare sleeps).
* ``interruptible(cmd)``: ``cmd`` with SIGINT at its default action, as a program started
  from a shell prompt has it, for tests that Ctrl-C a child.
* ``road`` (parametrized: ``bulk``, ``tasks``): the two ways a user's calls reach the
  scheduler -- one ``Client.map`` of at least ``BULK_MAP_MIN`` calls (a bulk map, whose
  elements are no tasks until they must be) and the same calls as single ``submit``s --
  so that a feature tested with it is tested on both.
* Under ``CI=true`` a run that leaves a file of the checkout changed or new (``git status``
  at its end against its start) fails, naming the files: tests write into their
  temporary directories, so that a clean clone stays clean.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

LEAK_GRACE = 10.0  # seconds a process may take to exit after its owner closed it
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_env() -> dict[str, str]:
    """Environment for worker processes: functions defined in test modules are pickled by
    reference, so workers must be able to import ``tests.*`` wherever pytest was started."""
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": REPO + (os.pathsep + path if path else "")}


def interruptible(cmd: list[str]) -> list[str]:
    """``cmd`` run with SIGINT at its default action, as a shell prompt starts a program
    (Python then installs its ``KeyboardInterrupt`` handler).

    The test run itself may ignore SIGINT: a non-interactive shell starts a background job
    (``bash .ci/run &`` in a script) with SIGINT ignored, every child inherits that, and
    Python keeps an inherited SIG_IGN, so a Ctrl-C sent to a child would do nothing. The
    command is exec'd in place: its pid is the one started.
    """
    reset = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
             "os.execvp(sys.argv[1], sys.argv[1:])")
    return [sys.executable, "-c", reset, *cmd]


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
               what: str = "condition") -> Any:
    """Return ``predicate()`` once truthy; raise TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.25)


def hpcsched_children() -> dict[int, str]:
    """pid -> command line of every hpcsched scheduler/worker process below this one."""
    out = {}
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmd = p.cmdline()
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        text = " ".join(cmd)
        if "hpcsched" in text and ("worker" in cmd or "scheduler" in cmd):
            out[p.pid] = text
    return out


def _check_no_new_children(before: dict[int, str], where: str) -> None:
    def leaked() -> dict[int, str]:
        return {pid: cmd for pid, cmd in hpcsched_children().items() if pid not in before}

    try:
        wait_until(lambda: not leaked(), timeout=LEAK_GRACE, what="no leaked processes")
    except TimeoutError:
        left = leaked()
        for pid in left:  # end them, so one leak does not fail every later test
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        pytest.fail(f"{where} left hpcsched processes running: {left}")


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    before = hpcsched_children()
    yield
    _check_no_new_children(before, request.node.nodeid)


@pytest.fixture(autouse=True, scope="module")
def no_leaked_processes_module(request: pytest.FixtureRequest) -> Iterator[None]:
    before = hpcsched_children()
    yield
    _check_no_new_children(before, f"module {request.module.__name__}")


def _local_cluster(**kw: Any) -> Any:
    from hpcsched.launchers.local_cluster import LocalCluster

    kw.setdefault("n_workers", 2)
    kw.setdefault("threads_per_worker", 1)
    kw.setdefault("processes", True)
    kw.setdefault("timeout", 60)
    kw.setdefault("worker_env", worker_env())
    return LocalCluster(**kw)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Any]:
    """Real ``hpcsched`` processes a test starts, each with its output in a file; whatever
    is left is killed at the end (tests/launchers/procs.py)."""
    from tests.launchers.procs import Procs

    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.kill_all()


@pytest.fixture
def cluster() -> Iterator[Any]:
    c = _local_cluster()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def client(cluster: Any) -> Iterator[Any]:
    from hpcsched.core.client.client import Client

    cl = Client(cluster, set_as_default=False)
    try:
        yield cl
    finally:
        cl.close()


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[Any]:
    c = _local_cluster()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def shared_client(shared_cluster: Any) -> Iterator[Any]:
    from hpcsched.core.client.client import Client

    cl = Client(shared_cluster, set_as_default=False)
    try:
        yield cl
    finally:
        cl.close()


class Road:
    """How a test's calls are submitted (the ``road`` fixture)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<Road {self.name}>"

    def calls(self, client: Any, fn: Callable, n: int, **kwargs: Any) -> list:
        """Futures of ``fn(i, **kwargs)`` for ``i`` in ``range(n)``, each call run once
        (``pure=False``); checks that they took this road."""
        return self.map(client, fn, range(n), pure=False, **kwargs)

    def map(self, client: Any, fn: Callable, *iterables: Any, **kwargs: Any) -> list:
        """The futures of ``fn(*args, **kwargs)`` for each ``args`` of ``zip(*iterables)``,
        sent this road (as ``client.map``); checks that they took it."""
        from hpcsched.core.client.graphs import BULK_MAP_MIN

        calls = list(zip(*iterables, strict=False))
        if self.name == "bulk":
            assert len(calls) >= BULK_MAP_MIN, \
                f"a map of {len(calls)} < {BULK_MAP_MIN} calls is no bulk map"
            futures = client.map(fn, *iterables, **kwargs)
        else:
            futures = [client.submit(fn, *args, **kwargs) for args in calls]
        prefix = futures[0].key.rpartition("-")[0] + "-"

        def held(dask_scheduler: Any) -> bool:  # looked up without making tasks of elements
            return prefix in dask_scheduler.state.bulk.maps

        assert client.run_on_scheduler(held) == (self.name == "bulk"), (self, prefix)
        return futures


HELLO_C = Path(__file__).parent / "hpc" / "programs" / "hello_mpi.c"
HELLO_PY = """#!{python}
from mpi4py import MPI
c = MPI.COMM_WORLD
print("HELLO", c.rank, c.size, MPI.Get_processor_name(), c.allreduce(c.rank), flush=True)
"""


@pytest.fixture
def hello(tmp_path: Path) -> str:
    """The path of an MPI hello world executable: each rank prints ``HELLO rank size host
    sum-of-ranks``; compiled with the ``mpicc`` beside ``mpiexec``, else an mpi4py script."""
    mpiexec = shutil.which("mpiexec")
    mpicc = Path(mpiexec).with_name("mpicc") if mpiexec else None
    exe = tmp_path / "hello_mpi"
    if mpicc is not None and mpicc.exists():
        subprocess.run(
            [str(mpicc), "-o", str(exe), str(HELLO_C)], check=True, timeout=120, capture_output=True
        )
    else:
        exe.write_text(HELLO_PY.format(python=sys.executable))
        exe.chmod(0o755)
    return str(exe)


@pytest.fixture(params=["bulk", "tasks"])
def road(request: pytest.FixtureRequest) -> Road:
    return Road(request.param)


# ---------------------------------------------------------------- slow tests
def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` wait minutes on a batch system's own clock (SLURM's
    one-minute walltimes, its two-minute requeue delay): they run when
    ``HPCSCHED_RUN_SLOW=1``, as ``HPCSCHED_RUN_SLOW=1 python -m pytest -m slow``, and are
    skipped, saying so, in the suite's default run."""
    if os.environ.get("HPCSCHED_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow (minutes of a batch system's clock): "
                                   "run with HPCSCHED_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------- a clean checkout
_STATUS_AT_START = pytest.StashKey[set[str] | None]()


def _checkout_status() -> set[str] | None:
    """The lines of ``git status --porcelain`` of this checkout (ignored files left out),
    or None where it is no git checkout or git is missing."""
    try:
        out = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=all"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(out.stdout.splitlines()) if out.returncode == 0 else None


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("CI") == "true":
        session.config.stash[_STATUS_AT_START] = _checkout_status()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under ``CI=true``: fail the run when it changed or added a file of the checkout."""
    before = session.config.stash.get(_STATUS_AT_START, None)
    if before is None:
        return
    after = _checkout_status()
    changed = sorted((after or set()) - before)
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = ("the tests changed the checkout (write into tmp_path instead):\n  "
                   + "\n  ".join(changed))
        if reporter is not None:
            reporter.write_sep("=", "checkout left dirty", red=True)
            reporter.write_line(message)
        else:
            print(message, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

