"""What the scheduler's journal costs: bench_local's map and tree, with and without a journal,
in one run.

    python benchmarks/bench_journal.py [--tasks 10000] [--leaves 8192] [--rounds 5] [--fsync]
                                       [--control] [--instructions] [--history]

Each measurement is a process of its own: a LocalCluster (2 worker processes x 1 thread, no
dashboard), with ``scheduler_journal`` set or not, a small map and tree to warm it up, then
bench_local's map and tree once, timed. A process per measurement, so that what one cluster
leaves in a process (its garbage, a grown heap) weighs on neither mode more than on the
other; and the rounds alternate which mode goes first (without, with; then with, without;
...), so that neither is always the one measured right after the other.

Printed: each measurement; then, per mode, the best and the median of the rounds and the
cost in per cent from each; and the CPU time per task of the measuring process over the
timed part (client and scheduler: where the journal's work is done; the workers do the same
either way). On a shared machine the throughputs of one mode spread by more than the cost
to be measured, and the CPU figure is the one that holds. ``--control``: the "journal"
column runs without one too -- what the benchmark shows when there is nothing to measure.
``--instructions``: each measuring process runs under valgrind's callgrind, which counts the
instructions it executes (the workers run as they are): the journal's cost as the difference
of the counts, per task and in per cent of the whole process's (its start included), a
figure other processes on the machine do not move (the runs take some fifty times longer;
their throughputs mean nothing).

``--history``: the same for the task history (hpcsched/diagnostics/history.py): both modes
keep a journal and run the diagnostics extension without a dashboard server; "on" writes
the history (its SQLite thread, and each loop turn's rows spooled before the journal).

First, the journal alone: what recording one tree's ``update-graph`` (the tasks' specs as a
client sends them) and writing it costs the scheduler's loop, per task.
"""

from __future__ import annotations  # noqa: I001 - _checkout first: it sets the path

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _launch import compile_package, launch  # noqa: E402
from bench_local import run  # noqa: E402


