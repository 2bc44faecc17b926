"""TaPS, the Task Performance Suite (arXiv:2408.07236), with hpcsched and its peers.

    python benchmarks/bench_taps.py --taps-src DIR [--install] [--workers 2] [--repeat 1]
        [--tasks 1000] [--apps bag,diamond,reduce,sequential,cholesky,mapreduce]
        [--executors hpcsched,dask,parsl,ray,process-pool] [--json FILE]

TaPS is not on PyPI: ``DIR`` is a checkout of https://github.com/proxystore/taps,
measured at commit 6167964ad4c536de3f21e29f5f481bb682f218a3 (2026-08-04);
``--install`` installs it (and its dependencies: dask.distributed, Parsl, Ray, ...)
into this Python with pip first. TaPS is not changed: hpcsched is one more executor
registered through TaPS's plugin decorator (``benchmarks/taps_hpcsched.py``), and
every run is TaPS's command line with that executor known. Not part of CI.

Each application runs with each executor on ``--workers`` worker processes of one
thread (hpcsched: a ``LocalCluster``, its workers preloading TaPS's engine and the
application's module; dask: ``Client(n_workers=...)``; Parsl: ``parsl-local``; Ray:
``num_cpus``; ``ProcessPoolExecutor``: ``max_processes``), once per ``--repeat``, each
run a process tree of its own that is ended with it. The figure is TaPS's own: the
seconds of its timer around ``app.run`` (engine start-up not included), best of the
repeats. The applications, small enough for a laptop:

* synthetic ``bag`` (``--tasks`` no-op tasks, 4 in flight), ``diamond``, ``reduce``
  (``--tasks`` tasks each), ``sequential`` (a fifth as many, each on the one before);
* ``cholesky`` (tiled Cholesky of a 2,000 x 2,000 matrix in 200 x 200 blocks);
* ``mapreduce`` (word counts of 16 generated files of 20,000 words, 16 map tasks).
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import os
import subprocess
import sys
import tempfile

from _launch import launch  # benchmarks/ is on the path: the scripts run from it

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 900.0  # seconds one TaPS run may take
SYNTHETIC = "taps.apps.synthetic"

def apps(tasks: int) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (TaPS arguments, modules the hpcsched workers preload)."""
    n, seq = str(tasks), str(max(tasks // 5, 1))
    return {
        "bag": (["--app", "synthetic", "--app.structure", "bag", "--app.task-count", n,
                 "--app.bag-max-running", "4"], [SYNTHETIC]),
        "diamond": (["--app", "synthetic", "--app.structure", "diamond",
                     "--app.task-count", n], [SYNTHETIC]),
        "reduce": (["--app", "synthetic", "--app.structure", "reduce",
                    "--app.task-count", n], [SYNTHETIC]),
        "sequential": (["--app", "synthetic", "--app.structure", "sequential",
                        "--app.task-count", seq], [SYNTHETIC]),
        "cholesky": (["--app", "cholesky", "--app.matrix-size", "2000",
                      "--app.block-size", "200"], ["taps.apps.cholesky", "numpy"]),
        "mapreduce": (["--app", "mapreduce", "--app.map-tasks", "16", "--app.generate",
                       "true", "--app.generated-files", "16", "--app.generated-words",
                       "20000"], ["taps.apps.mapreduce"]),
    }


def executor_args(name: str, workers: int, modules: list[str]) -> list[str]:
    """TaPS's arguments choosing executor ``name`` with ``workers`` processes."""
    if name == "hpcsched":
        return ["--engine.executor", "hpcsched", "--engine.executor.workers", str(workers),
                "--engine.executor.preload", json.dumps(["taps.engine", *modules])]
    if name == "dask":
        return ["--engine.executor", "dask", "--engine.executor.workers", str(workers),
                "--engine.executor.daemon-workers", "false"]
    if name == "parsl":
        return ["--engine.executor", "parsl-local", "--engine.executor.workers", str(workers)]
    if name == "ray":
        return ["--engine.executor", "ray", "--engine.executor.num-cpus", str(workers)]
    if name == "process-pool":
        return ["--engine.executor", "process-pool",
                "--engine.executor.max-processes", str(workers)]
    raise ValueError(f"unknown executor {name!r}")


def run_once(app: str, executor: str, workers: int, tasks: int, runs: str) -> float:
    """TaPS's app seconds of one run of ``app`` with ``executor``."""
    args, modules = apps(tasks)[app]
    if app == "mapreduce":
        args = [*args, "--app.data-dir", os.path.join(runs, "mapreduce-data")]
    cmd = [sys.executable, os.path.join(HERE, "taps_hpcsched.py"), *args,
           *executor_args(executor, workers, modules),
           "--run.dir-format", os.path.join(runs, f"{app}-{executor}-{{timestamp}}")]
    results, _, _, _ = launch(cmd, TIMEOUT, env={"OMP_NUM_THREADS": "1",
                                                 "OPENBLAS_NUM_THREADS": "1"})
    if not results:
        raise RuntimeError(f"{app} with {executor}: TaPS printed no app time")
    return float(results[-1]["app_s"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--taps-src", required=True, help="a checkout of proxystore/taps")
    p.add_argument("--install", action="store_true",
                   help="pip install the checkout (and its dependencies) first")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--tasks", type=int, default=1000, help="tasks of the synthetic apps")
    p.add_argument("--apps", default=",".join(apps(1)))
    p.add_argument("--executors", default="hpcsched,dask,parsl,ray,process-pool")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    if args.install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", args.taps_src],
                       check=True)
    commit = subprocess.run(["git", "-C", args.taps_src, "rev-parse", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    names = [a for a in args.apps.split(",") if a]
    executors = [e for e in args.executors.split(",") if e]
    table: dict[str, dict[str, float | str]] = {}
    with tempfile.TemporaryDirectory(prefix="taps-runs-") as runs:
        for app in names:
            table[app] = {}
            for ex in executors:
                best: float | str = float("inf")
                for _ in range(args.repeat):
                    try:
                        best = min(best, run_once(app, ex, args.workers, args.tasks, runs))  # type: ignore[type-var]
                    except RuntimeError as e:
                        best = "failed"
                        print(f"{app} / {ex}: {str(e)[-2000:]}", file=sys.stderr)
                        break
                table[app][ex] = best
                shown = best if isinstance(best, str) else f"{best:.3f}"
                print(f"{app:12} {ex:14} {shown}", flush=True)
    print(f"\nTaPS {commit[:12] or '?'}: app seconds (TaPS's timer), {args.workers} workers x 1 "
          f"thread, best of {args.repeat}, --tasks {args.tasks}; last column: best peer / "
          "hpcsched")
    print(f"{'app':12}" + "".join(f"{e:>14}" for e in executors) + f"{'ratio':>8}")
    for app, row in table.items():
        cells = "".join(f"{v:14.3f}" if isinstance(v, float) else f"{v:>14}" for v in row.values())
        h = row.get("hpcsched")
        peers = [v for e, v in row.items() if e != "hpcsched" and isinstance(v, float)]
        ratio = f"{min(peers) / h:7.2f}x" if isinstance(h, float) and peers else ""
        print(f"{app:12}{cells}{ratio:>8}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"taps_commit": commit, "workers": args.workers, "apps": table}, f,
                      indent=1)


if __name__ == "__main__":
    main()
