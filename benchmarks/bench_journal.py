"""What the scheduler's journal costs: bench_local's map and tree, with and without a journal,
in one run.

    python benchmarks/bench_journal.py [--tasks 10000] [--leaves 8192] [--rounds 3] [--fsync]

Each round starts a LocalCluster (2 worker processes x 1 thread, no dashboard) without a
journal, measures the map and the tree once, closes it, then does the same with
``scheduler_journal`` set (alternating, so that the machine's drift hits both alike).
Prints the best of the rounds for each, the cost in per cent, and the journal's size.
First, the journal alone: what recording one tree's ``update-graph`` (the tasks' specs as
a client sends them) and writing it costs the scheduler's loop, per task -- the figure
that stays when the machine is too busy for the end-to-end ratio to mean much.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_local import run  # noqa: E402


def measure(args: argparse.Namespace, journal: str | None) -> dict:
    from hpcsched import Client, LocalCluster
    from hpcsched.core import config

    with config.set({"scheduler.extensions": [], "scheduler.journal-fsync": args.fsync}), \
            LocalCluster(n_workers=2, threads_per_worker=1, scheduler_journal=journal) as cluster, \
            Client(cluster) as client:
        out = run(client, args.tasks, args.leaves, 1)
        if journal is not None:
            out["journal_bytes"] = os.path.getsize(journal)
    return out


def journal_alone(leaves: int, repeat: int = 5) -> float:
    """Seconds per task to record and write a tree of ``leaves`` leaves (best of ``repeat``)."""
    from operator import add

    from hpcsched.core.protocol import messages as pr
    from hpcsched.core.protocol.serialize import dumps_function, dumps_object
    from hpcsched.core.scheduler.journal import Journal

    fblob = dumps_function(add)
    tasks = {("add", i): {"run_spec": (fblob, dumps_object((("leaf", i), ("leaf", i + 1))),
                                       True), "deps": [("leaf", i), ("leaf", i + 1)]}
             for i in range(2 * leaves - 1)}
    wire = {**pr.encode(pr.UpdateGraph("c", tasks, [("add", 0)]))}
    best = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeat):
            j = Journal(os.path.join(tmp, f"j{r}"))
            record = pr.UpdateGraph("c", tasks, [("add", 0)])
            t0 = time.perf_counter()
            j.append("c", record, wire)
            j.sync()
            best = min(best, time.perf_counter() - t0)
            j.close()
    return best / len(tasks)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--leaves", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fsync", action="store_true", help="scheduler.journal-fsync")
    args = p.parse_args()
    per_task = journal_alone(args.leaves)
    print(f"journal alone: {per_task * 1e6:.2f} us per task of a {2 * args.leaves - 1}-task "
          "update-graph", flush=True)
    best: dict[str, dict[str, float]] = {"off": {}, "on": {}}
    size = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in ("off", "on"):
                journal = os.path.join(tmp, f"journal-{r}") if mode == "on" else None
                t0 = time.perf_counter()
                out = measure(args, journal)
                size = max(size, int(out.pop("journal_bytes", 0)))
                for k, v in out.items():
                    best[mode][k] = max(best[mode].get(k, 0.0), v)
                print(f"round {r} {mode}: " + ", ".join(f"{k} {v:.0f}" for k, v in out.items())
                      + f" ({time.perf_counter() - t0:.1f}s)", flush=True)
    print(f"{'':32}{'no journal':>12}{'journal':>12}{'cost':>8}")
    for k, label in (("map_tasks_per_s", f"map {args.tasks} no-ops (tasks/s)"),
                     ("tree_tasks_per_s", f"tree {args.leaves} leaves (tasks/s)")):
        off, on = best["off"][k], best["on"][k]
        print(f"{label:32}{off:12.0f}{on:12.0f}{100 * (1 - on / off):7.1f}%")
    print(f"(best of {args.rounds} rounds; fsync {'on' if args.fsync else 'off'}; "
          f"largest journal {size / 2**20:.1f} MiB; {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
