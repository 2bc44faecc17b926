"""The examples run as a user runs them, and print what they promise.

``examples/dask_collections.py`` both ways its docstring gives: ``python
examples/dask_collections.py`` (a LocalCluster) and ``mpiexec -n 4 python -m
hpcsched examples/dask_collections.py``. Each run has a timeout, and no process
of it may outlive it (``run`` of tests/hpc/mpi_scripts.py).
"""

from __future__ import annotations

import re

import pytest

from tests.hpc.mpi_scripts import run
from tests.hpc.mpirun import REPO, needs_mpiexec

DASK_EXAMPLE = REPO / "examples" / "dask_collections.py"


def check_dask_example_output(out: str, err: str) -> int:
    """The example's printed results (its data are seeded); the number of workers."""
    assert "array: (2000, 2000) in 16 chunks, mean 0.500, covariance trace 166." in out, out
    assert "dataframe: 86,400 rows in 10 partitions, 26 names, 86,400 rows counted" in out, out
    assert re.search(r"^name\s*$", out, re.M) and re.search(r"^\w+\s+-?0\.0\d\d\s+", out, re.M), out
    assert re.search(r"x between -1\.000 and 1\.000", out), out
    assert "Traceback" not in err and "Warning" not in err, err
    m = re.search(r"computed on (\d+) workers in \d+\.\d s", out)
    assert m, out
    return int(m.group(1))


@pytest.mark.timeout(150)
def test_dask_example_on_a_local_cluster():
    pytest.importorskip("dask.dataframe")
    r = run([str(DASK_EXAMPLE)], nprocs=None, module=False, timeout=120)
    assert r.code == 0, r
    assert check_dask_example_output(r.out, r.err) >= 1, r


@needs_mpiexec
@pytest.mark.timeout(150)
def test_dask_example_under_mpiexec():
    pytest.importorskip("dask.dataframe")
    r = run([str(DASK_EXAMPLE)], nprocs=4, timeout=120)
    assert r.code == 0, r
    assert check_dask_example_output(r.out, r.err) == 3, r  # ranks 1-3
