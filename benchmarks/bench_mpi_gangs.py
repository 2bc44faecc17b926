"""Gang formation: no-op tasks holding ``--ranks`` worker ranks each, per second.

    mpiexec -n 9 python -m hpcsched --nthreads 1 benchmarks/bench_mpi_gangs.py \\
        [--gangs 200] [--ranks 2]

Each gang task makes its communicator (``get_task_comm()``: ``Create_group`` over its
members), and returns; the figure is gangs completed per second from the first submit
to the last result (after a warm-up gang, so the ranks' imports are not counted).
"""

from __future__ import annotations

import argparse
import json
import time

import hpcsched
from hpcsched import Client


def noop(i):
    return hpcsched.get_task_comm().Get_size()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gangs", type=int, default=200)
    p.add_argument("--ranks", type=int, default=2)
    ns = p.parse_args()
    with Client() as client:
        client.submit(noop, -1, ranks=ns.ranks).result(timeout=60)  # warm-up
        t0 = time.perf_counter()
        sizes = client.gather(client.map(noop, range(ns.gangs), ranks=ns.ranks), timeout=600)
        took = time.perf_counter() - t0
        assert sizes == [ns.ranks] * ns.gangs
        workers = len(client.scheduler_info()["workers"])
        print("BENCH " + json.dumps({"gangs": ns.gangs, "ranks": ns.ranks, "workers": workers,
                                     "seconds": round(took, 3),
                                     "gangs_per_s": round(ns.gangs / took, 1)}), flush=True)


if __name__ == "__main__":
    main()