def warm_up(args: argparse.Namespace) -> tuple[int, int]:
    """The map's tasks and the tree's leaves of the (untimed) warm-up."""
    return max(args.tasks // 10, 1), max(args.leaves // 8, 2)


def measure(args: argparse.Namespace, journal: str | None, history: str | None = None) -> dict:
    """One measurement, in this process: tasks/s of the map and the tree, CPU per task.

    ``history``: the task history's file ("": none), with the diagnostics extension (its
    owner; no dashboard server) in both modes; None: no extension at all."""
    from hpcsched import Client, LocalCluster
    from hpcsched.core import config

    settings = {"scheduler.journal-fsync": args.fsync}
    if history is None:
        settings["scheduler.extensions"] = []
    else:
        settings["scheduler.history"] = history
    with config.set(settings), \
            LocalCluster(n_workers=2, threads_per_worker=1, scheduler_journal=journal,
                         dashboard_address=None) as cluster, \
            Client(cluster) as client:
        run(client, *warm_up(args), 1)
        c0 = time.process_time()
        out = run(client, args.tasks, args.leaves, 1)
        out["cpu_us_per_task"] = (time.process_time() - c0) / (args.tasks + 2 * args.leaves - 1) * 1e6
        if journal is not None:
            out["journal_bytes"] = os.path.getsize(journal)
    return out


def journal_alone(leaves: int, repeat: int = 5) -> float:
    """Seconds per task to record and write a tree of ``leaves`` leaves (best of ``repeat``)."""
    from operator import add

    from hpcsched.core.protocol import messages as pr
    from hpcsched.core.protocol.run_spec import RunSpec
    from hpcsched.core.protocol.serialize import dumps_function, dumps_object
    from hpcsched.core.scheduler.journal import Journal

    fblob = dumps_function(add)
    tasks = {("add", i): {"run_spec": RunSpec(fblob, dumps_object((("leaf", i), ("leaf", i + 1))),
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


def one(args: argparse.Namespace) -> None:
    """``--one MODE``: a single measurement, printed as a RESULT line."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.history:  # journaled both ways: the history's rows are spooled too
            history = os.path.join(tmp, "history.sqlite") if args.one == "on" else ""
            print("RESULT " + json.dumps(measure(args, os.path.join(tmp, "journal"), history)),
                  flush=True)
            return
        journal = os.path.join(tmp, "journal") if args.one == "on" else None
        print("RESULT " + json.dumps(measure(args, journal)), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--leaves", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--fsync", action="store_true", help="scheduler.journal-fsync")
    p.add_argument("--control", action="store_true",
                   help="the journal column without a journal (the benchmark's own spread)")
    p.add_argument("--instructions", action="store_true",
                   help="count the measuring process's instructions under valgrind")
    p.add_argument("--history", action="store_true",
                   help="measure the task history instead: journaled both ways, with and "
                        "without scheduler.history")
    p.add_argument("--one", choices=("off", "on"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        one(args)
        return
    valgrind = []
    if args.instructions:
        if shutil.which("valgrind") is None:
            p.error("--instructions needs valgrind on the PATH")
        valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    compile_package()
    if not args.history:
        per_task = journal_alone(args.leaves)
        print(f"journal alone: {per_task * 1e6:.2f} us per task of a {2 * args.leaves - 1}-task "
              "update-graph", flush=True)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    size = 0
    for r in range(args.rounds):
        for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
            cmd = valgrind + [sys.executable, os.path.abspath(__file__), "--one",
                   "off" if args.control else mode, "--tasks", str(args.tasks),
                   "--leaves", str(args.leaves)] + (["--fsync"] if args.fsync else []) \
                + (["--history"] if args.history else [])
            t0 = time.perf_counter()
            results, err, _, _ = launch(cmd, timeout=3600 if valgrind else 600)
            out = results[0]
            if valgrind:
                counted = re.findall(r"Collected : (\d+)", err)
                if not counted:
                    raise RuntimeError(f"no instruction count from valgrind:\n{err}")
                out["instructions"] = float(counted[-1])
            size = max(size, int(out.pop("journal_bytes", 0)))
            runs[mode].append(out)
            print(f"round {r} {mode}: " + ", ".join(f"{k} {v:.1f}" for k, v in out.items())
                  + f" ({time.perf_counter() - t0:.1f}s)", flush=True)
    what = "history" if args.history else "journal"
    print(f"{'':40}{'no ' + what:>12}{what:>12}{'cost':>8}")
    for k, label in (("map_tasks_per_s", f"map {args.tasks} no-ops (tasks/s)"),
                     ("tree_tasks_per_s", f"tree {args.leaves} leaves (tasks/s)")):
        for how, pick in (("best", max), ("median", statistics.median)):
            off = pick([o[k] for o in runs["off"]])
            on = pick([o[k] for o in runs["on"]])
            print(f"{label + ', ' + how:40}{off:12.0f}{on:12.0f}{100 * (1 - on / off):7.1f}%")
    off = statistics.median(o["cpu_us_per_task"] for o in runs["off"])
    on = statistics.median(o["cpu_us_per_task"] for o in runs["on"])
    print(f"{'CPU us per task, median':40}{off:12.1f}{on:12.1f}{100 * (on / off - 1):7.1f}%")
    if valgrind:  # the counts cover the warm-up too: its tasks are journaled as well
        warm_tasks, warm_leaves = warm_up(args)
        tasks = args.tasks + 2 * args.leaves - 1 + warm_tasks + 2 * warm_leaves - 1
        off = statistics.median(o["instructions"] for o in runs["off"])
        on = statistics.median(o["instructions"] for o in runs["on"])
        print(f"{'instructions, median (millions)':40}{off / 1e6:12.0f}{on / 1e6:12.0f}"
              f"{100 * (on / off - 1):7.1f}%")
        print(f"{'the ' + what + ', instructions per task':40}{(on - off) / tasks:24.0f}")
    print(f"(best and median of {args.rounds} rounds, a process each; fsync "
          f"{'on' if args.fsync else 'off'}; largest journal {size / 2**20:.1f} MiB; "
          f"{os.cpu_count()} cores{'; control: no journal in either column' if args.control else ''})")


if __name__ == "__main__":
    main()
