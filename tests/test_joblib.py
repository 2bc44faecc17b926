"""joblib's ``Parallel`` and scikit-learn's ``n_jobs`` on a LocalCluster's worker processes.

Every test calls joblib the way a user does (``with parallel_backend("hpcsched"):``,
``parallel_backend("dask")`` with an hpcsched client) and checks where the calls ran by
process id: the workers' (``client.run(os.getpid)``), never the test's. Expected values
come from joblib run without a cluster (``n_jobs=1``).
"""

from __future__ import annotations

import os
import time

import joblib
import numpy as np
import pytest
from joblib import Parallel, delayed, parallel_backend

from hpcsched.core.client.client import Client
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)


def square_where(i: int) -> tuple[int, int]:
    time.sleep(0.05)  # long enough that both workers take batches
    return i * i, os.getpid()


def total_where(data: np.ndarray, i: int) -> tuple[float, int]:
    return float(data.sum()) + i, os.getpid()


def fails_on(i: int, bad: int) -> int:
    if i == bad:
        raise ValueError(f"call {i} is bad")
    return i


def slow_unless_first(i: int, marks: str) -> int:
    if i == 0:
        raise KeyError("the first call fails")
    with open(os.path.join(marks, str(i)), "w"):
        pass  # this call started
    time.sleep(2.0)
    return i


def inner_sum(i: int) -> tuple[int, list[int]]:
    """A call that runs a Parallel of its own: its calls fan out from the worker."""
    out = Parallel()(delayed(square_where)(j) for j in range(4))
    return i + sum(v for v, _ in out), sorted({pid for _, pid in out})


@pytest.fixture
def pids(client):
    return set(client.run(os.getpid).values())


def test_parallel_runs_its_calls_on_the_workers(client, pids):
    with parallel_backend("hpcsched", client=client):
        out = Parallel(n_jobs=-1)(delayed(square_where)(i) for i in range(20))
    assert [v for v, _ in out] == [i * i for i in range(20)]
    ran_on = {pid for _, pid in out}
    assert ran_on == pids and os.getpid() not in ran_on


def test_n_jobs_counts_the_clusters_threads(client):
    with parallel_backend("hpcsched", client=client):
        assert joblib.effective_n_jobs(-1) == 2
        assert joblib.effective_n_jobs(5) == 2
        # fewer than two would have joblib run the calls in this process
        assert joblib.effective_n_jobs(-2) == 2
        assert joblib.effective_n_jobs(1) == 1  # asked for: joblib's sequential run


def test_a_large_argument_is_scattered_once_per_call(client, pids, monkeypatch):
    data = np.arange(200_000, dtype=float)  # 1.6 MB, sent with no batch
    scattered = []
    scatter = client.scatter

    def counting_scatter(value, *args, **kwargs):
        scattered.append(value)
        return scatter(value, *args, **kwargs)

    monkeypatch.setattr(client, "scatter", counting_scatter)
    with parallel_backend("hpcsched", client=client):
        out = Parallel(batch_size=1)(delayed(total_where)(data, i) for i in range(12))
    assert [v for v, _ in out] == [float(data.sum()) + i for i in range(12)]
    assert len(scattered) == 1 and scattered[0] is data
    assert {pid for _, pid in out} <= pids
    # the call over, its copy leaves the workers
    wait_until(lambda: not any(client.has_what().values()), timeout=10,
               what="the scattered argument released")


def test_an_exception_surfaces_as_joblib_raises_it(client):
    with pytest.raises(ValueError, match="call 3 is bad") as sequential:
        Parallel(n_jobs=1)(delayed(fails_on)(i, 3) for i in range(8))
    with parallel_backend("hpcsched", client=client), \
            pytest.raises(ValueError, match="call 3 is bad") as on_cluster:
        Parallel()(delayed(fails_on)(i, 3) for i in range(8))
    assert type(on_cluster.value) is type(sequential.value)
    # the backend and the cluster go on working
    with parallel_backend("hpcsched", client=client):
        assert Parallel()(delayed(fails_on)(i, -1) for i in range(4)) == [0, 1, 2, 3]


