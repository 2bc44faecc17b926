"""A bulk map's Python bytecodes in the client and scheduler process, by file, for several
checkouts.

Usage::

    python benchmarks/bench_local_bytecodes.py --checkout /tmp/base --checkout . --sweep 20000
    python benchmarks/bench_local_bytecodes.py --checkout /tmp/base --checkout . --workload map:2000
    python benchmarks/bench_local_bytecodes.py --checkout /tmp/base --checkout . \
        --workload tree:2048 --by-function --top 40

Where callgrind's count of a workload (``bench_local_instructions.py``) moves by a few per
cent between runs of one checkout (the batching of messages follows the timing), this
says in which of the package's files the Python code of the workload grew: each checkout
(its root on ``PYTHONPATH``) runs, in a process of its own, a ``LocalCluster`` of 2 worker
processes of 1 thread with the client in it, a warm-up, then a map of ``--sweep`` no-ops
with ``pure=False`` (a bulk map), and counts each bytecode its threads execute during that
map (or, with ``--workload``, bench_local_instructions.py's ``map:N``, N tasks with a key
each, or ``tree:N``, a binary tree of N leaves as one graph; ``sys.settrace`` with
``f_trace_opcodes``, see
https://docs.python.org/3/library/sys.html#sys.settrace; the workers run untraced).
Code in C (msgspec, pickle, the collector) is not counted: that is callgrind's part.
"""

# ruff: noqa: I001 - _checkout is imported first, before anything that imports hpcsched
from __future__ import annotations

import _checkout  # noqa: F401  (first: the hpcsched measured is this checkout's)

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
from typing import Any


def one(n: int, what: str = "sweep", by_function: bool = False) -> dict[str, int]:
    """``--one``: the bytecodes of a bulk map of ``n`` elements (``what``: or a map of
    ``n`` tasks, a tree of ``n`` leaves) in this process, by file (or by function)."""
    import bench_local
    from hpcsched import Client, LocalCluster

    counts: collections.Counter = collections.Counter()
    on = False

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            counts[f"{code.co_filename}:{code.co_qualname}" if by_function
                   else code.co_filename] += 1
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        if not on:
            return None
        frame.f_trace_opcodes = True
        return local

    threading.settrace(calls)  # the scheduler's and the connections' threads start below
    sys.settrace(calls)
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        dsk, root = bench_local.tree_graph(64, "warm-")
        assert client.get(dsk, root) == 64 * 63 // 2
        assert client.gather(client.map(bench_local.noop, range(64)))[-1] == 63
        on = True
        if what == "map":
            keys = [f"noop-{i}" for i in range(n)]
            assert client.gather(client.map(bench_local.noop, range(n), key=keys))[-1] == n - 1
        elif what == "tree":
            dsk, root = bench_local.tree_graph(n, "t-")
            assert client.get(dsk, root) == n * (n - 1) // 2
        else:
            assert client.gather(client.map(bench_local.noop, range(n), pure=False))[-1] == n - 1
        on = False
    sys.settrace(None)
    threading.settrace(None)  # type: ignore[arg-type]
    root_dir = os.environ["PYTHONPATH"]
    return {f.replace(root_dir + os.sep, ""): v for f, v in counts.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkout", action="append", required=True,
                   help="a checkout's root (repeat; the first is the base)")
    p.add_argument("--sweep", type=int, default=20000, help="elements of the bulk map")
    p.add_argument("--workload", help="map:N or tree:N instead of the sweep")
    p.add_argument("--top", type=int, default=12, help="files shown, by largest change")
    p.add_argument("--by-function", action="store_true",
                   help="count by function (file:qualified name) rather than by file")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--what", default="sweep", help=argparse.SUPPRESS)
    args = p.parse_args()
    what, n = "sweep", args.sweep
    if args.workload:
        what, _, count = args.workload.partition(":")
        if what not in ("map", "tree") or not count.isdigit() or int(count) < 1:
            p.error(f"--workload must be map:N or tree:N, not {args.workload!r}")
        n = int(count)
    if args.one is not None:
        checkout = os.path.abspath(args.checkout[0])
        sys.path[:0] = [os.path.join(checkout, "benchmarks"), checkout]
        os.environ["PYTHONPATH"] = checkout
        print(json.dumps(one(args.one, args.what, args.by_function)))
        return
    if what == "sweep" and n < 64:
        p.error(f"--sweep must be at least 64 (a bulk map), not {args.sweep}")
    runs = {}
    for c in map(os.path.abspath, args.checkout):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one",
                               str(n), "--what", what, "--checkout", c,
                               *(["--by-function"] if args.by_function else [])],
                              env=dict(os.environ, PYTHONPATH=c), cwd=c, capture_output=True,
                              text=True, timeout=args.timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{what} at {c} failed:\n{done.stderr[-3000:]}")
        runs[c] = collections.Counter(json.loads(done.stdout.splitlines()[-1]))
    first = runs[next(iter(runs))]
    print("total: " + ", ".join(
        f"{c} {sum(r.values()):,} ({100 * (sum(r.values()) / sum(first.values()) - 1):+.1f}%)"
        for c, r in runs.items()))
    files = set().union(*runs.values())
    for f in sorted(files, key=lambda f: -max(abs(r[f] - first[f]) for r in runs.values()))[
            :args.top]:
        print(f"{f}: " + ", ".join(f"{r[f]:,}" for r in runs.values()))


if __name__ == "__main__":
    main()
