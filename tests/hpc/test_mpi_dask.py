"""dask collections and dask's get-function conformance suite over MPI (pytest-mpi).

    mpiexec -n 4 python -m pytest --with-mpi -q tests/hpc/test_mpi_dask.py

Uses the ``cluster`` fixture of tests/hpc/conftest.py (rank 0: scheduler on ``mpi://0``
and a client; the other ranks: workers); the tests run on rank 0. Expected
values come from dask's synchronous scheduler. tests/hpc/test_mpi_launch.py
runs this under mpiexec in the plain suite.
"""

from __future__ import annotations

import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask import delayed
from dask.utils_test import GetFunctionTestMixin

from tests.hpc.conftest import WAIT

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]


def sync(x):
    return dask.compute(x, scheduler="sync")[0]


def inc(x):
    return x + 1


def test_collections_computed_with_plain_compute(cluster):
    if cluster is None:
        return
    from hpcsched.core.client.client import Client

    sched = cluster[1]
    with Client(sched.inproc_address) as client:  # the default scheduler while it lives
        rs = da.random.RandomState(1)
        x = rs.random((200, 200), chunks=50)
        arr = (x @ x.T).mean(axis=0)
        np.testing.assert_allclose(arr.compute(), sync(arr))
        pdf = pd.DataFrame({"k": np.arange(300) % 5, "v": np.arange(300.0)})
        grouped = dd.from_pandas(pdf, npartitions=6).groupby("k").v.mean()
        pd.testing.assert_series_equal(grouped.compute().sort_index(),
                                       sync(grouped).sort_index())
        bag = db.from_sequence(range(50), npartitions=5).map(inc)
        assert bag.sum().compute() == sync(bag.sum())
        assert delayed(inc)(client.submit(inc, 1)).compute() == 3
        assert client.submit(inc, client.submit(inc, 1)).result(timeout=WAIT) == 3
        y = client.persist(x + 1)
        assert float(y.sum().compute()) == pytest.approx(float(sync((x + 1).sum())))


class TestMPIClientGetDaskConformance(GetFunctionTestMixin):
    """dask's own tests of a get function, run against ``Client.get`` over MPI."""

    @pytest.fixture(autouse=True)
    def _client(self, cluster):
        if cluster is None:
            pytest.skip("the tests run on rank 0")
        self.client = cluster[0]

    def get(self, dsk, keys, **kwargs):
        out = self.client.get(dsk, keys, timeout=WAIT)
        return _as_tuples(keys, out)


def _as_tuples(keys, result):
    """Client.get returns lists for lists of keys (as distributed's); dask's get functions
    return tuples."""
    if isinstance(keys, list):
        return tuple(_as_tuples(k, r) for k, r in zip(keys, result, strict=True))
    return result
