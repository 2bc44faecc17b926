"""hpcsched vs dask.distributed on one machine, side by side in one run.

    python benchmarks/bench_local.py [--tasks 10000] [--leaves 8192] [--repeat 3]
                                     [--sweep-sizes 100000[,1000000]] [--only sweep]

Both use a local cluster of 2 worker processes x 1 thread. Measured:

* ``map``: N no-op tasks submitted with ``client.map`` with a key per task (so
  that both systems make a task of each) and gathered;
* ``tree``: a binary tree reduction of L leaves submitted as one graph with
  ``client.get``;
* ``sweep``: ``client.map(noop, range(n))`` of ``--sweep-sizes`` elements
  (hpcsched: a bulk map), gathered, against
  ``concurrent.futures.ProcessPoolExecutor(2).map(noop, range(n), chunksize=16)``
  in the same run (dask's map of as many tasks is left out: minutes). Wall time
  and the CPU time of the submitting process.

Prints tasks/s for each system, best of ``--repeat`` runs, and the ratio
hpcsched / dask (hpcsched / ProcessPoolExecutor for the sweeps). Needs
``pip install 'dask[distributed]'``.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import logging
import os
import time
from operator import add

from _launch import timed  # benchmarks/ is on the path: the scripts run from it


def noop(x):
    return x


def tree_graph(leaves: int, prefix: str) -> tuple[dict, tuple]:
    dsk: dict = {(f"{prefix}leaf", i): (noop, i) for i in range(leaves)}
    level = [(f"{prefix}leaf", i) for i in range(leaves)]
    depth = 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), 2):
            k = (f"{prefix}add{depth}", i // 2)
            dsk[k] = (add, level[i], level[i + 1]) if i + 1 < len(level) else (noop, level[i])
            nxt.append(k)
        level = nxt
        depth += 1
    return dsk, level[0]


def run(client, ntasks: int, leaves: int, repeat: int) -> dict:
    out = {}
    best = float("inf")
    for r in range(repeat):
        t0 = time.perf_counter()
        futs = client.map(noop, range(ntasks), key=[f"noop-{r}-{i}" for i in range(ntasks)])
        res = client.gather(futs)
        dt = time.perf_counter() - t0
        assert res[-1] == ntasks - 1
        del futs, res
        best = min(best, dt)
    out["map_tasks_per_s"] = ntasks / best
    best = float("inf")
    expected = leaves * (leaves - 1) // 2
    for r in range(repeat):
        dsk, root = tree_graph(leaves, f"r{r}-")
        t0 = time.perf_counter()
        value = client.get(dsk, root)
        dt = time.perf_counter() - t0
        assert value == expected, (value, expected)
        best = min(best, dt)
    out["tree_tasks_per_s"] = (2 * leaves - 1) / best
    return out


def sweeps(args) -> list[int]:
    return [int(x) for x in args.sweep_sizes.split(",") if x]


def bench_hpcsched(args) -> dict:
    from hpcsched import Client, LocalCluster

    t0 = time.perf_counter()
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        startup = time.perf_counter() - t0
        out = run(client, args.tasks, args.leaves, args.repeat) if args.only is None else {}
        for n in sweeps(args):
            def do_map(n: int = n) -> None:
                futures = client.map(noop, range(n), pure=False)
                assert client.gather(futures) == list(range(n))
                del futures

            out[f"sweep_{n}"] = timed(args.repeat, do_map)
    out["startup_s"] = startup
    return out


def bench_pool(args) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    out = {}
    with ProcessPoolExecutor(2) as ex:
        list(ex.map(noop, range(1000), chunksize=16))  # both processes started
        for n in sweeps(args):
            def do_map(n: int = n) -> None:
                assert list(ex.map(noop, range(n), chunksize=16)) == list(range(n))

            out[f"sweep_{n}"] = timed(args.repeat, do_map)
    return out


def bench_dask(args) -> dict:
    import dask
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    with dask.config.set({"distributed.worker.daemon": False}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster, Client(cluster) as client:
        startup = time.perf_counter() - t0
        out = run(client, args.tasks, args.leaves, args.repeat)
    out["startup_s"] = startup
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--leaves", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sweep-sizes", default="100000",
                   help="elements of the no-op sweeps (comma-separated; '' for none)")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--only", choices=("sweep",),
                   help="run only these measurements (sweep: the sweeps, without dask)")
    args = p.parse_args()
    h = bench_hpcsched(args)
    pool = bench_pool(args)
    d: dict = {}
    if args.only is None:
        d = bench_dask(args)
        print(f"{'':28}{'hpcsched':>12}{'dask':>12}{'ratio':>8}")
        for k, label in (("map_tasks_per_s", f"map {args.tasks} no-ops (tasks/s)"),
                         ("tree_tasks_per_s", f"tree {args.leaves} leaves (tasks/s)"),
                         ("startup_s", "cluster startup (s)")):
            ratio = h[k] / d[k] if k != "startup_s" else d[k] / h[k]
            print(f"{label:28}{h[k]:12.1f}{d[k]:12.1f}{ratio:7.1f}x")
        print(f"(machine: {os.cpu_count()} cores; best of {args.repeat}; "
              "startup ratio is dask/hpcsched)")
    if sweeps(args):
        print(f"\n{'sweep, no-op elements':28}{'hpcsched':>12}{'pool(2)/16':>12}{'ratio':>8}"
              f"   CPU s of the submitter: hpcsched, pool")
        for n in sweeps(args):
            (hw, hc), (pw, pc) = h[f"sweep_{n}"], pool[f"sweep_{n}"]
            print(f"{f'map {n} (elements/s)':28}{n / hw:12.0f}{n / pw:12.0f}{pw / hw:7.2f}x"
                  f"   {hc:.2f}, {pc:.2f}")
        print("(hpcsched: a bulk map on 2 workers x 1 thread; pool: ProcessPoolExecutor(2)."
              "map(chunksize=16))")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hpcsched": h, "dask": d, "pool": pool}, f, indent=1)


if __name__ == "__main__":
    main()