def test_an_abort_cancels_the_pending_batches(client, tmp_path):
    with parallel_backend("hpcsched", client=client), \
            pytest.raises(KeyError, match="the first call fails"):
        Parallel(batch_size=1, pre_dispatch="all")(
            delayed(slow_unless_first)(i, str(tmp_path)) for i in range(40))
    # 39 two-second calls would keep both threads busy for 40 s: the calls not started
    # when joblib aborted are cancelled, so the cluster soon holds no task
    wait_until(lambda: client.run_on_scheduler(_count_tasks) == 0, timeout=20,
               what="no task left on the scheduler")
    started = len(os.listdir(tmp_path))
    assert started < 10, f"{started} of 39 calls started after the abort"


def _count_tasks(dask_scheduler) -> int:
    return len(dask_scheduler.state.tasks)


def test_nested_parallel_fans_out_from_the_workers_without_deadlock(client, pids):
    # two workers with one thread each: the outer calls hold both threads while their inner
    # calls need threads too
    with parallel_backend("hpcsched", client=client):
        out = Parallel(batch_size=1)(delayed(inner_sum)(i) for i in range(2))
    assert [v for v, _ in out] == [i + 14 for i in range(2)]
    assert set().union(*(set(p) for _, p in out)) <= pids


def test_dask_and_hpcsched_name_this_backend_while_an_hpcsched_client_is_current(cluster):
    with Client(cluster) as client:  # the default client
        pids = set(client.run(os.getpid).values())
        with parallel_backend("dask"):
            out = Parallel()(delayed(square_where)(i) for i in range(8))
        assert [v for v, _ in out] == [i * i for i in range(8)]
        assert {pid for _, pid in out} <= pids
        # named by Parallel itself rather than a context: the default client too
        out = Parallel(n_jobs=-1, backend="hpcsched")(delayed(square_where)(i) for i in range(8))
        assert [v for v, _ in out] == [i * i for i in range(8)]
        assert {pid for _, pid in out} <= pids


def test_without_a_client_the_backend_says_what_to_create():
    with pytest.raises(ValueError, match="needs a Client"), parallel_backend("hpcsched"):
        pass
    # "dask" without an hpcsched client is joblib's own backend, with its own message
    with pytest.raises(ValueError) as dask_error, parallel_backend("dask"):
        pass
    assert "needs a Client" not in str(dask_error.value)


# ---------------------------------------------------------------- scikit-learn
def pid_scorer(estimator, X, y) -> float:
    """A scorer reporting where the fit it scores ran (fit and score share one call)."""
    return float(os.getpid())


def test_grid_search_matches_n_jobs_1_and_fits_on_the_workers(client, pids):
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    X, y = make_classification(n_samples=300, n_features=20, random_state=0)
    grid = {"C": [0.001, 0.01, 0.1, 1.0, 10.0]}
    scoring = {"accuracy": "accuracy", "pid": pid_scorer}

    def search(n_jobs):
        return GridSearchCV(LogisticRegression(max_iter=500), grid, cv=4, scoring=scoring,
                            refit="accuracy", n_jobs=n_jobs).fit(X, y)

    alone = search(1)
    with parallel_backend("hpcsched", client=client):
        spread = search(None)
    assert spread.best_params_ == alone.best_params_
    # Equal to the last bit is not promised: numpy's SIMD sums depend on how an
    # array that crossed a pickle is aligned in memory (one ulp, seen in CI).
    np.testing.assert_allclose(spread.cv_results_["mean_test_accuracy"],
                               alone.cv_results_["mean_test_accuracy"], rtol=1e-12)
    fit_pids = {int(spread.cv_results_[f"split{k}_test_pid"][c])
                for k in range(4) for c in range(len(grid["C"]))}
    assert fit_pids == pids and os.getpid() not in fit_pids


def test_cross_val_score_matches_n_jobs_1_and_fits_on_the_workers(client, pids):
    from sklearn.datasets import make_regression
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.model_selection import cross_val_score, cross_validate

    X, y = make_regression(n_samples=200, n_features=8, random_state=1)
    model = RandomForestRegressor(n_estimators=20, random_state=0)
    alone = cross_val_score(model, X, y, cv=5, n_jobs=1)
    with parallel_backend("hpcsched", client=client):
        spread = cross_val_score(model, X, y, cv=5)
        where = cross_validate(model, X, y, cv=5, scoring={"pid": pid_scorer})
    np.testing.assert_allclose(spread, alone, rtol=1e-12)  # one ulp apart was seen
    ran_on = {int(p) for p in where["test_pid"]}
    assert ran_on <= pids and os.getpid() not in ran_on
