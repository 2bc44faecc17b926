"""MPI mode at width and its start-up: many ranks on this 2-core machine (oversubscribed,
as a wide job on a small allocation), and what every rank imports before its first task.

benchmarks/bench_mpi_width.py runs the full width (256 ranks) against dask-mpi.
"""

from __future__ import annotations

import json
import re

import pytest

from hpcsched.hpc.mpi_init import rdma_devices
from tests.hpc.mpi_scripts import REPO_ON_PATH, run, script
from tests.hpc.mpirun import needs_mpiexec

RANKS = 32


@needs_mpiexec
@pytest.mark.timeout(300)
def test_a_map_over_32_ranks_gives_the_right_result_and_every_rank_exits():
    # run() kills the job at its timeout and checks that no process of it is left
    r = run([script("width.py"), "2000"], nprocs=RANKS, timeout=240)
    assert r.code == 0, r
    m = re.search(r"WIDTH (\d+) (\d+)", r.out)
    assert m, r
    assert (int(m.group(1)), int(m.group(2))) == (RANKS - 1, 2000 * 2001 // 2), r
    assert "Traceback" not in r.err and "WARNING" not in r.err, r


@needs_mpiexec
@pytest.mark.timeout(120)
def test_ranks_import_no_heavy_module_before_the_first_task():
    # dask, pandas, numpy, YAML, zict, the batch systems: none is needed to start; rank 0
    # listens for the dashboard (configured by default), whose server is loaded when a
    # browser connects
    r = run([script("startup_imports.py")], nprocs=3, env=REPO_ON_PATH)
    assert r.code == 0, r
    m = re.search(r"IMPORTS (.*)", r.out)
    assert m, r
    got = json.loads(m.group(1))
    assert got["workers"] == [[], []], r
    # nor the client's protocol: a worker rank reads the worker's records alone
    assert got["client_side"] == [[], []], r
    # nor subprocess: it runs no command (asking nvidia-smi only where there is one)
    assert got["commands"] == [[], []], r
    assert got["rank0"] == [], r


@needs_mpiexec
@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", ["python -m hpcsched", "initialize()"])
@pytest.mark.parametrize("paused", [False, True])
def test_the_garbage_collector_runs_again_on_every_rank_once_started(start, paused):
    # each rank starts with it paused (its start makes no garbage); after, it is as the
    # program left it, and nothing stays frozen out of its reach
    args = [script("collector.py"), *(["paused"] if paused else [])]
    if start == "initialize()":
        r = run([*args, "initialize"], nprocs=3, env=REPO_ON_PATH, module=False)
    else:
        r = run(args, nprocs=3, env=REPO_ON_PATH)
    assert r.code == 0, r
    m = re.search(r"COLLECTOR (.*)", r.out)
    assert m, r
    seen = {"enabled": not paused, "frozen": 0}
    # the script pauses it only once running: under python -m hpcsched the workers never
    # see that pause
    workers = {"enabled": not paused or start == "python -m hpcsched", "frozen": 0}
    assert json.loads(m.group(1)) == {"rank0": seen, "workers": [workers, workers]}, r


@needs_mpiexec
@pytest.mark.timeout(120)
@pytest.mark.parametrize("given", [None, "yes"])
def test_ucx_memory_hooks_are_off_on_a_node_without_rdma_devices_unless_asked_for(
        given, monkeypatch):
    # they make every rank's start ~40 ms of CPU longer, for RDMA registrations alone
    monkeypatch.delenv("UCX_MEM_EVENTS", raising=False)
    env = dict(REPO_ON_PATH, **({} if given is None else {"UCX_MEM_EVENTS": given}))
    r = run([script("ucx_env.py")], nprocs=3, env=env)
    assert r.code == 0, r
    m = re.search(r"UCX (.*)", r.out)
    assert m, r
    expected = given or (None if rdma_devices() else "no")
    assert json.loads(m.group(1)) == {"rank0": expected, "workers": [expected, expected]}, r


def test_rdma_devices_are_listed_from_sysfs(tmp_path):
    assert rdma_devices(str(tmp_path / "absent")) == []
    (tmp_path / "mlx5_0").mkdir()
    assert rdma_devices(str(tmp_path)) == ["mlx5_0"]
