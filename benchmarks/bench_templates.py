"""A CPU -> GPU -> CPU pipeline on real SLURM: hpcsched's job templates vs dask-jobqueue.

    python benchmarks/bench_templates.py [--cpu-calls 200] [--gpu-calls 20] [--json FILE]

The pipeline, the same code on both: ``--cpu-calls`` CPU calls of 50 ms, then
``--gpu-calls`` GPU calls of 0.5 ms x 1000 (0.5 s, ``resources={"GPU": 1}``) on every
tenth result, then ``--cpu-calls`` CPU calls of 50 ms on the GPU results. What is
measured: the wall time of the pipeline, and the seconds of GPU jobs held (from their
submission to their end as the cluster saw it): what a GPU allocation is charged.

* hpcsched: one ``SLURMCluster`` with a ``gpu`` template (``resources={"GPU": 1}``),
  ``adapt(minimum=2, maximum=2, templates={"gpu": dict(maximum_jobs=1)})``: two CPU jobs
  throughout, a GPU job only while GPU tasks wait or run.
* dask-jobqueue 0.9 cannot scale two kinds of jobs under one scheduler
  (dask/distributed#2118, dask-jobqueue#103). Its users either run a CPU cluster of two
  jobs for the whole pipeline and a second cluster of one GPU job (``--resources
  GPU=1``) for the GPU stage, its inputs and results passing through the client
  ("two clusters"); or one cluster whose two jobs are all GPU jobs, held for the whole
  pipeline ("GPU jobs only").

Both run on this machine's SLURM (GPUs are not needed: ``resources`` are abstract
units). Jobs of 1 core, 300 MB, one worker each. Every cluster is closed, and its jobs
cancelled, before the script returns, also when it fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from typing import Any


def cpu(x: Any) -> int:
    import time

    time.sleep(0.05)
    return int(x) + 1


def gpu(x: int) -> int:
    import time

    time.sleep(0.5)
    return x * 10


def check(stage1: list, stage2: list, stage3: list, n_cpu: int) -> None:
    assert stage1 == [i + 1 for i in range(n_cpu)], "stage 1"
    assert stage2 == [10 * (i + 1) for i in range(0, n_cpu, 10)], "stage 2"
    assert stage3 == [10 * (i - i % 10 + 1) + 1 for i in range(n_cpu)], "stage 3"


def run_hpcsched(n_cpu: int, n_gpu: int, logs: str) -> dict:
    from hpcsched import Client, SLURMCluster
    from hpcsched.core import config

    with config.set({"adaptive.interval": 0.5, "adaptive.wait-count": 2,
                     "jobqueue.poll-interval": 0.2}):
        cluster = SLURMCluster(cores=1, memory="300MB", processes=1, walltime="00:10:00",
                               job_name="benchcpu", log_directory=logs,
                               job_templates={"gpu": dict(job_name="benchgpu",
                                                          resources={"GPU": 1})})
        try:
            cluster.adapt(minimum=2, maximum=2, templates={"gpu": dict(maximum_jobs=1)})
            cluster.wait_for_workers(2, timeout=120)
            with Client(cluster) as client:
                start = time.monotonic()
                s1 = client.gather(client.map(cpu, range(n_cpu)))
                s2 = client.gather(client.map(gpu, s1[::10][:n_gpu], resources={"GPU": 1}))
                s3 = client.gather(client.map(cpu, [v for v in s2 for _ in range(10)]))
                took = time.monotonic() - start
            check(s1, s2, s3, n_cpu)
            deadline = time.monotonic() + 60  # the GPU job's end, as the cluster sees it
            gpu_jobs = [j for j in cluster.jobs.values() if j.template == "gpu"]
            while any(not j.ended for j in gpu_jobs) and time.monotonic() < deadline:
                time.sleep(0.2)
            now = time.time()
            held = sum((j.end_time or now) - j.submit_time for j in gpu_jobs)
            return {"system": "hpcsched", "seconds": took, "gpu_jobs": len(gpu_jobs),
                    "gpu_job_seconds": held}
        finally:
            cluster.close()


def run_dask_jobqueue(n_cpu: int, n_gpu: int, logs: str) -> dict:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    common = dict(cores=1, memory="300MB", processes=1, walltime="00:10:00",
                  log_directory=logs)
    cpu_cluster = SLURMCluster(job_name="peercpu", **common)
    gpu_cluster = None
    try:
        cpu_cluster.scale(jobs=2)
        with Client(cpu_cluster) as client:
            client.wait_for_workers(2, timeout=120)
            start = time.monotonic()
            s1 = client.gather(client.map(cpu, range(n_cpu)))
            gpu_start = time.time()
            gpu_cluster = SLURMCluster(job_name="peergpu",
                                       worker_extra_args=["--resources", "GPU=1"], **common)
            gpu_cluster.scale(jobs=1)
            with Client(gpu_cluster) as gclient:
                gclient.wait_for_workers(1, timeout=120)
                s2 = gclient.gather(gclient.map(gpu, s1[::10][:n_gpu], resources={"GPU": 1}))
            gpu_cluster.close()
            gpu_end = time.time()
            gpu_cluster = None
            s3 = client.gather(client.map(cpu, [v for v in s2 for _ in range(10)]))
            took = time.monotonic() - start
        check(s1, s2, s3, n_cpu)
        return {"system": "dask-jobqueue, two clusters", "seconds": took, "gpu_jobs": 1,
                "gpu_job_seconds": gpu_end - gpu_start}
    finally:
        if gpu_cluster is not None:
            gpu_cluster.close()
        cpu_cluster.close()


def run_dask_jobqueue_gpu_only(n_cpu: int, n_gpu: int, logs: str) -> dict:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    cluster = SLURMCluster(cores=1, memory="300MB", processes=1, walltime="00:10:00",
                           log_directory=logs, job_name="peerall",
                           worker_extra_args=["--resources", "GPU=1"])
    try:
        held_from = time.time()
        cluster.scale(jobs=2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=120)
            start = time.monotonic()
            s1 = client.gather(client.map(cpu, range(n_cpu)))
            s2 = client.gather(client.map(gpu, s1[::10][:n_gpu], resources={"GPU": 1}))
            s3 = client.gather(client.map(cpu, [v for v in s2 for _ in range(10)]))
            took = time.monotonic() - start
    finally:
        cluster.close()
    check(s1, s2, s3, n_cpu)
    return {"system": "dask-jobqueue, GPU jobs only", "seconds": took, "gpu_jobs": 2,
            "gpu_job_seconds": 2 * (time.time() - held_from)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-calls", type=int, default=200)
    p.add_argument("--gpu-calls", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.cpu_calls < 10 or args.gpu_calls != math.ceil(args.cpu_calls / 10):
        p.error("--gpu-calls must be --cpu-calls / 10 (a GPU call on every tenth result)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-templates-") as logs:
        for run in (run_hpcsched, run_dask_jobqueue, run_dask_jobqueue_gpu_only):
            rows.append(run(args.cpu_calls, args.gpu_calls, logs))
            print(json.dumps(rows[-1]), flush=True)
    print("| system | pipeline, s | GPU jobs | GPU job-seconds |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['system']} | {r['seconds']:.1f} | {r['gpu_jobs']} | "
              f"{r['gpu_job_seconds']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
