# ruff: noqa: I001 - _checkout is imported first, before anything that imports hpcsched
"""Many workers for a long time: does the scheduler's memory or cost per task drift?

    python benchmarks/bench_soak.py [--workers 1000] [--hosts 4] [--seconds 600]
                                    [--tasks 10000] [--pairs 2000] [--leaves 2048]
                                    [--systems hpcsched,dask] [--json out.json]

The set-up of ``bench_swarm.py`` (one scheduler process started from the command line
with a scheduler file, N one-thread workers over TCP from ``--hosts`` processes, a client
in this process), kept running for ``--seconds`` per system while the client works in
rounds, as a long job does: a ``client.map`` of ``--tasks`` no-op tasks, a pairwise
reduction of ``--pairs`` futures with ``submit(add, a, b)``, and a tree of ``--leaves``
leaves as one graph, every result gathered and dropped. After each round the scheduler
process's resident memory, CPU and open file descriptors are read, and the worker
processes' memory (summed) and descriptors (the most of any).

Reported per system: the rounds run, the scheduler's RSS after the first round and at
the end, its growth per hour fitted over the rounds after the first (least squares), the
scheduler's CPU per task and the tasks per second in the first and the last quarter of
the rounds. A scheduler that keeps something per task or per round shows a slope; one
whose cost grows with its history shows a later quarter slower than the first.

Workers sharing a process share its file descriptors: each keeps up to
``worker.peer-connections`` (256) comms to the peers it fetched from, and as many may
come in from its peers, so a long run of 1,000 workers on 4 processes outgrows 20,000
descriptors per process after a few minutes. Give it more ``--hosts``, a higher ``ulimit
-n``, or fewer peer connections (``HPCSCHED_WORKER__PEER_CONNECTIONS``) where the run is
to last.

Every process a measurement starts is ended by it. Needs ``pip install
'dask[distributed]'`` for the dask rows.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import signal
import sys
import time

from bench_local import noop, tree_graph
from bench_swarm import swarm, tree_of_futures


def one_round(client, args, tag: str) -> int:
    """One round of the long job's work; the number of tasks it ran."""
    futs = client.map(noop, range(args.tasks), pure=False)
    assert client.gather(futs)[-1] == args.tasks - 1
    del futs
    tasks = args.tasks + tree_of_futures(client, args.pairs)
    dsk, root = tree_graph(args.leaves, tag)
    assert client.get(dsk, root) == args.leaves * (args.leaves - 1) // 2
    return tasks + len(dsk)


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``ts`` (seconds), per hour."""
    n = len(ts)
    if n < 2:
        return 0.0
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return 0.0
    return 3600 * sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var


def measure(system: str, args) -> dict:
    rounds: list[dict] = []
    import psutil

    with swarm(system, args.workers, args.hosts) as (client, sp, _, _):
        hosts = [c for c in psutil.Process().children() if c.pid != sp.pid]
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds or len(rounds) < 2:
            cpu0 = sp.cpu_times()
            t0 = time.perf_counter()
            tasks = one_round(client, args, f"soak-{system}-{len(rounds)}-")
            t1 = time.perf_counter()
            cpu1 = sp.cpu_times()
            rounds.append({
                "t": round(t1 - start, 2), "tasks": tasks,
                "tasks_per_s": round(tasks / (t1 - t0)),
                "cpu_per_task_us": round(1e6 * ((cpu1.user + cpu1.system)
                                                - (cpu0.user + cpu0.system)) / tasks, 1),
                "rss_mib": round(sp.memory_info().rss / 2**20, 1),
                "fds": sp.num_fds(),
                "hosts_rss_mib": round(sum(h.memory_info().rss for h in hosts) / 2**20, 1),
                "hosts_fds_max": max(h.num_fds() for h in hosts)})
            print(f"{system}: round {len(rounds)} {rounds[-1]}", file=sys.stderr, flush=True)
    return summary(system, args.workers, rounds)


def summary(system: str, n: int, rounds: list[dict]) -> dict:
    later = rounds[1:]
    q = max(1, len(rounds) // 4)

    def mean(key: str, part: list[dict]) -> float:
        return round(sum(r[key] for r in part) / len(part), 1)

    return {
        "system": system, "workers": n, "rounds": len(rounds),
        "seconds": rounds[-1]["t"], "tasks": sum(r["tasks"] for r in rounds),
        "rss_first_mib": rounds[0]["rss_mib"], "rss_last_mib": rounds[-1]["rss_mib"],
        "fds_last": rounds[-1]["fds"], "hosts_rss_last_mib": rounds[-1]["hosts_rss_mib"],
        "hosts_fds_max": max(r["hosts_fds_max"] for r in rounds),
        "rss_mib_per_hour": round(slope_per_hour([r["t"] for r in later],
                                                 [r["rss_mib"] for r in later]), 1),
        "cpu_us_first_q": mean("cpu_per_task_us", rounds[:q]),
        "cpu_us_last_q": mean("cpu_per_task_us", rounds[-q:]),
        "tasks_per_s_first_q": mean("tasks_per_s", rounds[:q]),
        "tasks_per_s_last_q": mean("tasks_per_s", rounds[-q:]),
        "rounds_detail": rounds,
    }


COLUMNS = ["workers", "system", "rounds", "seconds", "tasks", "rss_first_mib", "rss_last_mib",
           "rss_mib_per_hour", "fds_last", "hosts_rss_last_mib", "hosts_fds_max", "cpu_us_first_q", "cpu_us_last_q", "tasks_per_s_first_q",
           "tasks_per_s_last_q"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--hosts", type=int, default=4, help="worker processes the workers share")
    p.add_argument("--seconds", type=float, default=600.0, help="how long each system runs")
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--pairs", type=int, default=2_000)
    p.add_argument("--leaves", type=int, default=2048)
    p.add_argument("--systems", default="hpcsched,dask")
    p.add_argument("--json", help="also write the rows (with every round) to this file")
    args = p.parse_args()
    # a SIGTERM (timeout(1), a batch system's limit) ends the measurement's processes too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rows = []
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for system in args.systems.split(","):
        try:
            row = measure(system, args)
        except Exception as e:  # one failing measurement must not hide the others
            row = {"system": system, "workers": args.workers,
                   "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        print("| " + " | ".join(str(row.get(c, row.get("error", ""))) for c in COLUMNS)
              + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
