"""dask collections on hpcsched: build a dask array and a dask dataframe, call .compute().

On this machine (a LocalCluster of worker processes):

    python examples/dask_collections.py

The same script, unchanged, on 4 MPI ranks (rank 0: scheduler + this script,
ranks 1-3: workers):

    mpiexec -n 4 python -m hpcsched examples/dask_collections.py

Needs dask with its array and dataframe parts: pip install 'dask[array,dataframe]'.
"""

from __future__ import annotations

import time

import dask
import dask.array as da

from hpcsched import Client


def main() -> None:
    # Client() starts a LocalCluster sized to this machine -- or, under `python -m hpcsched`,
    # connects to the MPI job's scheduler. While the client lives it is dask's scheduler:
    # every plain .compute() below runs on its workers.
    with Client() as client:
        nworkers = len(client.scheduler_info()["workers"])
        start = time.perf_counter()

        # a dask array: 2,000 x 2,000 random numbers in 16 chunks of 500 x 500,
        # made on the workers
        x = da.random.default_rng(42).random((2000, 2000), chunks=(500, 500))
        col_mean = x.mean(axis=0)                       # lazy: nothing computed yet
        centred = x - col_mean                          # broadcasts against every chunk
        gram = (centred.T @ centred) / (x.shape[0] - 1)  # the covariance matrix, lazily
        print(f"array: {x.shape} in {x.npartitions} chunks, "
              f"mean {x.mean().compute():.3f}, covariance trace {gram.trace().compute():.1f}")

        # a dask dataframe: 10 days of one row per 10 s, one partition per day, generated
        # on the workers (dask.dataframe.read_csv / read_parquet work the same way)
        df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-11", freq="10s",
                                      partition_freq="1D", seed=42)
        by_name = df.groupby("name").agg({"x": "mean", "y": "max", "id": "count"})
        result = by_name.compute()                      # a pandas DataFrame
        print(f"dataframe: {len(df):,} rows in {df.npartitions} partitions, "
              f"{len(result)} names, {result['id'].sum():,} rows counted")
        print(result.head(3).round(3).to_string())

        # several results in one go: the partitions they share are made once
        low, high = dask.compute(df.x.min(), df.x.max())
        print(f"x between {low:.3f} and {high:.3f}")

    print(f"computed on {nworkers} workers in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
