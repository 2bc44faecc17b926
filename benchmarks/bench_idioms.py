"""The idioms of getting results back, hpcsched vs dask.distributed, in one run.

    python benchmarks/bench_idioms.py [--calls 3000] [--repeat 3] [--json FILE]

Both on a local cluster of 2 worker processes x 1 thread; ``inc`` called ``--calls``
times (``pure=False``: new tasks each run), timed from the first submission to the last
result in hand, best of ``--repeat`` rounds in which the idioms take turns. One row per idiom, each written as dask's
documentation writes it (https://distributed.dask.org/en/stable/client.html,
https://distributed.dask.org/en/stable/api.html#distributed.as_completed):

* ``map`` rows start from ``client.map(inc, range(n))`` and are compared with
  ``client.gather(client.map(...))``;
* ``submit`` rows start from ``[client.submit(inc, i) for i in range(n)]`` and are
  compared with ``client.gather([...])``.

Columns: calls/s of hpcsched, that over its row's reference (``gather``), calls/s of
dask.distributed, hpcsched over dask. Needs ``pip install 'dask[distributed]'``.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Callable

from _launch import timed  # benchmarks/ is on the path: the scripts run from it

WAIT = 300.0  # seconds any one run may take


def inc(x: int) -> int:
    return x + 1


def idioms(mod) -> dict[str, tuple[str, Callable]]:
    """name -> (kind, run(client, n) -> results), with ``mod`` hpcsched or distributed."""

    def gather_map(c, n):
        return c.gather(c.map(inc, range(n), pure=False))

    def as_completed_map(c, n):
        return [f.result() for f in mod.as_completed(c.map(inc, range(n), pure=False))]

    def with_results_map(c, n):
        return [r for _, r in mod.as_completed(c.map(inc, range(n), pure=False),
                                               with_results=True)]

    def batches_map(c, n):
        ac = mod.as_completed(c.map(inc, range(n), pure=False))
        return [f.result() for batch in ac.batches() for f in batch]

    def result_loop_map(c, n):
        return [f.result() for f in c.map(inc, range(n), pure=False)]

    def wait_map(c, n):
        fs = c.map(inc, range(n), pure=False)
        mod.wait(fs, timeout=WAIT)
        return [f.result() for f in fs]

    def executor_map(c, n):
        return list(c.get_executor(pure=False).map(inc, range(n)))

    def callbacks(fs, n):
        out: list = []
        lock = threading.Lock()
        done = threading.Event()

        def cb(f):
            v = f.result()
            with lock:
                out.append(v)
                if len(out) == n:
                    done.set()

        for f in fs:
            f.add_done_callback(cb)
        if not done.wait(WAIT):
            raise TimeoutError(f"{len(out)} of {n} callbacks ran")
        return out

    def callback_map(c, n):
        return callbacks(c.map(inc, range(n), pure=False), n)

    def submits(c, n):
        return [c.submit(inc, i, pure=False) for i in range(n)]

    def gather_submit(c, n):
        return c.gather(submits(c, n))

    def as_completed_submit(c, n):
        return [f.result() for f in mod.as_completed(submits(c, n))]

    def with_results_submit(c, n):
        return [r for _, r in mod.as_completed(submits(c, n), with_results=True)]

    def callback_submit(c, n):
        return callbacks(submits(c, n), n)

    return {
        "gather(map(...))": ("map", gather_map),
        "for f in as_completed(map(...)): f.result()": ("map", as_completed_map),
        "as_completed(map(...), with_results=True)": ("map", with_results_map),
        "as_completed(map(...)).batches()": ("map", batches_map),
        "for f in map(...): f.result()": ("map", result_loop_map),
        "wait(map(...)), then f.result() each": ("map", wait_map),
        "get_executor().map(...)": ("map", executor_map),
        "map(...), add_done_callback(f.result())": ("map", callback_map),
        "gather([submit(...) ...])": ("submit", gather_submit),
        "for f in as_completed([submit ...]): f.result()": ("submit", as_completed_submit),
        "as_completed([submit ...], with_results=True)": ("submit", with_results_submit),
        "[submit ...], add_done_callback(f.result())": ("submit", callback_submit),
    }


def measure(client, mod, n: int, repeat: int, only: list[str]) -> dict[str, float]:
    """calls/s of each idiom on ``client``: the idioms take turns, ``repeat`` rounds, so
    that a load that comes and goes on the machine falls on every row alike."""
    expected = list(range(1, n + 1))
    client.gather(client.map(inc, range(200), pure=False))  # warm: functions, connections
    rows = {name: fn for name, (kind, fn) in idioms(mod).items() if not only or kind in only}
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(repeat):
        for name, fn in rows.items():
            def once(fn=fn, name=name):
                got = fn(client, n)
                assert sorted(got) == expected, f"{name}: wrong results"

            best[name] = min(best[name], timed(1, once)[0])
    out = {name: n / t for name, t in best.items()}
    for name, rate in out.items():
        print(f"{mod.__name__}: {name}: {rate:.0f}/s", file=sys.stderr, flush=True)
    return out


def bench_hpcsched(args) -> dict[str, float]:
    import hpcsched
    from hpcsched import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        return measure(client, hpcsched, args.calls, args.repeat, args.only)


def bench_dask(args) -> dict[str, float]:
    import dask
    import distributed
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with dask.config.set({"distributed.worker.daemon": False}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster, Client(cluster) as client:
        return measure(client, distributed, args.calls, args.repeat, args.only)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-dask", action="store_true", help="hpcsched alone")
    p.add_argument("--only", action="append", choices=("map", "submit"),
                   help="only the rows of this kind (repeatable)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    h = bench_hpcsched(args)
    d = {} if args.no_dask else bench_dask(args)
    kinds = {name: kind for name, (kind, _) in idioms(None).items()}
    ref = {"map": h.get("gather(map(...))"), "submit": h.get("gather([submit(...) ...])")}
    print(f"{args.calls} calls of inc; LocalCluster of 2 workers x 1 thread; calls/s, best "
          f"of {args.repeat}; 'of gather': hpcsched over its row's gather "
          f"({os.cpu_count()} cores)")
    print(f"{'idiom':50}{'hpcsched':>10}{'of gather':>11}{'dask':>9}{'ratio':>8}")
    for name, rate in h.items():
        dask_rate = d.get(name)
        tail = f"{dask_rate:9.0f}{rate / dask_rate:7.1f}x" if dask_rate else ""
        print(f"{name:50}{rate:10.0f}{rate / ref[kinds[name]]:10.2f}x{tail}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calls": args.calls, "hpcsched": h, "dask": d}, f, indent=1)


if __name__ == "__main__":
    main()
