"""joblib and scikit-learn on MPI worker ranks.

Under ``mpiexec -n 4 python -m hpcsched``: rank 0 runs the scheduler and this
script, ranks 1-3 the workers. ``Parallel`` calls, a ``GridSearchCV`` and a
``cross_val_score`` run on the worker ranks (their process ids), with the results
of ``n_jobs=1``; a ``Parallel`` inside a task fans out from its worker rank; an
exception in one call is raised as joblib raises it. Each check prints one line
the test reads.
"""

import os

import numpy as np
from joblib import Parallel, delayed, parallel_backend
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score, cross_validate

from hpcsched import Client


def square_where(i):
    return i * i, os.getpid()


def inner(i):
    out = Parallel()(delayed(square_where)(j) for j in range(4))
    return i + sum(v for v, _ in out), [pid for _, pid in out]


def fails_on(i):
    if i == 5:
        raise ValueError(f"call {i} is bad")
    return i


def pid_scorer(estimator, X, y):
    return float(os.getpid())


with Client() as client:
    ranks = set(client.run(os.getpid).values())
    assert os.getpid() not in ranks
    with parallel_backend("hpcsched"):
        out = Parallel()(delayed(square_where)(i) for i in range(30))
        assert [v for v, _ in out] == [i * i for i in range(30)]
        assert {pid for _, pid in out} <= ranks, ({pid for _, pid in out}, ranks)
        print(f"parallel on worker ranks: {len({pid for _, pid in out})}", flush=True)

        nested = Parallel(batch_size=1)(delayed(inner)(i) for i in range(3))
        assert [v for v, _ in nested] == [i + 14 for i in range(3)]
        assert {p for _, pids in nested for p in pids} <= ranks
        print("nested parallel on worker ranks", flush=True)

        try:
            Parallel()(delayed(fails_on)(i) for i in range(10))
        except ValueError as e:
            print(f"a call raised {type(e).__name__}: {e}", flush=True)

    X, y = make_classification(n_samples=300, n_features=20, random_state=0)
    grid = {"C": [0.001, 0.01, 0.1, 1.0, 10.0]}
    scoring = {"accuracy": "accuracy", "pid": pid_scorer}
    alone = GridSearchCV(LogisticRegression(max_iter=500), grid, cv=4, scoring=scoring,
                         refit="accuracy", n_jobs=1).fit(X, y)
    scores_alone = cross_val_score(LogisticRegression(max_iter=500), X, y, cv=5, n_jobs=1)
    with parallel_backend("hpcsched"):
        spread = GridSearchCV(LogisticRegression(max_iter=500), grid, cv=4, scoring=scoring,
                              refit="accuracy").fit(X, y)
        scores = cross_val_score(LogisticRegression(max_iter=500), X, y, cv=5)
        where = cross_validate(LogisticRegression(max_iter=500), X, y, cv=5,
                               scoring={"pid": pid_scorer})
    assert spread.best_params_ == alone.best_params_
    # to 1e-12, not the last bit: numpy's SIMD sums depend on an array's alignment
    np.testing.assert_allclose(spread.cv_results_["mean_test_accuracy"],
                               alone.cv_results_["mean_test_accuracy"], rtol=1e-12)
    fit_pids = {int(spread.cv_results_[f"split{k}_test_pid"][c])
                for k in range(4) for c in range(len(grid["C"]))}
    assert fit_pids <= ranks, (fit_pids, ranks)
    print(f"grid search best {spread.best_params_} as n_jobs=1, "
          f"fits on {len(fit_pids)} worker ranks", flush=True)
    np.testing.assert_allclose(scores, scores_alone, rtol=1e-12)
    assert {int(p) for p in where["test_pid"]} <= ranks
    print("cross_val_score as n_jobs=1 on worker ranks", flush=True)
