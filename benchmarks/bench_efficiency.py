"""Efficiency against task duration: hpcsched, dask.distributed, mpi4py.futures and a
process pool, side by side in one run, on the same number of workers.

    python benchmarks/bench_efficiency.py [--durations 1e-5,1e-4,1e-3,1e-2,1e-1,1]
                                          [--budget 10] [--max-tasks 100000]
                                          [--systems hpcsched,dask,mpi4py.futures,pool]
                                          [--workers 2] [--json FILE]

For each duration d, each system runs a map of n calls of ``time.sleep(d)`` on
``--workers`` one-thread workers, and its efficiency is the ideal time over the measured
one: ``n x c / workers / wall``, where c is what one call costs where it runs, measured on
the workers just before the map (``time.sleep`` oversleeps by tens of microseconds, more on
a loaded machine: that is the task's, not the scheduler's). n makes the ideal time about ``--budget`` seconds (at least two
calls a worker, at most ``--max-tasks``). Efficiency near 1 means the system adds nothing
to tasks of that length; the duration where it falls below 0.9 is the shortest task worth
sending it. Sleeping tasks leave the cores to the systems' own processes, so on a machine
with few cores this measures what the systems cost, not how the tasks share the CPU.

* hpcsched: ``LocalCluster(n_workers=W, threads_per_worker=1)``, ``client.map`` (a bulk
  map);
* dask: ``distributed.LocalCluster(n_workers=W, threads_per_worker=1)``, ``client.map``;
* mpi4py.futures: ``mpiexec -n W+1 python -m mpi4py.futures``, ``executor.map`` with
  chunksize 1 (its default) and a chunksize giving each worker 4 chunks;
* pool: ``concurrent.futures.ProcessPoolExecutor(W).map`` with the same chunksize.

Each sub-run is a process tree of its own, ended whatever happens (benchmarks/_launch.py).
"""

from __future__ import annotations

# _checkout must come first, before anything imports hpcsched: not in isort's order
# ruff: noqa: I001
import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.abspath(__file__)
SYSTEMS = ("hpcsched", "dask", "mpi4py.futures", "pool")


def nap(d: float) -> float:
    time.sleep(d)
    return d


def cost_of(d: float) -> float:
    """Seconds one ``nap(d)`` takes here (the mean of enough calls to fill ~0.2 s)."""
    reps = max(3, min(2000, int(0.2 / max(d, 1e-5))))
    t0 = time.perf_counter()
    for _ in range(reps):
        nap(d)
    return (time.perf_counter() - t0) / reps


def plan(d: float, cost: float, args: argparse.Namespace) -> int:
    n = int(args.budget * args.workers / cost)
    return max(2 * args.workers, min(args.max_tasks, n))


def sweep(run_map, cost_on_workers, args: argparse.Namespace, label: str) -> list[dict]:
    """``run_map(d, n)`` for each duration: rows of duration, n, wall, efficiency;
    ``cost_on_workers(d)``: what one call costs on the workers (the mean of theirs)."""
    rows = []
    run_map(1e-5, 4 * args.workers)  # warm-up: every worker started and serving
    for d in (float(x) for x in args.durations.split(",")):
        cost = cost_on_workers(d)
        n = plan(d, cost, args)
        t0 = time.perf_counter()
        run_map(d, n)
        wall = time.perf_counter() - t0
        rows.append({"system": label, "duration": d, "task_s": cost, "tasks": n, "wall": wall,
                     "efficiency": n * cost / args.workers / wall})
        print(f"{label:28s} {d:>8g} s  n={n:<7d} wall {wall:7.2f} s  "
              f"efficiency {rows[-1]['efficiency']:.3f}", file=sys.stderr, flush=True)
    return rows


