"""joblib and scikit-learn under ``mpiexec -n 4 python -m hpcsched``: the calls run on
the worker ranks, with the results of ``n_jobs=1`` (tests/hpc/scripts/joblib_sklearn.py
checks them and says so line by line)."""

from __future__ import annotations

import pytest

from tests.hpc.mpi_scripts import REPO_ON_PATH, run, script
from tests.hpc.mpirun import needs_mpiexec


@needs_mpiexec
@pytest.mark.timeout(200)
def test_joblib_and_scikit_learn_run_on_the_worker_ranks():
    # one thread per worker rank: a call running a Parallel of its own must give its
    # thread back while it waits, or its inner calls would find none
    r = run(["--nthreads", "1", script("joblib_sklearn.py")], timeout=180, env=REPO_ON_PATH)
    assert r.code == 0, r
    assert "parallel on worker ranks: " in r.out, r
    assert "nested parallel on worker ranks" in r.out, r
    assert "a call raised ValueError: call 5 is bad" in r.out, r
    assert "grid search best {'C': " in r.out and " as n_jobs=1, fits on " in r.out, r
    assert "cross_val_score as n_jobs=1 on worker ranks" in r.out, r
