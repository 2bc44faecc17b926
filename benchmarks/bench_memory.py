"""Memory footprint of a computation: hpcsched's static order vs ``dask.order``.

    python benchmarks/bench_memory.py [--repeat 7] [--mb 1.0] [--task-ms 10]

A LocalCluster of 2 worker processes x 1 thread runs each graph twice per
repetition, in the same run: once with the priorities of
:func:`hpcsched.core.graph.order.order` (computed by the scheduler, the default path)
and once with ``dask.order.order``'s priorities on the same graph, passed as the
``static_priorities`` of the update-graph message. Fusion is off in both runs
so that both schedule exactly the same tasks. Every task takes ``--task-ms``
(a sleep) and returns a numpy array of ``--mb`` megabytes (the dask.array-like
shape does real array arithmetic).

Measured on the scheduler, after every event it handles (a wrapper around
``SchedulerState.handle``, on the scheduler's own thread): the number of
results held in the cluster (sum over workers of the keys they hold) and their
bytes. Reported: the peak of each, median over repetitions; and, without any
timing noise, the peak of a sequential run in each order
(:func:`hpcsched.core.graph.order.peak_memory`).

Shapes (dependencies below their dependents):

* ``independent-trees``: 8 binary reduction trees of 16 leaves;
* ``tree-reduction``: one binary reduction of 128 leaves;
* ``broker``: 8 units of two 6-task chains sharing a "broker" input half way;
* ``map-overlap``: 64 chunks, ``y_i = f(x_{i-1}, x_i, x_{i+1})``, then a tree sum;
* ``blockwise-reduce``: ``(a + 2 * b).sum()`` on 64 blocks: loads of a and b,
  a blockwise map and add, then a tree sum of the blocks.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from hpcsched.core.client.client import Client, Future, task_run_spec
from hpcsched.core.client.graphs import update_graph
from hpcsched.core.graph.dsk import normalize
from hpcsched.launchers.local_cluster import LocalCluster

NBYTES = 1_000_000


# ---------------------------------------------------------------- task functions
TASK_SECONDS = 0.0  # set from --task-ms; travels to the workers inside each task's arguments


def work(seconds: float) -> None:
    """Stand-in for computation: regular task durations make runs comparable (with
    sub-millisecond tasks the peak depends mostly on message timing)."""
    if seconds:
        time.sleep(seconds)


def make(nbytes: int, seconds: float, *inputs: object) -> np.ndarray:
    """A result of ``nbytes`` (its inputs only order it)."""
    work(seconds)
    return np.ones(max(nbytes // 8, 1))


def load(i: int, nbytes: int, seconds: float) -> np.ndarray:
    work(seconds)
    return np.full(max(nbytes // 8, 1), float(i))


def double(x: np.ndarray, seconds: float) -> np.ndarray:
    work(seconds)
    return x * 2


def add(x: np.ndarray, y: np.ndarray, seconds: float) -> np.ndarray:
    work(seconds)
    return x + y


def total(x: np.ndarray) -> float:
    return float(x.sum())


# ---------------------------------------------------------------- shapes
def _tree(g: dict, level: list, prefix: str, nbytes: int) -> str:
    depth = 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), 2):
            k = f"{prefix}-s{depth}-{i // 2}"
            g[k] = (make, nbytes, TASK_SECONDS, *level[i:i + 2])
            nxt.append(k)
        level = nxt
        depth += 1
    return level[0]


def independent_trees(p: str, nbytes: int) -> tuple[dict, list]:
    g: dict = {}
    outs = []
    for t in range(8):
        leaves = [f"{p}-t{t}-leaf-{i}" for i in range(16)]
        for k in leaves:
            g[k] = (make, nbytes, TASK_SECONDS)
        outs.append(_tree(g, leaves, f"{p}-t{t}", nbytes))
    return g, outs


def tree_reduction(p: str, nbytes: int) -> tuple[dict, list]:
    g: dict = {}
    leaves = [f"{p}-x-{i}" for i in range(128)]
    for k in leaves:
        g[k] = (make, nbytes, TASK_SECONDS)
    return g, [_tree(g, leaves, p, nbytes)]


def broker(p: str, nbytes: int) -> tuple[dict, list]:
    g: dict = {}
    outs = []
    for u in range(8):
        g[f"{p}-brk-{u}"] = (make, nbytes, TASK_SECONDS)
        for side in "AB":
            prev = None
            for i in range(6):
                k = f"{p}-{side}{u}-{i}"
                deps = [d for d in (prev, f"{p}-brk-{u}" if i == 3 else None) if d]
                g[k] = (make, nbytes, TASK_SECONDS, *deps)
                prev = k
            outs.append(prev)
    return g, outs


def map_overlap(p: str, nbytes: int) -> tuple[dict, list]:
    g: dict = {}
    n = 64
    for i in range(n):
        g[f"{p}-x-{i}"] = (make, nbytes, TASK_SECONDS)
    ys = []
    for i in range(n):
        g[f"{p}-y-{i}"] = (make, nbytes, TASK_SECONDS,
                           *[f"{p}-x-{j}" for j in (i - 1, i, i + 1) if 0 <= j < n])
        ys.append(f"{p}-y-{i}")
    return g, [_tree(g, ys, p, nbytes)]


def blockwise_reduce(p: str, nbytes: int) -> tuple[dict, list]:
    g: dict = {}
    blocks = []
    for i in range(64):
        g[f"{p}-a-{i}"] = (load, i, nbytes, TASK_SECONDS)
        g[f"{p}-b-{i}"] = (load, -i, nbytes, TASK_SECONDS)
        g[f"{p}-b2-{i}"] = (double, f"{p}-b-{i}", TASK_SECONDS)
        g[f"{p}-ab-{i}"] = (add, f"{p}-a-{i}", f"{p}-b2-{i}", TASK_SECONDS)
        blocks.append(f"{p}-ab-{i}")
    level = blocks
    depth = 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), 2):
            k = f"{p}-sum{depth}-{i // 2}"
            g[k] = ((add, *level[i:i + 2], TASK_SECONDS) if i + 1 < len(level)
                    else (double, level[i], TASK_SECONDS))
            nxt.append(k)
        level = nxt
        depth += 1
    g[f"{p}-total"] = (total, level[0])
    return g, [f"{p}-total"]


SHAPES: dict[str, Callable[[str, int], tuple[dict, list]]] = {
    "independent-trees": independent_trees,
    "tree-reduction": tree_reduction,
    "broker": broker,
    "map-overlap": map_overlap,
    "blockwise-reduce": blockwise_reduce,
}


# ---------------------------------------------------------------- running
def dask_priorities(dsk: dict) -> dict:
    from dask.order import order as dask_order

    out = dask_order(dsk)
    return {k: int(getattr(v, "priority", v)) for k, v in out.items()}


def sequential_peaks(dsk: dict) -> tuple[int, int]:
    """Results held at once running the graph one task at a time in each order
    (:func:`hpcsched.core.graph.order.peak_memory`: no timing, no noise)."""
    from hpcsched.core.graph.order import order, peak_memory

    deps = {k: list(t.dependencies) for k, t in normalize(dsk, known=set()).items()}
    return peak_memory(deps, order(deps)), peak_memory(deps, dask_priorities(dsk))


def submit_graph(client: Client, dsk: dict, keys: list, static: dict | None) -> list:
    """What ``Client.compute(fuse=False)`` sends, with the static priorities given
    (None: the scheduler computes hpcsched's ``order()``)."""
    tasks = normalize(dsk, known=set())
    wire = {k: {"run_spec": task_run_spec(t), "deps": list(t.dependencies)}
            for k, t in tasks.items()}
    futures = [Future(k, client) for k in keys]
    client.scheduler_comm.send(update_graph(client, wire, list(keys), static_priorities=static))
    return futures


class Peak:
    """Wraps the scheduler state's ``handle``: peak results held and bytes."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.n = 0
        self.nbytes = 0

        def install(s: object) -> None:
            state = s.state  # type: ignore[attr-defined]
            handle = type(state).handle

            def wrapped(event: object) -> list:
                out = handle(state, event)
                ws = state.workers.values()
                n = sum(len(w.has_what) for w in ws)
                if n > self.n:
                    self.n = n
                b = sum(w.nbytes for w in ws)
                if b > self.nbytes:
                    self.nbytes = b
                return out

            state.handle = wrapped

        cluster.scheduler.call(install)

    def reset(self) -> None:
        def f(s: object) -> None:
            self.n = 0
            self.nbytes = 0
        self.cluster.scheduler.call(f)

    def read(self) -> tuple[int, int]:
        return self.cluster.scheduler.call(lambda s: (self.n, self.nbytes))


def wait_empty(cluster: LocalCluster, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while cluster.scheduler.call(lambda s: len(s.state.tasks)):
        if time.monotonic() > deadline:
            raise TimeoutError("the scheduler still holds tasks of the previous run")
        time.sleep(0.02)


def run_one(client: Client, cluster: LocalCluster, peak: Peak, shape: str, prefix: str,
            nbytes: int, use_dask: bool) -> tuple[int, int, float]:
    dsk, keys = SHAPES[shape](prefix, nbytes)
    static = dask_priorities(dsk) if use_dask else None
    wait_empty(cluster)
    peak.reset()
    t0 = time.perf_counter()
    futures = submit_graph(client, dsk, keys, static)
    client.gather(futures, timeout=300)
    dt = time.perf_counter() - t0
    n, b = peak.read()
    del futures
    return n, b, dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--mb", type=float, default=1.0, help="size of every result, MB")
    p.add_argument("--task-ms", type=float, default=10.0, help="duration of every task, ms")
    p.add_argument("--shapes", default=",".join(SHAPES))
    a = p.parse_args()
    global TASK_SECONDS
    TASK_SECONDS = a.task_ms / 1000
    nbytes = int(a.mb * NBYTES)
    shapes = a.shapes.split(",")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster, \
            Client(cluster, set_as_default=False) as client:
        peak = Peak(cluster)
        results: dict = {}
        for r in range(a.repeat):
            for shape in shapes:
                # alternate which goes first, so neither always runs on a warmer cluster
                for use_dask in ((False, True) if r % 2 == 0 else (True, False)):
                    who = "dask" if use_dask else "hpcsched"
                    n, b, dt = run_one(client, cluster, peak, shape, f"{shape}-{who}-{r}",
                                       nbytes, use_dask)
                    results.setdefault((shape, who), []).append((n, b, dt))
        print(f"{'shape':18} {'tasks':>6} | {'hpcsched peak':>13} {'MB':>7} | "
              f"{'dask.order peak':>15} {'MB':>7} | ok  | sequential peak hpcsched/dask")
        all_ok = True
        for shape in shapes:
            dsk = SHAPES[shape]("x", 8)[0]
            ntasks = len(dsk)
            seq_h, seq_d = sequential_peaks(dsk)
            h = results[(shape, "hpcsched")]
            d = results[(shape, "dask")]
            hn = statistics.median(x[0] for x in h)
            hb = statistics.median(x[1] for x in h) / 1e6
            dn = statistics.median(x[0] for x in d)
            db = statistics.median(x[1] for x in d) / 1e6
            ok = hn <= dn
            all_ok &= ok
            print(f"{shape:18} {ntasks:>6} | {hn:>13g} {hb:>7.1f} | {dn:>15g} {db:>7.1f} | "
                  f"{'yes' if ok else 'NO ':3} | {seq_h} / {seq_d}")
            print(f"{'':18} {'':>6} | runs: {[x[0] for x in h]} vs {[x[0] for x in d]}")
        print("hpcsched peak <= dask.order peak on every shape:", "yes" if all_ok else "NO")


if __name__ == "__main__":
    main()
