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
