"""Command tasks from the command line: ``hpcsched submit --array`` against HyperQueue's
program tasks, on this machine, in one run.

    python benchmarks/bench_commands.py [--tasks 2000] [--repeat 3] [--systems hpcsched,hyperqueue]
        [--checkout DIR --checkout DIR2 ...]

Each system gets two workers of one core each, started as a user starts them:

* hpcsched: ``hpcsched scheduler`` and ``hpcsched worker --nworkers 2 --nthreads 1``, then
  ``hpcsched submit --array 1-N --wait -- sh -c 'echo $HPCSCHED_TASK_ID'``, timed from
  the start of the ``submit`` process to its exit (its start-up, the connection, the
  submission, every command and the wait: what a user waits for);
* HyperQueue: its Python API's ``LocalCluster`` (the server in this process) with one
  worker of two cores, a job of N ``Job.program(["sh", "-c", "echo $HQ_TASK_ID"])``
  tasks, timed from the submission to the end of ``wait_for_jobs``. (The ``hyperqueue``
  wheel ships no ``hq`` binary, so ``hq submit --array`` cannot be run here; the Python
  API is the same server and workers.)

HyperQueue writes each task's stdout and stderr to a file of its own; hpcsched packs an
array job's output into a log per worker slot (``hpcsched.commands.slotlog``), read
back per task by ``hpcsched job cat``. The figure is commands per second, the best of
``--repeat`` runs, and for hpcsched the CPU its scheduler and workers spent per command
(their own, not the commands'; user and system, each the median of the runs), which the
machine's load disturbs less.

``--checkout`` (repeated) measures several checkouts of hpcsched (``git worktree add
/tmp/base <commit>``) in one run: a cluster of each is up at once and their runs
alternate, so that a change of load falls on each alike.

Each package is byte-compiled first, as ``pip install`` leaves it
(``_launch.compile_package``): the ``submit`` process's start-up is in the figure, and
where ``PYTHONDONTWRITEBYTECODE`` is set it would otherwise compile every module it
imports from source.
"""

from __future__ import annotations  # noqa: I001 - _checkout first: it sets the path

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _launch import checkout_label, compile_package, stop_processes

WORKERS = 2


def _hpcsched() -> list[str]:
    return [sys.executable, "-m", "hpcsched"]


def _cpu(procs: list) -> tuple[float, float]:
    """User and system CPU seconds of ``procs`` and of their descendants now alive (the
    worker processes of ``hpcsched worker --nworkers``), not of the commands they reaped."""
    import psutil

    user = system = 0.0
    for p in procs:
        try:
            ps = psutil.Process(p.pid)
            for q in [ps, *ps.children(recursive=True)]:
                t = q.cpu_times()
                user, system = user + t.user, system + t.system
        except psutil.NoSuchProcess:
            pass
    return user, system


