"""The scheduler's memory per task: a large graph through the state machine, simulated workers.

    python benchmarks/bench_scheduler_memory.py [--tasks 1000000] [--workers 100]
                                                [--shapes map,tree] [--systems hpcsched,dask]
    python benchmarks/bench_scheduler_memory.py --shapes map --systems hpcsched,hpcsched-bulk

The graphs are ``benchmarks/bench_scheduler.py``'s (``map``: N independent tasks,
all kept by the client; ``tree``: loads, a blockwise map, a binary reduction, only
its root kept). Nothing runs but the state machine: simulated one-thread workers
finish each task they are sent, one per round, as in ``bench_scheduler.py``.

Memory is what :mod:`tracemalloc` counts as allocated and alive (Python objects and
their buffers, without the allocator's own overhead), the same way for both systems,
with the state and its workers already built:

* ``queued_b``: bytes per task once the graph is submitted (the client's copy of the
  graph dropped): every task waiting, queued or processing;
* ``peak_b``: the most held at any time while the graph runs, per task;
* ``kept_b``: bytes per task once every task finished (the map's results are all
  still wanted: each task is in memory; the tree's intermediate results are
  released, and their tasks stay while the root they lead to is wanted, in both).

``hpcsched-bulk`` is the map as ``Client.map`` sends a large one: a bulk map
(:mod:`hpcsched.core.state.bulk`), its simulated workers finishing a whole range a round.

dask's side is ``distributed``'s own scheduler, driven without a cluster: a
``Scheduler`` object that is never started, whose workers are registered the way
``Scheduler.add_worker`` registers them (without the comm), and which is given the
same graph through ``_create_taskstate_from_graph`` (what ``update_graph`` calls
once the graph is unpacked and ordered) and every result through
``stimulus_task_finished``, its transitions and messages as a real scheduler would
have them (the messages are not sent). It needs ``pip install 'dask[distributed]'``.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import gc
import time
import tracemalloc
from collections import deque

from bench_scheduler import SHAPES

from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState


class Meter:
    """tracemalloc's figures relative to a starting point."""

    def __init__(self) -> None:
        gc.collect()
        self.base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()

    def now(self) -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - self.base

    def peak(self) -> int:
        return tracemalloc.get_traced_memory()[1] - self.base


def run_hpcsched(shape: str, n_tasks: int, n_workers: int) -> dict:
    s = SchedulerState()
    queues: dict[str, deque] = {}

    def deliver(out: list) -> None:
        for cmd in out:
            if type(cmd.msg).__name__ == "ComputeTask":
                queues[cmd.to].append(cmd.msg.key)

    for i in range(n_workers):
        queues[f"sim://{i}"] = deque()
        deliver(s.handle(ev.AddWorker(f"sim://{i}", 1, name=f"w{i}")))
    deliver(s.handle(ev.AddClient("client")))
    meter = Meter()  # from here on: the graph the client sends, then what the state keeps
    tasks, keys = SHAPES[shape](n_tasks)
    n = len(tasks)
    deliver(s.handle(ev.UpdateGraph("client", tasks, keys)))
    del tasks
    queued = meter.now()
    tracemalloc.reset_peak()
    done, now = 0, 0.0
    while True:
        now += 0.01
        before = done
        for addr, q in queues.items():
            if q:
                key = q.popleft()
                s.handle(ev.TaskStarted(addr, key, now=now))
                deliver(s.handle(ev.TaskFinished(addr, key, nbytes=100, typename="int",
                                                 start=now - 0.01, stop=now, now=now)))
                done += 1
        if done == before:
            break
    assert all(s.tasks[k].state == "memory" for k in keys)
    return _row("hpcsched", shape, n, n_workers, queued, meter.peak(), meter.now())


def run_hpcsched_bulk(shape: str, n_tasks: int, n_workers: int) -> dict:
    """The map as a bulk map (``update-map``: hpcsched.core.state.bulk): its elements held
    as arrays; each simulated worker finishes one whole range a round."""
    if shape != "map":
        raise SystemExit("hpcsched-bulk runs the map shape only")
    s = SchedulerState()
    queues: dict[str, deque] = {}

    def deliver(out: list) -> None:
        for cmd in out:
            if type(cmd.msg).__name__ == "ComputeRange":
                queues[cmd.to].append(cmd.msg.indices)

    for i in range(n_workers):
        queues[f"sim://{i}"] = deque()
        deliver(s.handle(ev.AddWorker(f"sim://{i}", 1, name=f"w{i}")))
    deliver(s.handle(ev.AddClient("client")))
    meter = Meter()
    args = [b"inc"] * n_tasks  # one shared spec, as the task graph's "inc"
    deliver(s.handle(ev.UpdateMap("client", prefix="inc-x-", function=b"inc", args=args)))
    del args
    queued = meter.now()
    tracemalloc.reset_peak()
    now = 0.0
    while any(queues.values()):
        now += 0.01
        for addr, q in queues.items():
            if q:
                idx = q.popleft()
                k = len(idx)
                deliver(s.handle(ev.RangeFinished(addr, prefix="inc-x-", indices=idx,
                                                  nbytes=[100] * k, types=["int"] * k,
                                                  starts=[now - 0.01] * k, stops=[now] * k,
                                                  now=now)))
    assert s.task_counts().get("memory") == n_tasks
    return _row("hpcsched-bulk", shape, n_tasks, n_workers, queued, meter.peak(),
                meter.now())


