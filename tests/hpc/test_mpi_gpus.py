"""A worker per GPU in MPI mode, on an emulated node: ``CUDA_VISIBLE_DEVICES=5,7`` for
every rank of ``mpiexec -n 3 python -m hpcsched --worker-per-gpu``. Rank 0 runs the
scheduler and the script; worker ranks 1 and 2 take the device of index their local rank
modulo 2 (7 and 5), each seeing it alone."""

from __future__ import annotations

import json
import re

import pytest

from tests.hpc.mpi_scripts import REPO_ON_PATH, run, script
from tests.hpc.mpirun import needs_mpiexec


@needs_mpiexec
@pytest.mark.timeout(120)
def test_each_worker_rank_takes_one_gpu_by_local_rank_and_sees_it_alone():
    r = run(["--nthreads", "1", "--worker-per-gpu", script("gpus.py")], nprocs=3,
            env={**REPO_ON_PATH, "CUDA_VISIBLE_DEVICES": "5,7"}, timeout=90)
    assert r.code == 0, r
    m = re.search(r"^GPUS (.*)$", r.out, re.M)
    assert m, r
    got = json.loads(m.group(1))
    assert got["resources"] == [1, 1]
    assert sorted(s["process"] for s in got["seen"]) == ["5", "7"]
    for s in got["seen"]:
        assert s["ids"] == [s["process"]] and s["child"] == s["process"]
        assert s["ordinal"] == 0
