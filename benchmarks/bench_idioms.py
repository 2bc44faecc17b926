"""The idioms of getting results back, hpcsched vs dask.distributed, in one run.

    python benchmarks/bench_idioms.py [--calls 3000] [--repeat 7] [--best 3]
        [--dask-repeat 3] [--dask-calls N] [--json FILE]

Both on a local cluster of 2 worker processes x 1 thread, both clusters up for the
whole run; ``inc`` called ``--calls`` times (``pure=False``: new tasks each run), timed
from the first submission to the last result in hand. One row per idiom, each written as
dask's documentation writes it (https://distributed.dask.org/en/stable/client.html,
https://distributed.dask.org/en/stable/api.html#distributed.as_completed):

* ``map`` rows start from ``client.map(inc, range(n))`` and are compared with
  ``client.gather(client.map(...))``;
* ``submit`` rows start from ``[client.submit(inc, i) for i in range(n)]`` and are
  compared with ``client.gather([...])``.

Made to hold on a loaded machine: a round runs every idiom, in an order rotated from
round to round (no idiom always follows the same one), hpcsched's rounds and dask's
alternate, and each idiom's figure is the median of its rounds with their spread. In
hpcsched's rounds an idiom runs ``--best`` times in a row and the fastest counts (a run
lasts 0.02-1 s, a burst of the machine's load as long); dask's runs last seconds, once
a round. "of gather" is the median over rounds of the idiom's rate over its road's
gather *in the same round*, so that a load that comes and goes between rounds cancels
out; its min-max is given too.

Columns: calls/s of hpcsched (median, and min-max), its rate over its road's gather
(median, and min-max), the CPU microseconds per call of its whole process tree (client,
scheduler, workers: a figure the machine's other load hardly moves) and that over its
road's gather (median), calls/s of dask.distributed (median), hpcsched over dask, dask's
CPU per call. Needs
``pip install 'dask[distributed]'``.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

# isort: split

import argparse
import contextlib
import json
import logging
import os
import statistics
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

    def batches_submit(c, n):
        ac = mod.as_completed(submits(c, n))
        return [f.result() for batch in ac.batches() for f in batch]

    def result_loop_submit(c, n):
        return [f.result() for f in submits(c, n)]

    def wait_submit(c, n):
        fs = submits(c, n)
        mod.wait(fs, timeout=WAIT)
        return [f.result() for f in fs]

    def executor_submit(c, n):
        ex = c.get_executor(pure=False)
        return [f.result() for f in [ex.submit(inc, i) for i in range(n)]]

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
        "as_completed([submit ...]).batches()": ("submit", batches_submit),
        "for f in [submit ...]: f.result()": ("submit", result_loop_submit),
        "wait([submit ...]), then f.result() each": ("submit", wait_submit),
        "[get_executor().submit ...], f.result() each": ("submit", executor_submit),
        "[submit ...], add_done_callback(f.result())": ("submit", callback_submit),
    }


def tree_cpu() -> float:
    """CPU seconds used so far by this process (client, and hpcsched's scheduler, which
    runs in it) and its live descendants (the workers, dask's scheduler and nannies): a
    figure other users of the machine hardly move, beside the wall clock they do."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for p in me.children(recursive=True):
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


class Rounds:
    """The rounds of one system on its client: each runs every idiom ``best`` times in a
    row (the fastest counts), the order rotated by one from round to round; the seconds
    each idiom took in each round."""

    def __init__(self, client, mod, n: int, only: list[str] | None, best: int = 1):
        self.client, self.mod, self.n, self.best = client, mod, n, best
        self.rows = {name: fn for name, (kind, fn) in idioms(mod).items()
                     if not only or kind in only}
        self.seconds: dict[str, list[float]] = {name: [] for name in self.rows}
        self.cpu: dict[str, list[float]] = {name: [] for name in self.rows}
        self.done = 0
        client.gather(client.map(inc, range(200), pure=False))  # warm: functions, connections

    def round(self) -> None:
        expected = list(range(1, self.n + 1))
        names = list(self.rows)
        k = self.done % len(names)
        for name in names[k:] + names[:k]:
            fn = self.rows[name]

            def once(fn=fn, name=name):
                got = fn(self.client, self.n)
                assert sorted(got) == expected, f"{name}: wrong results"

            wall, cpu = float("inf"), float("inf")
            for _ in range(self.best):
                c0 = tree_cpu()
                wall = min(wall, timed(1, once)[0])
                cpu = min(cpu, tree_cpu() - c0)
            self.seconds[name].append(wall)
            self.cpu[name].append(cpu)
            print(f"{self.mod.__name__}: round {self.done + 1}: {name}: {self.n / wall:.0f}/s",
                  file=sys.stderr, flush=True)
        self.done += 1
        print(f"{self.mod.__name__}: round {self.done} done", file=sys.stderr, flush=True)

    def figures(self) -> dict[str, dict]:
        """name -> {"rates": calls/s per round, "of_gather": per round, over the same
        round's gather of the idiom's road}."""
        kinds = {name: kind for name, (kind, _) in idioms(None).items()}
        ref = {"map": "gather(map(...))", "submit": "gather([submit(...) ...])"}
        out = {}
        for name, secs in self.seconds.items():
            rates = [self.n / t for t in secs]
            base = self.seconds.get(ref[kinds[name]])
            of_gather = [b / t for b, t in zip(base, secs, strict=True)] if base else []
            cpu = self.cpu[name]
            base = self.cpu.get(ref[kinds[name]])
            # a round whose gather used less CPU than the clock resolves (a tick) is left out
            cpu_of_gather = [t / b for b, t in zip(base, cpu, strict=True) if b] if base \
                else []
            out[name] = {"rates": rates, "of_gather": of_gather,
                         "cpu_us_per_call": [1e6 * t / self.n for t in cpu],
                         "cpu_of_gather": cpu_of_gather}
        return out


@contextlib.contextmanager
def hpcsched_rounds(args):
    import hpcsched
    from hpcsched import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield Rounds(client, hpcsched, args.calls, args.only, args.best)


@contextlib.contextmanager
def dask_rounds(args):
    import dask
    import distributed
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with dask.config.set({"distributed.worker.daemon": False}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster, Client(cluster) as client:
        yield Rounds(client, distributed, args.dask_calls or args.calls, args.only)


def _spread(xs: list[float], fmt: str) -> str:
    return f"{format(min(xs), fmt)}-{format(max(xs), fmt)}" if xs else ""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=7, help="rounds of hpcsched")
    p.add_argument("--best", type=int, default=3,
                   help="hpcsched's runs of an idiom in a round, the fastest counted")
    p.add_argument("--dask-repeat", type=int, default=3,
                   help="rounds of dask.distributed (each takes minutes), alternating "
                        "with hpcsched's")
    p.add_argument("--dask-calls", type=int, default=None,
                   help="calls of dask's idioms (default: --calls); its rate per call hardly "
                        "depends on it, and on a loaded machine 3,000 take minutes an idiom")
    p.add_argument("--no-dask", action="store_true", help="hpcsched alone")
    p.add_argument("--only", action="append", choices=("map", "submit"),
                   help="only the rows of this kind (repeatable)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    if min(args.repeat, args.dask_repeat, args.best) < 1:
        p.error("--repeat, --dask-repeat and --best must be at least 1")
    with contextlib.ExitStack() as stack:
        # dask's first: its nannies start their processes with a copy of dask's settings
        d = None if args.no_dask else stack.enter_context(dask_rounds(args))
        h = stack.enter_context(hpcsched_rounds(args))
        while h.done < args.repeat or (d is not None and d.done < args.dask_repeat):
            if h.done < args.repeat:
                h.round()
            if d is not None and d.done < args.dask_repeat:
                d.round()
        hf = h.figures()
        df = d.figures() if d is not None else {}
    print(f"{args.calls} calls of inc; LocalCluster of 2 workers x 1 thread "
          f"({os.cpu_count()} cores); calls/s, median of {args.repeat} rounds (each the best "
          f"of {args.best}"
          + ("" if d is None else f"; dask: {args.dask_repeat} rounds of 1, "
             f"{args.dask_calls or args.calls} calls")
          + ") and min-max; 'of gather': hpcsched over its road's gather in the same round, "
          "median and min-max")
    print(f"{'idiom':50}{'hpcsched':>9}{'min-max':>16}{'of gather':>10}{'min-max':>12}"
          f"{'CPU us':>8}{'of gather':>10}{'dask':>7}{'ratio':>7}{'CPU us':>8}")
    for name, f in hf.items():
        rate, og = statistics.median(f["rates"]), statistics.median(f["of_gather"])
        tail = ""
        if name in df:
            dask_rate = statistics.median(df[name]["rates"])
            tail = (f"{dask_rate:7.0f}{rate / dask_rate:6.0f}x"
                    f"{statistics.median(df[name]['cpu_us_per_call']):8.0f}")
        print(f"{name:50}{rate:9.0f}{_spread(f['rates'], '.0f'):>16}{og:9.2f}x"
              f"{_spread(f['of_gather'], '.2f'):>12}"
              f"{statistics.median(f['cpu_us_per_call']):8.1f}"
              f"{statistics.median(f['cpu_of_gather'] or [float('nan')]):9.2f}x{tail}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"calls": args.calls, "hpcsched": hf, "dask": df}, out, indent=1)


if __name__ == "__main__":
    main()
