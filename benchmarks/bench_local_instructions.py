"""bench_local.py's workloads counted in instructions, for several checkouts in one run.

Usage::

    python benchmarks/bench_local_instructions.py --checkout /tmp/base --checkout . \\
        --workloads map:2000,tree:1024,sweep:20000

Where the wall clock of a loaded machine cannot resolve a few per cent, instructions can.
For each checkout (its root on ``PYTHONPATH``, its package byte-compiled first) and each
workload, one process runs under valgrind's callgrind: it starts a ``LocalCluster`` of 2
worker processes of 1 thread (as bench_local.py does) with the client in it, runs a small
warm-up (a tree of 64 leaves, a map of 64 tasks), then the workload: ``map:N`` (N no-op
tasks with a key each, gathered), ``tree:N`` (a binary tree of N leaves, one graph) or
``sweep:N`` (a map of N no-ops with ``pure=False``: a bulk map above the threshold).
Callgrind counts that process, the scheduler's thread and the client's together (the
workers run natively); the same run without a workload (``none``) is subtracted, so each
figure is the workload's own instructions in the scheduler and the client.

``--history``: each checkout twice, without and with a task history
(``scheduler.history``, a file of its own per process; no journal, so no spool): what
writing the history costs, in per cent of the same checkout's run without it.
"""

# ruff: noqa: I001 - _checkout is imported first, before anything that imports hpcsched
from __future__ import annotations

import _checkout  # noqa: F401  (first: the hpcsched measured is this checkout's)

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

def one(what: str, n: int) -> None:
    """``--one``: a single run in this process (the measured one)."""
    import bench_local
    import hpcsched
    from hpcsched import Client, LocalCluster

    assert os.path.dirname(os.path.dirname(hpcsched.__file__)) == os.environ["PYTHONPATH"]

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        dsk, root = bench_local.tree_graph(64, "warm-")
        assert client.get(dsk, root) == 64 * 63 // 2
        keys = [f"w-{i}" for i in range(64)]
        assert client.gather(client.map(bench_local.noop, range(64), key=keys))[-1] == 63
        t0 = time.perf_counter()
        if what == "map":
            futures = client.map(bench_local.noop, range(n), key=[f"noop-{i}" for i in range(n)])
            assert client.gather(futures)[-1] == n - 1
        elif what == "tree":
            dsk, root = bench_local.tree_graph(n, "t-")
            assert client.get(dsk, root) == n * (n - 1) // 2
        elif what == "sweep":
            assert client.gather(client.map(bench_local.noop, range(n), pure=False))[-1] == n - 1
        print(f"{what} {n}: {time.perf_counter() - t0:.2f}s", flush=True)


def counted(checkout: str, what: str, n: int, timeout: float,
            history: bool | None = None) -> int:
    """Instructions of one run of ``what`` with ``checkout``'s benchmark and package
    (``history``: with a task history in a file of its own, or without; None: as the
    environment says)."""
    env = dict(os.environ, PYTHONPATH=checkout)
    with tempfile.TemporaryDirectory() as tmp:
        if history is not None:
            env.pop("HPCSCHED_SCHEDULER__HISTORY", None)
        if history:
            env["HPCSCHED_SCHEDULER__HISTORY"] = os.path.join(tmp, "history.sqlite")
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                               sys.executable, os.path.abspath(__file__), "--one", what, str(n),
                               "--checkout", checkout], env=env, cwd=checkout,
                              capture_output=True, text=True, timeout=timeout)
    found = re.findall(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{what} {n} at {checkout} failed:\n{done.stderr[-3000:]}")
    return int(found[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkout", action="append", required=True,
                   help="a checkout's root (repeat; the first is the base)")
    p.add_argument("--workloads", default="map:2000,tree:1024,sweep:20000")
    p.add_argument("--timeout", type=float, default=2400)
    p.add_argument("--history", action="store_true",
                   help="each checkout without and with a task history (scheduler.history)")
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        # the checkout measured, not this file's (which _checkout put first), here and in
        # the workers this process starts
        checkout = os.path.abspath(args.checkout[0])
        sys.path[:0] = [os.path.join(checkout, "benchmarks"), checkout]
        os.environ["PYTHONPATH"] = checkout
        one(args.one[0], int(args.one[1]))
        return
    if shutil.which("valgrind") is None:
        p.error("valgrind is not on the PATH")
    try:
        work = [(w.split(":")[0], int(w.split(":")[1])) for w in args.workloads.split(",")]
    except (IndexError, ValueError):
        p.error(f"--workloads must be what:N,... (map, tree, sweep), not {args.workloads!r}")
    if any(w not in ("map", "tree", "sweep") for w, _ in work):
        p.error(f"--workloads: map, tree or sweep, not {args.workloads!r}")
    checkouts = [os.path.abspath(c) for c in args.checkout]
    for c in checkouts:
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(c, "hpcsched")],
                       check=True, stdout=subprocess.DEVNULL)
    # (checkout, with a history): the base first; with --history each checkout's own
    # run without one is its base
    runs: list[tuple[str, bool | None]] = [
        (c, h) for c in checkouts for h in ((False, True) if args.history else (None,))]

    def name(run: tuple[str, bool | None]) -> str:
        return run[0] + (" +history" if run[1] else "")

    base = {r: counted(r[0], "none", 0, args.timeout, r[1]) for r in runs}
    print("start-up and warm-up: " + ", ".join(f"{name(r)} {v:,}" for r, v in base.items()))
    for what, n in work:
        own = {r: counted(r[0], what, n, args.timeout, r[1]) - base[r] for r in runs}
        against = {r: own[(r[0], False)] if args.history else own[runs[0]] for r in runs}
        print(f"{what} {n}: " + ", ".join(
            f"{name(r)} {v:,} ({100 * (v / against[r] - 1):+.1f}%)" for r, v in own.items()),
            flush=True)


if __name__ == "__main__":
    main()
