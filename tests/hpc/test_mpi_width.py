"""MPI mode at width and its start-up: many ranks on this 2-core machine (oversubscribed,
as a wide job on a small allocation), and what every rank imports before its first task.

benchmarks/bench_mpi_width.py runs the full width (256 ranks) against dask-mpi.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.hpc.test_bootstrap import REPO_ON_PATH, needs_mpiexec, run, script

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
    assert got["rank0"] == [], r
