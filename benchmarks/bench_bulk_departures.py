"""What a departing worker costs the scheduler while it holds a bulk map (no processes).

    python benchmarks/bench_bulk_departures.py [--elements 1000000] [--workers 1000]
                                               [--leave 1000] [--rounds 3]

Nothing runs but the state machine (:class:`~hpcsched.core.state.scheduler_state.
SchedulerState`): ``--workers`` simulated workers of one thread join, a client sends a
map of ``--elements`` no-op elements (one ``update-map``), each worker reports every
element it was given, ``--rounds`` times (it then holds results and runs more), and
then ``--leave`` workers leave one by one (``RemoveWorker``: their unfinished elements
and the results only they held go back to the queue, the others are topped up).
Measured: ``time.process_time()`` around the departures, per departure, and the
elements the departing workers had (running or holding), per departure.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import gc
import time

from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState


def ranges_given(out: list) -> dict[str, list[int]]:
    given: dict[str, list[int]] = {}
    for cmd in out:
        if cmd.msg.op == "compute-range":
            given.setdefault(cmd.to, []).extend(cmd.msg.indices)
    return given


def run(n: int, n_workers: int, leave: int, rounds: int) -> dict:
    s = SchedulerState(work_stealing=False)
    s.handle(ev.AddClient("c"))
    for w in range(n_workers):
        s.handle(ev.AddWorker(f"sim://{w}", 1))
    out = s.handle(ev.UpdateMap("c", prefix="m-a-", function=b"f", args=[b"a"] * n))
    for _ in range(rounds):
        out = [cmd for w, idx in ranges_given(out).items()
               for cmd in s.handle(ev.RangeFinished(
                   w, prefix="m-a-", indices=idx, nbytes=[8] * len(idx),
                   types=["int"] * len(idx), starts=[1.0] * len(idx),
                   stops=[1.1] * len(idx)))]
    counts = s.task_counts()
    had = counts.get("processing", 0) + counts.get("memory", 0)
    gc.collect()
    clock = time.process_time
    t0 = clock()
    for w in range(leave):
        s.handle(ev.RemoveWorker(f"sim://{w}", "gone"))
    cpu = clock() - t0
    return {"elements": n, "workers": n_workers, "left": leave, "cpu_s": cpu,
            "ms_per_departure": cpu / leave * 1e3, "had_per_worker": had / n_workers}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--elements", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--leave", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    r = run(a.elements, a.workers, min(a.leave, a.workers), a.rounds)
    print(f"{r['elements']:,} elements over {r['workers']:,} workers "
          f"(each running or holding ~{r['had_per_worker']:.0f}): "
          f"{r['left']:,} departures in {r['cpu_s']:.2f} s of CPU, "
          f"{r['ms_per_departure']:.2f} ms each")


if __name__ == "__main__":
    main()