def run_dask(shape: str, n_tasks: int, n_workers: int) -> dict:
    import asyncio

    from dask._task_spec import Task, TaskRef
    from dask.order import order
    from distributed.core import Status
    from distributed.scheduler import Scheduler, WorkerState

    def noop(*args):
        return None

    async def main() -> dict:
        sched = Scheduler(dashboard_address=None, validate=False)
        for i in range(n_workers):
            addr = f"tcp://10.0.0.1:{1000 + i}"
            ws = WorkerState(address=addr, status=Status.running, pid=0, nthreads=1,
                             memory_limit=0, name=f"w{i}", local_directory="", services={},
                             versions={}, nanny="", extra={}, server_id=f"w{i}",
                             scheduler=sched)
            sched.workers[addr] = ws
            sched.running.add(ws)
            sched.host_info.setdefault("10.0.0.1", {"addresses": set(), "nthreads": 0})
            sched.host_info["10.0.0.1"]["addresses"].add(addr)
            sched.host_info["10.0.0.1"]["nthreads"] += 1
            sched.total_nthreads += 1
            sched.aliases[f"w{i}"] = addr
            sched.check_idle_saturated(ws)
            for plugin in list(sched.plugins.values()):  # stealing's per-worker tables
                plugin.add_worker(scheduler=sched, worker=addr)
        queues: dict[str, deque] = {a: deque() for a in sched.workers}

        def take(client_msgs: dict, worker_msgs: dict) -> None:
            for addr, msgs in worker_msgs.items():
                for m in msgs:
                    if m.get("op") == "compute-task":
                        queues[addr].append((m["key"], m["run_id"]))

        sched.send_all = take  # type: ignore[method-assign]  # what it would send
        meter = Meter()
        spec, keys = SHAPES[shape](n_tasks)
        dsk = {k: Task(k, noop, *[TaskRef(d) for d in v["deps"]]) for k, v in spec.items()}
        del spec
        ordered = order(dsk)
        n = len(dsk)
        sched._create_taskstate_from_graph(
            start=time.time(), dsk=dsk, keys=set(keys), ordered=ordered, client="client",
            annotations_by_type={}, global_annotations=None, stimulus_id="update-graph",
            submitting_task=None, span_metadata={}, user_priority=0)
        del dsk, ordered
        queued = meter.now()
        tracemalloc.reset_peak()
        now = time.time()
        done = 0
        while True:
            before = done
            now += 0.01
            for addr, q in queues.items():
                if q:
                    key, run_id = q.popleft()
                    sched.handle_task_finished(
                        key=key, worker=addr, stimulus_id=f"task-finished-{done}",
                        run_id=run_id, metadata={}, nbytes=100, type=b"int",
                        typename="int", status="OK", thread=0,
                        startstops=[{"action": "compute", "start": now - 0.01, "stop": now}])
                    done += 1
            if done == before:
                break
        assert all(sched.tasks[k].state == "memory" for k in keys), "not all computed"
        return _row("dask", shape, n, n_workers, queued, meter.peak(), meter.now())

    return asyncio.run(main())


def _row(system: str, shape: str, n: int, workers: int, queued: int, peak: int,
         kept: int) -> dict:
    return {"system": system, "shape": shape, "tasks": n, "workers": workers,
            "queued_b": round(queued / n), "peak_b": round(peak / n),
            "kept_b": round(kept / n)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=100)
    p.add_argument("--shapes", default="map,tree")
    p.add_argument("--systems", default="hpcsched,dask")
    a = p.parse_args()
    runners = {"hpcsched": run_hpcsched, "hpcsched-bulk": run_hpcsched_bulk, "dask": run_dask}
    tracemalloc.start()
    print("| system | shape | tasks | workers | queued B/task | peak B/task | kept B/task |")
    print("|---|---|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        for system in a.systems.split(","):
            r = runners[system](shape, a.tasks, a.workers)
            print(f"| {r['system']} | {r['shape']} | {r['tasks']} | {r['workers']} | "
                  f"{r['queued_b']} | {r['peak_b']} | {r['kept_b']} |", flush=True)


if __name__ == "__main__":
    main()
