"""Spilling: results three times the workers' memory, hpcsched vs dask.distributed, one run.

    python benchmarks/bench_spill.py [--workers 2] [--memory-mb 250] [--block-mb 20] [--repeat 2]

Each system gets a local cluster of ``--workers`` processes x 1 thread, each with a
``memory_limit`` of ``--memory-mb`` and its spill directory in the same temporary
directory (same disk). The graph: ``3 x workers x memory / block`` tasks, each making a
``--block-mb`` numpy array, all held by the client's futures (so every result must be kept,
on disk past the target fraction); then one small task per block reads it back (unspilling
it) and the client gathers those figures. Memory fractions are both systems' defaults
(target 0.6, spill 0.7, pause 0.8, terminate 0.95).

Reported per system, best of ``--repeat``: seconds to make every block, seconds to read
them all back, the ratio is
hpcsched / dask for times (below 1: hpcsched faster). Needs ``pip install
'dask[distributed]'``.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import logging
import os
import tempfile
import time

import numpy as np

MB = 1_000_000


def block(i: int, nbytes: int) -> np.ndarray:
    return np.full(nbytes // 8, i, dtype=np.float64)


def first(x: np.ndarray) -> float:
    return float(x[0])


def run(client, wait, n: int, nbytes: int, repeat: int) -> dict:
    best = {"make_s": float("inf"), "read_s": float("inf")}
    for _ in range(repeat):
        t0 = time.perf_counter()
        futures = [client.submit(block, i, nbytes, pure=False) for i in range(n)]
        wait(futures)
        t1 = time.perf_counter()
        firsts = client.gather([client.submit(first, f, pure=False) for f in futures])
        t2 = time.perf_counter()
        assert firsts == [float(i) for i in range(n)]
        best["make_s"] = min(best["make_s"], t1 - t0)
        best["read_s"] = min(best["read_s"], t2 - t1)
        del futures
        time.sleep(1.0)  # let workers free the previous round's results (files included)
    return best


def bench_hpcsched(args, n: int, directory: str) -> dict:
    from hpcsched import Client, LocalCluster, wait

    with LocalCluster(n_workers=args.workers, threads_per_worker=1,
                      memory_limit=args.memory_mb * MB, local_directory=directory) as cluster, \
            Client(cluster, set_as_default=False) as client:
        return run(client, wait, n, args.block_mb * MB, args.repeat)


def bench_dask(args, n: int, directory: str) -> dict:
    import dask
    from distributed import Client, LocalCluster, wait

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with dask.config.set({"distributed.worker.daemon": False,
                          "temporary-directory": directory}), \
            LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                         memory_limit=args.memory_mb * MB, dashboard_address=None,
                         local_directory=directory) as cluster, Client(cluster) as client:
        return run(client, wait, n, args.block_mb * MB, args.repeat)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--memory-mb", type=int, default=250)
    p.add_argument("--block-mb", type=int, default=20)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    n = 3 * args.workers * args.memory_mb // args.block_mb
    print(f"{n} blocks of {args.block_mb} MB = {n * args.block_mb} MB of results on "
          f"{args.workers} workers x {args.memory_mb} MB")
    out = {}
    for name, fn in (("hpcsched", bench_hpcsched), ("dask", bench_dask)):
        with tempfile.TemporaryDirectory(prefix=f"bench-spill-{name}-") as d:
            out[name] = fn(args, n, d)
    h, d = out["hpcsched"], out["dask"]
    print(f"{'':24}{'hpcsched':>12}{'dask':>12}{'ratio':>8}")
    for k in ("make_s", "read_s"):
        print(f"{k:24}{h[k]:12.2f}{d[k]:12.2f}{h[k] / d[k]:8.2f}")
    print(f"(machine: {os.cpu_count()} cores; best of {args.repeat}; ratio hpcsched/dask)")


if __name__ == "__main__":
    main()
