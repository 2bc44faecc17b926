"""The scheduler's own cost: SchedulerState driven by simulated workers (no processes).

    python benchmarks/bench_scheduler.py [--tasks 100000] [--workers 10,100,1000]
                                         [--shapes map,tree] [--profile]

Nothing runs but the state machine: a simulated worker "finishes" each task it
is sent (``compute-task`` -> ``TaskStarted`` + ``TaskFinished``), one task per
worker thread per round, so all workers progress side by side as real ones
would. Measured: ``time.process_time()`` around the ``SchedulerState.handle``
calls (adding workers, the update-graph with its static ordering, every
``TaskStarted``/``TaskFinished``), divided by the number of tasks. The clock is
read once per round of results, so building the events and handing
``compute-task`` messages to the simulated workers (a deque append) are counted
too: the figures slightly overstate the scheduler's cost. The garbage collector
stays on (its passes are part of the cost).

Shapes:

* ``map``: N independent tasks (one TaskGroup, root-ish: queued on the
  scheduler, released as workers finish);
* ``tree``: N/3 loads, a blockwise map over them, then a binary tree
  reduction of the mapped blocks (root-ish loads, downstream tasks placed by
  ``decide_worker`` next to their inputs).

``--profile`` runs cProfile over the largest case and prints the top entries.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import cProfile
import gc
import pstats
import time
from collections import deque

from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState


def map_graph(n: int) -> tuple[dict, list]:
    tasks = {f"inc-{i}": {"run_spec": "inc", "deps": []} for i in range(n)}
    return tasks, list(tasks)


def tree_graph(n: int) -> tuple[dict, list]:
    """~n tasks: n/3 loads -> n/3 blockwise -> binary reduction of n/3 blocks."""
    m = max(n // 3, 2)
    tasks: dict = {}
    level = []
    for i in range(m):
        tasks[f"load-{i}"] = {"run_spec": "load", "deps": []}
        tasks[f"map-{i}"] = {"run_spec": "f", "deps": [f"load-{i}"]}
        level.append(f"map-{i}")
    depth = 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), 2):
            k = f"sum{depth}-{i // 2}"
            tasks[k] = {"run_spec": "add", "deps": level[i:i + 2]}
            nxt.append(k)
        level = nxt
        depth += 1
    return tasks, level


SHAPES = {"map": map_graph, "tree": tree_graph}


def simulate(shape: str, n_tasks: int, n_workers: int, nthreads: int = 1) -> dict:
    """Run one graph to completion; return CPU seconds spent in the state machine."""
    tasks, keys = SHAPES[shape](n_tasks)
    s = SchedulerState(work_stealing=False)
    queues: dict[str, deque] = {}
    cpu = 0.0
    clock = time.process_time

    def deliver(out: list) -> None:
        for cmd in out:
            # as the server sends it: a record is encoded once (its per-class encoder)
            msg = cmd.wire()
            if msg["op"] == "compute-task":
                queues[cmd.to].append(msg["key"])

    gc.collect()  # garbage of the previous case is not charged to this one
    t0 = clock()
    for i in range(n_workers):
        addr = f"sim://{i}"
        queues[addr] = deque()
        deliver(s.handle(ev.AddWorker(addr, nthreads, name=f"w{i}")))
    deliver(s.handle(ev.AddClient("client")))
    t_graph = clock()
    deliver(s.handle(ev.UpdateGraph("client", tasks, keys)))
    t1 = clock()
    cpu += t1 - t0
    graph_cpu = t1 - t_graph
    done = 0
    now = 0.0
    handle = s.handle
    while True:
        now += 0.01
        before = done
        t0 = clock()  # one clock read per round: reading it costs ~1 us
        for addr, q in queues.items():
            for _ in range(nthreads):
                if not q:
                    break
                key = q.popleft()
                # every event's messages are carried out: any event may hand queued tasks
                # to free workers (the fill that follows an event)
                deliver(handle(ev.TaskStarted(addr, key, now=now)))
                # delivered at once, as a server flushes its batch: messages held for a
                # whole round would live long enough to swell the GC's older generations
                deliver(handle(ev.TaskFinished(addr, key, nbytes=100, typename="int",
                                               start=now - 0.01, stop=now, now=now)))
                done += 1
        if s.fill_pending:  # what the server does in its next loop turn (FillQueue)
            deliver(handle(ev.FillQueue(now=now)))
        cpu += clock() - t0
        if done == before and not any(queues.values()):
            break
    in_memory = sum(1 for k in keys if s.tasks[k].state == "memory")
    assert in_memory == len(keys), f"only {in_memory} of {len(keys)} outputs computed"
    return {"shape": shape, "tasks": len(tasks), "workers": n_workers, "finished": done,
            "cpu_s": cpu, "graph_cpu_s": graph_cpu, "us_per_task": cpu / len(tasks) * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="10000,100000")
    p.add_argument("--workers", default="10,100,1000")
    p.add_argument("--shapes", default="map,tree")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    sizes = [int(x) for x in a.tasks.split(",")]
    workers = [int(x) for x in a.workers.split(",")]
    shapes = a.shapes.split(",")
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        simulate(shapes[0], max(sizes), max(workers))
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    print(f"{'shape':6} {'tasks':>8} {'workers':>8} {'us/task':>9} {'graph us/task':>14} "
          f"{'total cpu s':>12}")
    worst = 0.0
    for shape in shapes:
        for n in sizes:
            for w in workers:
                r = simulate(shape, n, w)
                worst = max(worst, r["us_per_task"])
                print(f"{shape:6} {r['tasks']:>8} {w:>8} {r['us_per_task']:>9.1f} "
                      f"{r['graph_cpu_s'] / r['tasks'] * 1e6:>14.1f} {r['cpu_s']:>12.2f}",
                      flush=True)
    print(f"worst: {worst:.1f} us per task (target <= 50)")


if __name__ == "__main__":
    main()