class HpcschedCluster:
    """A scheduler and two one-thread workers of one checkout (its root on
    ``PYTHONPATH``), and ``hpcsched submit --array ... --wait`` timed against them."""

    def __init__(self, checkout: str) -> None:
        self.checkout = checkout
        self.tmp = tempfile.mkdtemp(prefix="bench-commands-")
        self.sfile = os.path.join(self.tmp, "scheduler.json")
        self.env = dict(os.environ, PYTHONPATH=checkout)
        self.env.pop("HPCSCHED_SCHEDULER_FILE", None)
        self.procs: list[subprocess.Popen] = []
        #: CPU seconds (user, system) of the scheduler and workers, each run
        self.cpu: list[tuple[float, float]] = []

    def start(self) -> None:
        self.logs = open(os.path.join(self.tmp, "cluster.log"), "wb")  # noqa: SIM115 - closed in stop
        self.procs.append(self._start("scheduler", "--host", "127.0.0.1", "--port", "0",
                                      "--scheduler-file", self.sfile))
        deadline = time.monotonic() + 60
        while not os.path.exists(self.sfile):
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                raise RuntimeError(f"the scheduler of {self.checkout} did not start")
            time.sleep(0.05)
        self.procs.append(self._start("worker", "--scheduler-file", self.sfile, "--nworkers",
                                      str(WORKERS), "--nthreads", "1", "--memory-limit", "0"))
        self.submit(WORKERS * 4)  # the workers have joined and started their sentinels

    def _start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([*_hpcsched(), *args], stdout=self.logs, stderr=self.logs,
                                stdin=subprocess.DEVNULL, env=self.env, cwd=self.checkout)

    def submit(self, n: int) -> float:
        cpu = _cpu(self.procs)
        t0 = time.perf_counter()
        r = subprocess.run([*_hpcsched(), "submit", "--scheduler-file", self.sfile,
                            "--array", f"1-{n}", "--wait", "--", "sh", "-c",
                            "echo $HPCSCHED_TASK_ID"],
                           cwd=self.tmp, capture_output=True, text=True, timeout=600,
                           env=self.env)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"hpcsched submit failed: {r.stderr[-2000:]}")
        after = _cpu(self.procs)
        self.cpu.append((after[0] - cpu[0], after[1] - cpu[1]))
        return dt

    def stop(self) -> None:
        stop_processes(self.procs)
        if hasattr(self, "logs"):
            self.logs.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def bench_hpcsched(args: argparse.Namespace) -> dict[str, tuple[list[float], list]]:
    """Every checkout's cluster up at once, their runs alternated (A B A B ...), so that
    a change of the machine's load falls on each of them alike."""
    checkouts = [os.path.abspath(c) for c in args.checkout] or [_checkout.REPO]
    for c in checkouts:
        compile_package(c)
    clusters = [HpcschedCluster(c) for c in checkouts]
    times: list[list[float]] = [[] for _ in clusters]
    try:
        for c in clusters:
            c.start()
        for _ in range(args.repeat):
            for c, t in zip(clusters, times, strict=True):
                t.append(c.submit(args.tasks))
    finally:
        for c in clusters:
            c.stop()
    return {checkout_label(c.checkout) if args.checkout else "hpcsched": (t, c.cpu[1:])
            for c, t in zip(clusters, times, strict=True)}


def bench_hyperqueue(args: argparse.Namespace) -> list[float]:
    from hyperqueue import Job
    from hyperqueue.cluster import LocalCluster, WorkerConfig

    os.environ["TQDM_DISABLE"] = "1"
    server_dir = tempfile.mkdtemp(prefix="bench-hq-")
    data = tempfile.mkdtemp(prefix="bench-hq-data-")
    times = []
    try:
        with LocalCluster(server_dir=server_dir) as cluster:
            cluster.start_worker(WorkerConfig(cores=WORKERS))
            client = cluster.client()

            def run(n: int) -> float:
                job = Job(default_workdir=data)
                for _ in range(n):
                    job.program(["sh", "-c", "echo $HQ_TASK_ID"])
                t0 = time.perf_counter()
                client.wait_for_jobs([client.submit(job)], raise_on_error=True)
                return time.perf_counter() - t0

            run(WORKERS * 4)
            for _ in range(args.repeat):
                times.append(run(args.tasks))
    finally:
        shutil.rmtree(server_dir, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--systems", default="hpcsched,hyperqueue")
    p.add_argument("--checkout", action="append", default=[],
                   help="an hpcsched checkout's root to measure (repeat to compare commits, "
                        "their runs alternated; default: this checkout)")
    args = p.parse_args()
    rows: dict[str, tuple[list[float], list | None]] = {}
    for name in args.systems.split(","):
        print(f"... {name}", file=sys.stderr, flush=True)
        if name == "hpcsched":
            rows.update(bench_hpcsched(args))
        elif name == "hyperqueue":
            rows[name] = (bench_hyperqueue(args), None)
        else:
            p.error(f"--systems: no system {name!r} (hpcsched, hyperqueue)")
    load = os.getloadavg()[0]
    print(f"\n# benchmarks/bench_commands.py ({time.strftime('%Y-%m-%d %H:%M')}, load {load:.1f}): "
          f"{args.tasks} commands, {WORKERS} workers of one core each")
    for name, (times, cpu) in rows.items():
        rates = ", ".join(f"{args.tasks / t:,.0f}" for t in times)
        own = ""
        if cpu:  # the medians of the runs
            user, system = (sorted(c[i] for c in cpu)[len(cpu) // 2] for i in (0, 1))
            own = (f"; scheduler and workers' CPU per command, median: user "
                   f"{1000 * user / args.tasks:.3f} ms, system {1000 * system / args.tasks:.3f} ms")
        print(f"{name:18s} best {args.tasks / min(times):8,.0f} commands/s  (runs: {rates}){own}")
    if "hyperqueue" in rows and len(rows) == 2:
        a, b = (min(t) for t, _ in rows.values())
        print(f"hpcsched / hyperqueue: {b / a:.2f}x")


if __name__ == "__main__":
    main()
