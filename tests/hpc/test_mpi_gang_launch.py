"""A task with ``ranks=N`` starts an MPI program on exactly the slots it holds, through
``HPCSCHED_MPI_PREFIX`` and ``HPCSCHED_HOSTFILE`` (:mod:`hpcsched.hpc.gang`): on this
machine under ``mpiexec``, and with ``ranks_per_node=1`` over the three emulated nodes
(:mod:`tests.nodes`) under MPICH's ``mpiexec`` and under ``srun -N 3``. The program is a
C hello world that allreduces the ranks, compiled here with the ``mpicc`` beside
``mpiexec`` (an mpi4py script where there is none).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from tests.hpc.mpi_scripts import REPO_ON_PATH, run, script
from tests.hpc.mpirun import REPO, needs_mpiexec, run_mpi
from tests.nodes import SLURM_CONF, missing_nodes, missing_slurm, require

NSSSH = str(REPO / "ci" / "nodes" / "nsssh")


def launched(out: str) -> list[dict]:
    m = re.search(r"^LAUNCHED (.*)$", out, re.M)
    assert m, out[-5000:]
    return json.loads(m.group(1))


def check(result: dict, n: int) -> list[str]:
    """The program ran ``n`` ranks, each right, on the hosts of the host file, in its
    order; the hosts of the ranks."""
    assert result["code"] == 0, result
    lines = sorted(result["out"].split("\n")[:-1], key=lambda line: int(line.split()[1]))
    assert [line.split()[:3] for line in lines] == [["HELLO", str(r), str(n)] for r in range(n)], (
        result
    )
    assert {line.split()[4] for line in lines} == {str(n * (n - 1) // 2)}, result
    hosts = [line.split()[3] for line in lines]
    assert hosts == result["hosts"] and result["nranks"] == str(n), result
    return hosts


@needs_mpiexec
@pytest.mark.timeout(200)
def test_tasks_start_an_mpi_program_on_their_slots_on_this_machine(hello):
    r = run(
        ["--nthreads", "1", script("gang_launch.py"), hello, "2", "0", "3"],
        nprocs=5,
        env=REPO_ON_PATH,
        timeout=150,
    )
    assert r.code == 0, r
    results = launched(r.out)
    assert [res["i"] for res in results] == [0, 1, 2]
    for res in results:
        check(res, 2)
        assert res["prefix"].startswith("mpiexec -n 2 -hosts "), res


def three_node_gang(hello: str) -> list[str]:
    """Every rank's command for the three-node tests: MPI mode, one thread a worker, and
    one task of ``ranks=3``, at most one rank a node, that starts ``hello`` (gang_launch.py)."""
    return [sys.executable, "-m", "hpcsched", "--nthreads", "1",
            script("gang_launch.py"), hello, "3", "1", "1"]


@pytest.mark.timeout(300)
def test_a_gang_spread_over_three_nodes_starts_its_program_there_under_mpiexec(hello):
    require(missing_nodes(3), "sudo bash ci/nodes/start-nodes.sh 3")
    # rank 0 on node1, workers 1-3 on node2, node3, node1: one worker a node for the gang.
    # The task's own mpiexec runs on a node: it reaches the others with nsssh too, and
    # names them its eth0 address (the outer one's -iface flag wins over HYDRA_IFACE)
    cmd = [
        "mpiexec",
        "-launcher",
        "ssh",
        "-launcher-exec",
        NSSSH,
        "-iface",
        "hsbr0",
        "-hosts",
        "10.77.0.11,10.77.0.12,10.77.0.13",
        "-n",
        "4",
        *three_node_gang(hello),
    ]
    code, out = run_mpi(
        4,
        [],
        timeout=240,
        cmd=cmd,
        env={"HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": NSSSH, "HYDRA_IFACE": "eth0"},
    )
    assert code == 0, out[-5000:]
    [res] = launched(out)
    assert sorted(check(res, 3)) == ["node1", "node2", "node3"]
    assert res["prefix"].startswith("mpiexec -n 3 -hosts "), res


@pytest.mark.timeout(300)
def test_a_gang_spread_over_three_nodes_starts_its_program_there_under_srun(hello):
    require(
        missing_slurm(3),
        "sudo bash ci/batch/start-slurm.sh && sudo bash "
        "ci/nodes/start-nodes.sh 3 && sudo bash ci/nodes/start-slurm-nodes.sh 3",
        slurm=True,
    )
    name = f"hpcsched-test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, **REPO_ON_PATH, "SLURM_CONF": SLURM_CONF}
    cmd = [
        "srun",
        "-p",
        "multi",
        "-N",
        "3",
        "-n",
        "4",
        "--mpi=pmi2",
        "-J",
        name,
        "--time=5",
        *three_node_gang(hello),
    ]
    try:
        r = subprocess.run(
            cmd,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=240,
        )
    finally:
        subprocess.run(["scancel", "-n", name], env=env, timeout=30, capture_output=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    [res] = launched(r.stdout)
    assert sorted(check(res, 3)) == ["node1", "node2", "node3"]
    assert res["prefix"].startswith("srun --overlap -N 3 -n 3 "), res
