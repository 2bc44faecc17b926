"""Ctrl-C of a script holding a ``SLURMCluster``: how long until the script has exited and
its batch jobs are gone, hpcsched against dask-jobqueue, in one run.

    python benchmarks/bench_interrupt.py [--rounds 3] [--jobs 2]
        [--dask-python /path/to/venv/bin/python] [--systems hpcsched,dask-jobqueue]

Each round starts the script a user writes (the cluster, ``scale(jobs=N)``, a client, a map
of 2,000 half-second sleeps that keeps every worker busy; their arguments differ by a
nanosecond, as dask's map is pure by default and makes one task of equal calls), waits until its jobs' workers
have connected and the map runs, sends SIGINT (what Ctrl-C in the terminal sends), and
reports the seconds from the signal to the script's exit and to the moment ``squeue``
no longer lists its jobs (by job name). A job still listed after ``--timeout`` seconds
is cancelled by this driver and reported as left behind. dask-jobqueue runs in the
interpreter given by ``--dask-python`` (a venv with dask-jobqueue and distributed).

The figure that matters is "queue empty": a job left queued or running after Ctrl-C
holds an allocation nobody uses. The machine's load average is printed with each round.
"""

from __future__ import annotations  # noqa: I001 - _checkout first: it sets the path

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

SCRIPT = """
    import time
    {imports}
    cluster = SLURMCluster(cores=1, memory="300MB", walltime="00:10:00",
                           job_name={name!r}, log_directory={logs!r})
    cluster.scale(jobs={jobs})
    client = Client(cluster)
    client.wait_for_workers({jobs}, timeout=300)
    futures = client.map(time.sleep, [0.5 + i * 1e-9 for i in range(2000)])
    print("ready", flush=True)
    client.gather(futures)
"""
# the only lines a user changes between the two
IMPORTS = {
    "hpcsched": "from hpcsched import Client; from hpcsched.jobqueue import SLURMCluster",
    "dask-jobqueue": "from distributed import Client; from dask_jobqueue import SLURMCluster",
}


def _listed(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True,
                         text=True, timeout=30).stdout
    return out.split()


def one_round(system: str, python: str, jobs: int, timeout: float, tmp: str) -> dict:
    name = f"intr-{system[:4]}-{uuid.uuid4().hex[:6]}"
    code = textwrap.dedent(SCRIPT).format(imports=IMPORTS[system], name=name, jobs=jobs,
                                         logs=tmp)
    proc = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp)
    try:
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"{system}: the script did not start: {proc.stderr.read()[-2000:]}")
        time.sleep(2.0)  # the map is running on every worker
        load = float(open("/proc/loadavg").read().split()[0])
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
            exited = time.monotonic() - start
        except subprocess.TimeoutExpired:
            exited = float("nan")
        while True:
            left = _listed(name)
            if not left or time.monotonic() - start > timeout:
                break
            time.sleep(0.05)
        gone = time.monotonic() - start if not left else float("nan")
        return {"system": system, "load": load, "returncode": proc.poll(),
                "exited": exited, "queue_empty": gone, "left": left}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for job in _listed(name):
            subprocess.run(["scancel", job], timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--systems", default="hpcsched,dask-jobqueue")
    ap.add_argument("--dask-python", default=os.environ.get("DASK_PYTHON", sys.executable))
    args = ap.parse_args()
    systems = args.systems.split(",")
    for system in systems:
        if system not in IMPORTS:
            ap.error(f"unknown system {system!r}; known: {', '.join(IMPORTS)}")
    results: dict[str, list[dict]] = {s: [] for s in systems}
    with tempfile.TemporaryDirectory(prefix="bench-interrupt-") as tmp:
        for rnd in range(args.rounds):
            for system in systems:  # alternated, so load falls on both alike
                python = args.dask_python if system == "dask-jobqueue" else sys.executable
                r = one_round(system, python, args.jobs, args.timeout, tmp)
                results[system].append(r)
                print(f"round {rnd + 1} {system:14s} load {r['load']:5.2f} "
                      f"exit code {r['returncode']} exited {r['exited']:6.2f} s "
                      f"queue empty {r['queue_empty']:6.2f} s left {r['left']}", flush=True)
    print()
    print("| system | exited, median s | queue empty, median s | jobs left |")
    print("| --- | --- | --- | --- |")
    for system, rs in results.items():
        print(f"| {system} | {statistics.median(r['exited'] for r in rs):.2f} | "
              f"{statistics.median(r['queue_empty'] for r in rs):.2f} | "
              f"{sum(len(r['left']) for r in rs)} |")


if __name__ == "__main__":
    main()
