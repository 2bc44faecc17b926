"""MPI mode across nodes: MPICH's ``mpiexec`` starts ranks on two emulated nodes.

Hydra's ssh launcher is pointed at ``ci/nodes/nsssh``, which runs a command in a node's
network namespace (:mod:`tests.nodes`); ``-iface hsbr0`` tells the nodes' proxies the login
side's address on the cluster network. Ranks on different nodes share no abstract socket,
so they cannot ring each other's doorbells, as on a real cluster. Results and exit status
must be exactly what one node gives.
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from tests.hpc.test_mpi_launch import REPO, run_mpi
from tests.nodes import missing_nodes, require

NSSSH = str(REPO / "ci" / "nodes" / "nsssh")
# what the MPI library (MPICH, UCX, libfabric) says when something is left over at exit
LIBRARY_WARNING = re.compile(r"UCX +(WARN|ERROR)|was not matched|leaked|libfabric:\d+")

SCRIPT = textwrap.dedent("""
    import socket
    import sys

    from hpcsched import Client


    def block(seed):
        import numpy as np
        return np.random.default_rng(seed).random(200_000)


    def where(_=None):
        return socket.gethostname()


    with Client() as client:
        hosts = client.run(where)
        print("hosts", " ".join(sorted(hosts.values())), flush=True)
        # one block on each worker, then every worker sums all of them: transfers
        # between the ranks on the other node and those on this one
        workers = sorted(hosts)
        parts = [client.submit(block, i, workers=[w], pure=False)
                 for i, w in enumerate(workers)]
        sums = [client.submit(lambda *bs: float(sum(b.sum() for b in bs)), *parts,
                              workers=[w], pure=False) for w in workers]
        print("sums", " ".join(f"{s:.6f}" for s in client.gather(sums)), flush=True)
        if sys.argv[1:] == ["fail"]:
            client.submit(lambda: 1 / 0).result()
""")


@pytest.fixture(scope="module")
def two_nodes() -> None:
    require(missing_nodes(2), "sudo bash ci/nodes/start-nodes.sh 3")
    if shutil.which("mpiexec") is None:
        pytest.skip("mpiexec is not on PATH")


def mpiexec_cmd(script: Path, *args: str, nodes: tuple[int, ...] = (1, 2), n: int = 4
                ) -> list[str]:
    """mpiexec over ``nodes``, one slot each: rank r on ``nodes[r % len(nodes)]``."""
    return ["mpiexec", "-launcher", "ssh", "-launcher-exec", NSSSH, "-iface", "hsbr0",
            "-hosts", ",".join(f"10.77.0.1{i}" for i in nodes), "-n", str(n), sys.executable,
            "-m", "hpcsched", str(script), *args]


def mpiexec(script: Path, *args: str, nodes: tuple[int, ...] = (1, 2), n: int = 4
            ) -> tuple[int, str]:
    return run_mpi(n, [], timeout=120, cmd=mpiexec_cmd(script, *args, nodes=nodes, n=n))


@pytest.mark.timeout(180)
def test_ranks_on_two_nodes_compute_and_transfer_as_on_one(two_nodes, tmp_path):
    import numpy as np

    script = tmp_path / "across.py"
    script.write_text(SCRIPT)
    code, out = mpiexec(script)
    assert code == 0, out[-5000:]
    # rank 0 (scheduler and script) on node1; workers: ranks 1, 3 on node2, rank 2 on node1
    hosts = next(line for line in out.splitlines() if line.startswith("hosts ")).split()[1:]
    assert hosts == ["node1", "node2", "node2"], out[-5000:]
    expected = sum(float(np.random.default_rng(i).random(200_000).sum()) for i in range(3))
    sums = [float(s) for s in next(line for line in out.splitlines()
                                   if line.startswith("sums ")).split()[1:]]
    assert sums == pytest.approx([expected] * 3)
    # every message sent was received before MPI_Finalize: the library has nothing to say
    assert not LIBRARY_WARNING.search(out), out[-5000:]


@pytest.mark.timeout(180)
def test_an_error_in_the_script_ends_every_rank_on_every_node_with_a_nonzero_status(
        two_nodes, tmp_path):
    script = tmp_path / "across.py"
    script.write_text(SCRIPT)
    code, out = mpiexec(script, "fail")
    assert code != 0, out[-5000:]
    assert "ZeroDivisionError" in out
