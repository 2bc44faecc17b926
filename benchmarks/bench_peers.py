"""hpcsched against the other Python task systems of clusters, on this machine, in one run.

    python benchmarks/bench_peers.py [--tasks 1000] [--leaves 256] [--sweep 400]
                                     [--sweep-ms 10] [--commands 500]
                                     [--systems hpcsched,parsl,ipyparallel,hyperqueue]
                                     [--json FILE]

Each system gets two workers of one core each, set up as its documentation shows:

* hpcsched: ``LocalCluster(n_workers=2, threads_per_worker=1)`` and a ``Client``;
* Parsl: a ``HighThroughputExecutor`` with ``max_workers_per_node=2`` on a
  ``LocalProvider`` (one block: an interchange and a manager with two worker
  processes), ``python_app``s;
* ipyparallel: ``ipp.Cluster(n=2)`` (a controller and two engines), a
  load-balanced view;
* HyperQueue: its Python API's ``LocalCluster`` (the server in this process)
  with one worker of two cores; ``Job.function`` for Python tasks (HyperQueue
  starts a Python process per task) and ``Job.program`` for commands.

Workloads (each timed from the first submission to the last result):

* *map*: ``--tasks`` no-op calls;
* *tree*: a pairwise sum of ``--leaves`` leaves (2 x leaves - 1 tasks), each sum
  depending on two results. hpcsched and Parsl pass futures as arguments;
  ipyparallel has no task dependencies carrying data, so its tree is one map per
  level with the results through the client; HyperQueue's dependencies carry no
  data, so its tasks write their results to files their dependents read;
* *sweep*: ``--sweep`` calls of ``--sweep-ms`` each; efficiency is the ideal time
  (calls x duration / 2 workers) over the measured one;
* *commands*: ``--commands`` runs of ``true``: HyperQueue's own ground (a
  program per task); hpcsched runs them with ``subprocess`` inside tasks.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

WORKERS = 2


def noop(x: Any) -> Any:
    return x


def add(a: int, b: int) -> int:
    return a + b


# the tasks import what they use: Parsl and ipyparallel ship a function of __main__ by value,
# without this module's globals
def nap(ms: float) -> float:
    import time

    time.sleep(ms / 1000)
    return ms


def run_true(_: int) -> int:
    import subprocess

    return subprocess.run(["true"], check=True).returncode


def file_leaf(path: str, i: int) -> None:
    import os

    with open(os.path.join(path, f"0-{i}"), "w") as f:
        f.write(str(i))


def file_add(path: str, level: int, i: int) -> None:
    import os

    total = 0
    for j in (2 * i, 2 * i + 1):
        name = os.path.join(path, f"{level - 1}-{j}")
        if os.path.exists(name):
            with open(name) as f:
                total += int(f.read())
    with open(os.path.join(path, f"{level}-{i}"), "w") as f:
        f.write(str(total))


def expected_tree(leaves: int) -> int:
    return leaves * (leaves - 1) // 2


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# ------------------------------------------------------------------ hpcsched
def bench_hpcsched(args: argparse.Namespace) -> dict:
    from hpcsched import Client, LocalCluster

    out: dict = {}
    with LocalCluster(n_workers=WORKERS, threads_per_worker=1) as cluster, \
            Client(cluster) as client:
        dt, res = timed(lambda: client.gather(client.map(noop, range(args.tasks), pure=False)))
        assert res[-1] == args.tasks - 1
        out["map_s"] = dt

        def tree() -> int:
            level = [client.submit(noop, i, pure=False) for i in range(args.leaves)]
            while len(level) > 1:
                level = [client.submit(add, level[i], level[i + 1], pure=False)
                         if i + 1 < len(level) else level[i]
                         for i in range(0, len(level), 2)]
            return level[0].result()

        dt, total = timed(tree)
        assert total == expected_tree(args.leaves), total
        out["tree_s"] = dt
        dt, _ = timed(lambda: client.gather(client.map(nap, [args.sweep_ms] * args.sweep,
                                                         pure=False)))
        out["sweep_s"] = dt
        dt, res = timed(lambda: client.gather(client.map(run_true, range(args.commands),
                                                         pure=False)))
        assert sum(res) == 0
        out["commands_s"] = dt
    return out


# ------------------------------------------------------------------ Parsl
def bench_parsl(args: argparse.Namespace) -> dict:
    import parsl
    from parsl.app.app import python_app
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    run_dir = tempfile.mkdtemp(prefix="bench-parsl-")
    config = Config(executors=[HighThroughputExecutor(
        label="htex", max_workers_per_node=WORKERS, cores_per_worker=1,
        provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1))],
        run_dir=run_dir, strategy="none")
    p_noop, p_add, p_nap, p_true = (python_app(f) for f in (noop, add, nap, run_true))
    out: dict = {}
    dfk = parsl.load(config)
    try:
        p_noop(0).result()  # the block is up
        dt, res = timed(lambda: [f.result() for f in [p_noop(i) for i in range(args.tasks)]])
        assert res[-1] == args.tasks - 1
        out["map_s"] = dt

        def tree() -> int:
            level = [p_noop(i) for i in range(args.leaves)]
            while len(level) > 1:
                level = [p_add(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                         for i in range(0, len(level), 2)]
            return level[0].result()

        dt, total = timed(tree)
        assert total == expected_tree(args.leaves), total
        out["tree_s"] = dt
        dt, _ = timed(lambda: [f.result() for f in
                               [p_nap(args.sweep_ms) for _ in range(args.sweep)]])
        out["sweep_s"] = dt
        dt, res = timed(lambda: [f.result() for f in
                                 [p_true(i) for i in range(args.commands)]])
        assert sum(res) == 0
        out["commands_s"] = dt
    finally:
        dfk.cleanup()
        parsl.clear()
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


# ------------------------------------------------------------------ ipyparallel
def bench_ipyparallel(args: argparse.Namespace) -> dict:
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=WORKERS, log_level=40)
    rc = cluster.start_and_connect_sync()
    out: dict = {}
    try:
        rc.wait_for_engines(WORKERS, timeout=120)
        view = rc.load_balanced_view()
        view.map_sync(noop, range(WORKERS))
        dt, res = timed(lambda: view.map_sync(noop, range(args.tasks)))
        assert res[-1] == args.tasks - 1
        out["map_s"] = dt

        def tree() -> int:
            level = view.map_sync(noop, range(args.leaves))
            while len(level) > 1:
                pairs = [(level[i], level[i + 1] if i + 1 < len(level) else 0)
                         for i in range(0, len(level), 2)]
                level = view.map_sync(add, [a for a, _ in pairs], [b for _, b in pairs])
            return level[0]

        dt, total = timed(tree)
        assert total == expected_tree(args.leaves), total
        out["tree_s"] = dt
        dt, _ = timed(lambda: view.map_sync(nap, [args.sweep_ms] * args.sweep))
        out["sweep_s"] = dt
        dt, res = timed(lambda: view.map_sync(run_true, range(args.commands)))
        assert sum(res) == 0
        out["commands_s"] = dt
    finally:
        rc.close()
        cluster.stop_cluster_sync()
    return out


# ------------------------------------------------------------------ HyperQueue
def bench_hyperqueue(args: argparse.Namespace) -> dict:
    from hyperqueue import Job
    from hyperqueue.cluster import LocalCluster, WorkerConfig

    os.environ["TQDM_DISABLE"] = "1"  # its progress bar, drawn while waiting for a job
    server_dir = tempfile.mkdtemp(prefix="bench-hq-")
    # the tasks' working directory (HyperQueue writes each task's stdout and stderr there by
    # default) and the tree's results
    data = tempfile.mkdtemp(prefix="bench-hq-data-")
    out: dict = {}
    try:
        with LocalCluster(server_dir=server_dir) as cluster:
            cluster.start_worker(WorkerConfig(cores=WORKERS))
            client = cluster.client()

            def run(job: Job) -> None:
                client.wait_for_jobs([client.submit(job)], raise_on_error=True)

            warm = Job(default_workdir=data)
            warm.function(noop, args=(0,))
            run(warm)

            def build_map() -> Job:
                job = Job(default_workdir=data)
                for i in range(args.tasks):
                    job.function(noop, args=(i,))
                return job

            out["map_s"], _ = timed(lambda: run(build_map()))

            def tree() -> int:
                job = Job(default_workdir=data)
                level = [job.function(file_leaf, args=(data, i)) for i in range(args.leaves)]
                depth = 0
                while len(level) > 1:
                    depth += 1
                    level = [job.function(file_add, args=(data, depth, i),
                                          deps=level[2 * i:2 * i + 2])
                             for i in range((len(level) + 1) // 2)]
                run(job)
                with open(os.path.join(data, f"{depth}-0")) as f:
                    return int(f.read())

            dt, total = timed(tree)
            assert total == expected_tree(args.leaves), total
            out["tree_s"] = dt

            def sweep() -> None:
                job = Job(default_workdir=data)
                for _ in range(args.sweep):
                    job.function(nap, args=(args.sweep_ms,))
                run(job)

            out["sweep_s"], _ = timed(sweep)

            def commands() -> None:
                job = Job(default_workdir=data)
                for _ in range(args.commands):
                    job.program(["true"])
                run(job)

            out["commands_s"], _ = timed(commands)
    finally:
        shutil.rmtree(server_dir, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
    return out


SYSTEMS = {"hpcsched": bench_hpcsched, "parsl": bench_parsl,
           "ipyparallel": bench_ipyparallel, "hyperqueue": bench_hyperqueue}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=1000)
    p.add_argument("--leaves", type=int, default=256)
    p.add_argument("--sweep", type=int, default=400)
    p.add_argument("--sweep-ms", type=float, default=10.0)
    p.add_argument("--commands", type=int, default=500)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args()
    rows: dict = {}
    for name in args.systems.split(","):
        print(f"... {name}", file=sys.stderr, flush=True)
        try:
            rows[name] = SYSTEMS[name](args)
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            rows[name] = {"failed": f"{type(e).__name__}: {e}"}
    counts = {"map": args.tasks, "tree": 2 * args.leaves - 1, "sweep": args.sweep,
              "commands": args.commands}
    ideal = args.sweep * args.sweep_ms / 1000 / WORKERS
    print(f"\n# benchmarks/bench_peers.py  ({time.strftime('%Y-%m-%d %H:%M')}); "
          f"{WORKERS} workers of one core each\n")
    ours = rows.get("hpcsched", {})
    print(f"{'tasks/s':28s}" + "".join(f"{n:>14s}" for n in rows)
          + "".join(f"{'ours/' + n:>18s}" for n in rows if n != "hpcsched"))
    for w, n in counts.items():
        line = f"{w + ' (' + str(n) + ')':28s}"
        for r in rows.values():
            line += f"{n / r[w + '_s']:14.0f}" if w + "_s" in r else f"{'failed':>14s}"
        for name, r in rows.items():
            if name == "hpcsched":
                continue
            if w + "_s" in r and w + "_s" in ours:
                line += f"{r[w + '_s'] / ours[w + '_s']:17.2f}x"
            else:
                line += f"{'-':>18s}"
        print(line)
    line = f"{'sweep efficiency':28s}"
    for r in rows.values():
        line += f"{100 * ideal / r['sweep_s']:13.0f}%" if "sweep_s" in r else f"{'-':>14s}"
    print(line)
    for name, r in rows.items():
        if "failed" in r:
            print(f"{name}: {r['failed'][:300]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
