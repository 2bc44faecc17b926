"""Run the MPI test modules under a real ``mpiexec``, so the plain suite exercises MPI.

Each run goes through tests/hpc/mpirun.py: a timeout, and nothing outlives the test.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.hpc.mpirun import needs_mpiexec, pytest_under_mpi, run_mpi

pytestmark = needs_mpiexec


@pytest.mark.timeout(150)
def test_mpi_comm_on_4_ranks():
    # 4 ranks on a 2-core machine: oversubscribed, as on a login node
    pytest_under_mpi(4, "tests/hpc/test_mpi_comm.py", timeout=120)


@pytest.mark.timeout(150)
def test_mpi_comm_on_2_ranks_without_doorbells():
    # the transport as on ranks spread over nodes: no doorbells, polling only
    pytest_under_mpi(2, "tests/hpc/test_mpi_comm.py", timeout=120,
                     env={"HPCSCHED_MPI__DOORBELL": "false"})


@pytest.mark.timeout(60)
def test_a_failing_rank_does_not_hang_the_run(tmp_path):
    """Rank 1 fails and exits while rank 0 waits on it: the run ends, with an error."""
    script = tmp_path / "fail.py"
    script.write_text(
        "import sys\n"
        "from hpcsched.hpc import mpi\n"
        "from hpcsched.core.comm import registry\n"
        "ep = mpi.init_endpoint(timeout=20)\n"
        "if ep.rank == 1:\n"
        "    raise SystemExit('rank 1 fails on purpose')\n"
        "comm = registry.connect('mpi://1', timeout=5)\n"
        "try:\n"
        "    comm.recv(timeout=5)\n"
        "except TimeoutError:\n"
        "    sys.exit(3)\n"
    )
    code, out = run_mpi(2, [str(script)], timeout=50)
    assert code != 0, out
    assert "rank 1 fails on purpose" in out


@pytest.mark.timeout(150)
def test_mpi_client_on_4_ranks():
    # rank 0: scheduler + client, ranks 1-3: workers; oversubscribed on 2 cores
    pytest_under_mpi(4, "tests/hpc/test_mpi_client.py", timeout=120)


@pytest.mark.timeout(200)
def test_mpi_dask_collections_on_4_ranks():
    # dask collections and dask's get-function conformance suite over MPI point-to-point
    pytest_under_mpi(4, "tests/hpc/test_mpi_dask.py", timeout=180)


@pytest.mark.timeout(90)
def test_ranks_may_disagree_about_doorbells():
    """mpi.doorbell is per-rank configuration, the exchange is collective: worker rank 1
    runs with doorbells off (it polls, and still rings the others); the job works."""
    version = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    if "HYDRA" in version:  # MPICH (the pip wheel)
        off = ["-env", "HPCSCHED_MPI__DOORBELL", "false"]
    elif "Open MPI" in version or "OpenRTE" in version:
        off = ["-x", "HPCSCHED_MPI__DOORBELL=false"]
    else:
        pytest.skip(f"do not know how this mpiexec sets one rank's environment: {version[:80]!r}")
    script = ["-m", "hpcsched", "examples/monte_carlo_pi.py"]
    cmd = ["mpiexec", "-n", "1", sys.executable, *script,
           ":", "-n", "1", *off, sys.executable, *script,
           ":", "-n", "2", sys.executable, *script]
    code, out = run_mpi(4, [], timeout=60, cmd=cmd)
    assert code == 0, out[-5000:]
    assert "on 3 workers" in out and "pi ~ 3.14" in out, out[-5000:]


PRELOAD = """
SET_UP = []

def dask_setup(worker):
    SET_UP.append(worker.name)
"""

PRELOAD_SCRIPT = """
import sys
from hpcsched import Client

def preloaded():
    return sys.modules["mpi_preload_mod"].SET_UP  # loaded at the rank's start

with Client() as client:
    client.wait_for_workers(2, timeout=30)
    got = sorted(client.run(preloaded).values())
    assert got == [["rank-1"], ["rank-2"]], got
    assert client.submit(preloaded, pure=False).result(timeout=30) in got
    print("preloaded on", got)
"""


@pytest.mark.timeout(90)
def test_preload_on_every_worker_rank(tmp_path):
    """``mpiexec -n 3 python -m hpcsched --preload mod script.py``: a module next to the script."""
    (tmp_path / "mpi_preload_mod.py").write_text(PRELOAD)
    (tmp_path / "script.py").write_text(PRELOAD_SCRIPT)
    code, out = run_mpi(3, ["-m", "hpcsched", "--preload", "mpi_preload_mod",
                            str(tmp_path / "script.py")], timeout=80)
    assert code == 0, out
    assert "preloaded on [['rank-1'], ['rank-2']]" in out


@pytest.mark.timeout(90)
def test_a_failing_preload_ends_the_job_naming_it(tmp_path):
    (tmp_path / "script.py").write_text("from hpcsched import Client\nClient().close()\n")
    code, out = run_mpi(3, ["-m", "hpcsched", "--preload", "no_such_preload_module",
                            str(tmp_path / "script.py")], timeout=80)
    assert code != 0, out
    assert "worker preload 'no_such_preload_module' could not be imported" in out
