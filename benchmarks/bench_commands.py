"""Command tasks from the command line: ``hpcsched submit --array`` against HyperQueue's
program tasks, on this machine, in one run.

    python benchmarks/bench_commands.py [--tasks 2000] [--repeat 3] [--systems hpcsched,hyperqueue]

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

Both write each task's stdout and stderr to a file of its own. The figure is commands
per second, the best of ``--repeat`` runs. The package is byte-compiled first, as ``pip
install`` leaves it (``_launch.compile_package``): the ``submit`` process's start-up is
in the figure, and where ``PYTHONDONTWRITEBYTECODE`` is set it would otherwise compile
every module it imports from source.
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

from _launch import compile_package

WORKERS = 2


def _hpcsched() -> list[str]:
    return [sys.executable, "-m", "hpcsched"]


def bench_hpcsched(args: argparse.Namespace) -> list[float]:
    tmp = tempfile.mkdtemp(prefix="bench-commands-")
    sfile = os.path.join(tmp, "scheduler.json")
    logs = open(os.path.join(tmp, "cluster.log"), "wb")  # noqa: SIM115 - closed below
    env = dict(os.environ)
    env.pop("HPCSCHED_SCHEDULER_FILE", None)
    procs = [subprocess.Popen([*_hpcsched(), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--scheduler-file", sfile], stdout=logs, stderr=logs,
                              stdin=subprocess.DEVNULL, env=env)]
    times = []
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sfile):
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError("the scheduler did not start")
            time.sleep(0.05)
        procs.append(subprocess.Popen([*_hpcsched(), "worker", "--scheduler-file", sfile,
                                       "--nworkers", str(WORKERS), "--nthreads", "1",
                                       "--memory-limit", "0"],
                                      stdout=logs, stderr=logs, stdin=subprocess.DEVNULL,
                                      env=env))

        def submit(n: int) -> float:
            t0 = time.perf_counter()
            r = subprocess.run([*_hpcsched(), "submit", "--scheduler-file", sfile,
                                "--array", f"1-{n}", "--wait", "--", "sh", "-c",
                                "echo $HPCSCHED_TASK_ID"],
                               cwd=tmp, capture_output=True, text=True, timeout=600, env=env)
            dt = time.perf_counter() - t0
            if r.returncode != 0:
                raise RuntimeError(f"hpcsched submit failed: {r.stderr[-2000:]}")
            return dt

        submit(WORKERS * 4)  # the workers have joined and started their sentinels
        for _ in range(args.repeat):
            times.append(submit(args.tasks))
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        logs.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return times


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


SYSTEMS = {"hpcsched": bench_hpcsched, "hyperqueue": bench_hyperqueue}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    args = p.parse_args()
    compile_package()  # the submit command's start-up is timed: not the compiler's
    rows = {}
    for name in args.systems.split(","):
        print(f"... {name}", file=sys.stderr, flush=True)
        rows[name] = SYSTEMS[name](args)
    load = os.getloadavg()[0]
    print(f"\n# benchmarks/bench_commands.py ({time.strftime('%Y-%m-%d %H:%M')}, load {load:.1f}): "
          f"{args.tasks} commands, {WORKERS} workers of one core each")
    for name, times in rows.items():
        rates = ", ".join(f"{args.tasks / t:,.0f}" for t in times)
        print(f"{name:12s} best {args.tasks / min(times):8,.0f} commands/s  (runs: {rates})")
    if len(rows) == 2:
        a, b = (min(t) for t in rows.values())
        print(f"hpcsched / hyperqueue: {b / a:.2f}x")


if __name__ == "__main__":
    main()
