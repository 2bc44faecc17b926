"""The tail of a bulk map: how far apart two workers' last tasks end, per checkout.

    python benchmarks/bench_tail.py [--tasks 2000] [--repeat 3] [--kinds commands,map,published]
        [--checkout DIR --checkout DIR2 ...]

Each checkout gets a scheduler and ``hpcsched worker --nworkers 2 --nthreads 1`` (as
bench_commands.py starts them), all up at once; the runs alternate between checkouts
(A B A B ...) so that a change of the machine's load falls on each alike. The kinds:

* ``commands``: ``hpcsched submit --array 1-N --wait -- sh -c 'echo $HPCSCHED_TASK_ID'``
  (an array job: its elements are tasks of its own, wanted by the job's published futures);
* ``map``: ``client.map`` of N calls spinning 1 ms of CPU each, every tenth 10 ms;
* ``published``: the same, its futures published as a dataset first (each element a task
  of its own while queued, as an array job's are).

Per run it prints the wall time, the span of the tasks (first start to last stop, from
the scheduler's task stream), the **gap** between the two workers' last stops (the time
one worker sat idle at the end while the other still ran) and the split of the tasks.
The gap, not the wall time, is the figure: the machine's load moves it little while the
workers share the work, and by whole seconds when they do not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _launch import checkout_label, stop_processes

WORKERS = 2
HERE = os.path.dirname(os.path.abspath(__file__))


def busy(i: int) -> int:
    """1 ms of CPU, 10 ms for every tenth call."""
    end = time.thread_time() + (0.010 if i % 10 == 0 else 0.001)
    while time.thread_time() < end:
        pass
    return i


def role(scheduler_file: str, kind: str, n: int, workdir: str) -> None:
    """One run of ``kind`` against the cluster (in a process whose ``hpcsched`` is the
    checkout's: ``PYTHONPATH``); prints ``RESULT <json>``."""
    from hpcsched import Client

    with Client(scheduler_file=scheduler_file) as client:
        t0 = time.time()
        if kind == "commands":
            r = subprocess.run([sys.executable, "-m", "hpcsched", "submit", "--scheduler-file",
                                scheduler_file, "--array", f"1-{n}", "--wait", "--", "sh", "-c",
                                "echo $HPCSCHED_TASK_ID"], cwd=workdir, capture_output=True,
                               text=True, timeout=600)
            if r.returncode:
                raise RuntimeError(r.stderr[-2000:])
        else:
            fs = client.map(busy, range(n), pure=False)
            if kind == "published":
                client.publish_dataset(bench_tail=fs)
            client.gather(fs, timeout=600)
            if kind == "published":
                client.unpublish_dataset("bench_tail")
        wall = time.time() - t0
        first: dict[str, float] = {}
        last: dict[str, float] = {}
        count: dict[str, int] = {}
        for rec in client.get_task_stream(start=t0):
            w, ss = rec["worker"], rec["startstops"]
            first[w] = min(first.get(w, 1e30), min(s["start"] for s in ss))
            last[w] = max(last.get(w, 0.0), max(s["stop"] for s in ss))
            count[w] = count.get(w, 0) + 1
        print("RESULT " + json.dumps({
            "wall": wall, "span": max(last.values()) - min(first.values()),
            "gap": max(last.values()) - min(last.values()) if len(last) > 1 else 0.0,
            "split": sorted(count.values())}), flush=True)


class Cluster:
    """A scheduler and two one-thread workers of one checkout."""

    def __init__(self, checkout: str) -> None:
        self.checkout = checkout
        self.tmp = tempfile.mkdtemp(prefix="bench-tail-")
        self.sfile = os.path.join(self.tmp, "scheduler.json")
        self.env = dict(os.environ, PYTHONPATH=checkout)
        self.env.pop("HPCSCHED_SCHEDULER_FILE", None)
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        self.logs = open(os.path.join(self.tmp, "cluster.log"), "wb")  # noqa: SIM115 - closed in stop
        hp = [sys.executable, "-m", "hpcsched"]
        self.procs.append(subprocess.Popen(
            [*hp, "scheduler", "--host", "127.0.0.1", "--port", "0", "--scheduler-file",
             self.sfile], stdout=self.logs, stderr=self.logs, env=self.env, cwd=self.tmp))
        deadline = time.monotonic() + 60
        while not os.path.exists(self.sfile):
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                raise RuntimeError(f"the scheduler of {self.checkout} did not start")
            time.sleep(0.05)
        self.procs.append(subprocess.Popen(
            [*hp, "worker", "--scheduler-file", self.sfile, "--nworkers", str(WORKERS),
             "--nthreads", "1", "--memory-limit", "0"], stdout=self.logs, stderr=self.logs,
            env=self.env, cwd=self.tmp))
        self.run("commands", WORKERS * 4)  # the workers have joined

    def run(self, kind: str, n: int) -> dict:
        r = subprocess.run([sys.executable, os.path.join(HERE, "bench_tail.py"), "--role", kind,
                            "--scheduler-file", self.sfile, "--tasks", str(n), "--workdir",
                            self.tmp], capture_output=True, text=True, timeout=900, env=self.env,
                           cwd=self.tmp)
        for line in r.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(f"{kind} on {self.checkout} failed: {r.stderr[-2000:]}")

    def stop(self) -> None:
        stop_processes(self.procs)
        if hasattr(self, "logs"):
            self.logs.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--kinds", default="commands,map,published")
    p.add_argument("--checkout", action="append", default=[],
                   help="an hpcsched checkout's root (repeat to compare commits; default: "
                        "this checkout)")
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--scheduler-file", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role:
        role(args.scheduler_file, args.role, args.tasks, args.workdir)
        return
    from _launch import compile_package

    kinds = args.kinds.split(",")
    for k in kinds:
        if k not in ("commands", "map", "published"):
            p.error(f"--kinds: no kind {k!r} (commands, map, published)")
    checkouts = [os.path.abspath(c) for c in args.checkout] or [os.path.dirname(HERE)]
    for c in checkouts:
        compile_package(c)
    clusters = [Cluster(c) for c in checkouts]
    rows: dict[tuple[str, str], list[dict]] = {}
    try:
        for c in clusters:
            c.start()
        for _ in range(args.repeat):
            for kind in kinds:
                for c in clusters:
                    rows.setdefault((checkout_label(c.checkout), kind), []).append(c.run(kind, args.tasks))
    finally:
        for c in clusters:
            c.stop()
    print(f"\n# benchmarks/bench_tail.py ({time.strftime('%Y-%m-%d %H:%M')}, load "
          f"{os.getloadavg()[0]:.1f}): {args.tasks} tasks, {WORKERS} workers of one thread")
    for (label, kind), runs in rows.items():
        gaps = ", ".join(f"{r['gap']:.3f}" for r in runs)
        spans = ", ".join(f"{r['span']:.2f}" for r in runs)
        splits = ", ".join(f"{r['split'][0]}/{r['split'][-1]}" for r in runs)
        print(f"{label:18s} {kind:10s} gap s: {gaps}  span s: {spans}  split: {splits}")


if __name__ == "__main__":
    main()