def chunk_of(n: int, args: argparse.Namespace) -> int:
    return max(1, n // (4 * args.workers))


def role_hpcsched(args: argparse.Namespace) -> list[dict]:
    from hpcsched import Client, LocalCluster

    with LocalCluster(n_workers=args.workers, threads_per_worker=1) as cluster, \
            Client(cluster) as client:
        def run_map(d: float, n: int) -> None:
            assert len(client.gather(client.map(nap, [d] * n, pure=False))) == n

        def cost(d: float) -> float:
            return statistics.mean(client.gather(
                [client.submit(cost_of, d, pure=False) for _ in range(args.workers)]))

        return sweep(run_map, cost, args, "hpcsched")


def role_dask(args: argparse.Namespace) -> list[dict]:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        def run_map(d: float, n: int) -> None:
            assert len(client.gather(client.map(nap, [d] * n, pure=False))) == n

        def cost(d: float) -> float:
            return statistics.mean(client.gather(
                [client.submit(cost_of, d, pure=False) for _ in range(args.workers)]))

        return sweep(run_map, cost, args, "dask")


def role_mpi4py(args: argparse.Namespace) -> list[dict]:
    from mpi4py.futures import MPIPoolExecutor

    rows = []
    with MPIPoolExecutor() as ex:
        for chunked in (False, True):
            def run_map(d: float, n: int, chunked: bool = chunked) -> None:
                size = chunk_of(n, args) if chunked else 1
                assert len(list(ex.map(nap, [d] * n, chunksize=size))) == n

            def cost(d: float) -> float:
                return statistics.mean(ex.map(cost_of, [d] * args.workers))

            label = "mpi4py.futures chunksize=n/4W" if chunked else "mpi4py.futures"
            rows += sweep(run_map, cost, args, label)
    return rows


def role_pool(args: argparse.Namespace) -> list[dict]:
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(args.workers) as ex:
        def run_map(d: float, n: int) -> None:
            assert len(list(ex.map(nap, [d] * n, chunksize=chunk_of(n, args)))) == n

        def cost(d: float) -> float:
            return statistics.mean(ex.map(cost_of, [d] * args.workers))

        return sweep(run_map, cost, args, "ProcessPoolExecutor chunksize=n/4W")


ROLES = {"hpcsched": role_hpcsched, "dask": role_dask, "mpi4py.futures": role_mpi4py,
         "pool": role_pool}


def command(system: str, args: argparse.Namespace) -> list[str]:
    opts = [HERE, "--role", system, "--durations", args.durations, "--budget",
            str(args.budget), "--max-tasks", str(args.max_tasks), "--workers",
            str(args.workers)]
    if system == "mpi4py.futures":
        return ["mpiexec", "-n", str(args.workers + 1), sys.executable, "-m",
                "mpi4py.futures", *opts]
    return [sys.executable, *opts]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    p.add_argument("--durations", default="1e-5,1e-4,1e-3,1e-2,1e-1,1",
                   help="task durations in seconds, comma-separated")
    p.add_argument("--budget", type=float, default=10.0,
                   help="ideal seconds of each map (sets the number of calls)")
    p.add_argument("--max-tasks", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    if args.role:
        rows = ROLES[args.role](args)
        print("RESULT " + json.dumps({"rows": rows}), flush=True)
        return

    import _launch

    _launch.compile_package()
    rows: list[dict] = []
    for system in args.systems.split(","):
        if system not in ROLES:
            p.error(f"unknown system {system!r}: choose among {', '.join(SYSTEMS)}")
        print(f"... {system}", file=sys.stderr, flush=True)
        results, _, _, _ = _launch.launch(command(system, args), 3600)
        rows += results[0]["rows"]
    out = {"command": " ".join(["python", "benchmarks/bench_efficiency.py", *sys.argv[1:]]),
           "time": time.strftime("%Y-%m-%d %H:%M"), "workers": args.workers, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    systems = list(dict.fromkeys(r["system"] for r in rows))
    durations = list(dict.fromkeys(r["duration"] for r in rows))
    print("| task duration | " + " | ".join(systems) + " |")
    print("|---" * (len(systems) + 1) + "|")
    for d in durations:
        eff = {r["system"]: r["efficiency"] for r in rows if r["duration"] == d}
        print(f"| {d:g} s | " + " | ".join(f"{eff.get(s, float('nan')):.3f}" for s in systems)
              + " |")


if __name__ == "__main__":
    main()
