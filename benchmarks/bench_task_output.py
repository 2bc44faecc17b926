"""What keeping each task's output costs: bench_local.py's map and tree with the workers'
``sys.stdout`` / ``sys.stderr`` capture (hpcsched.core.worker.tasks.output) in place and
taken out, alternating, on the same cluster in one run.

    python benchmarks/bench_task_output.py [--tasks 10000] [--leaves 8192] [--rounds 3]

A local cluster of 2 worker processes x 1 thread, as bench_local.py. The tasks print
nothing (the case that must cost nothing); a last row has each map task print a line
(the capture's cost when there is output to keep). Prints tasks/s, best of ``--rounds``.
"""

from __future__ import annotations  # noqa: I001 - _checkout first: it sets the path

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import sys
import time

import bench_local
import cloudpickle
from bench_local import run

# the workers do not have benchmarks/ on their path: bench_local's functions go by value
cloudpickle.register_pickle_by_value(bench_local)


def capture(on: bool) -> bool:
    """On a worker: put the capture in front of the streams, or take it out."""
    from hpcsched.core.worker.tasks import output

    if on:
        output.install()
    else:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, output.TaskStream):
                setattr(sys, name, stream.inner)
    return isinstance(sys.stdout, output.TaskStream)


def noisy(x: int) -> int:
    print(f"element {x}")
    return x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--leaves", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    from hpcsched import Client, LocalCluster

    best: dict = {}
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        for r in range(args.rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):  # no order bias
                state = client.run(capture, on)
                assert set(state.values()) == {on}, state
                figures = run(client, args.tasks, args.leaves, 1)
                for name, value in figures.items():
                    key = (name, on)
                    best[key] = max(best.get(key, 0.0), value)
        client.run(capture, True)
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            futures = client.map(noisy, range(args.tasks),
                                 key=[f"noisy-{i}-{time.time_ns()}" for i in range(args.tasks)])
            client.gather(futures)
            dt = time.perf_counter() - t0
            best[("map printing", True)] = max(best.get(("map printing", True), 0.0),
                                               args.tasks / dt)
            del futures
    print(f"\n# benchmarks/bench_task_output.py ({time.strftime('%Y-%m-%d %H:%M')}); "
          f"best of {args.rounds}, tasks/s")
    print(f"{'':28s}{'capture out':>14s}{'capture in':>14s}{'in / out':>10s}")
    for name in ("map_tasks_per_s", "tree_tasks_per_s"):
        out, inn = best[(name, False)], best[(name, True)]
        print(f"{name:28s}{out:14.0f}{inn:14.0f}{inn / out:10.3f}")
    print(f"{'map, each task printing':28s}{'':14s}{best[('map printing', True)]:14.0f}")


if __name__ == "__main__":
    main()
