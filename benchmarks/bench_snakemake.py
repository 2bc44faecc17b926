"""A Snakemake workflow of short rules on SLURM: through the hpcsched executor plugin on a
SLURMCluster of 2 batch jobs, against Snakemake's SLURM executor (a batch job per rule),
on the same SLURM in one run.

    python benchmarks/bench_snakemake.py [--rules 100] [--systems hpcsched,slurm]

Needs snakemake, snakemake-executor-plugin-slurm and
plugins/snakemake-executor-plugin-hpcsched installed, and a SLURM whose partition
``--partition`` (default debug) runs jobs here. The workflow: ``--rules`` jobs of a rule
writing one small file each, and ``all``. Timed: the ``snakemake`` command, from its
start to its exit (the SLURMCluster's jobs are started and have joined before; their
start-up is printed apart). The SLURM executor runs with ``--slurm-status-command squeue``
and ``--slurm-no-account`` (a SLURM without accounting storage, as a test machine).
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

SNAKEFILE = """
N = int(config["count"])

rule all:
    input: expand("out/{i}.txt", i=range(N))

rule make:
    output: "out/{i}.txt"
    shell: "echo {wildcards.i} > {output}"
"""


def snakemake_exe() -> str:
    return shutil.which("snakemake", path=os.path.dirname(sys.executable)) or "snakemake"


def workflow(rules: int) -> str:
    d = tempfile.mkdtemp(prefix="bench-smk-")
    with open(os.path.join(d, "Snakefile"), "w") as f:
        f.write(SNAKEFILE)
    return d


def run(cmd: list[str], cwd: str, rules: int, env: dict | None = None) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd + ["--jobs", "1000", "--config", f"count={rules}"], cwd=cwd,
                       capture_output=True, text=True, timeout=3600, env=env,
                       stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    done = len(os.listdir(os.path.join(cwd, "out"))) if os.path.isdir(os.path.join(cwd, "out")) else 0
    if r.returncode != 0 or done != rules:
        raise RuntimeError(f"{cmd[:3]}: exit {r.returncode}, {done}/{rules} outputs\n{r.stderr[-2000:]}")
    return dt


def bench_hpcsched(args: argparse.Namespace) -> dict:
    from hpcsched import Client
    from hpcsched.jobqueue.clusters import SLURMCluster

    cwd = workflow(args.rules)
    t0 = time.perf_counter()
    cluster = SLURMCluster(cores=1, processes=1, memory="500MB", walltime="01:00:00",
                           queue=args.partition, job_name="bench-smk-hpcsched",
                           log_directory=os.path.join(cwd, "logs"),
                           job_script_prologue=[f"export PYTHONPATH={_checkout.REPO}"])
    try:
        cluster.scale(jobs=2)
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=300)
            start = time.perf_counter() - t0
            env = {**os.environ, "HPCSCHED_SECRET": cluster.security.secret_hex()}
            dt = run([snakemake_exe(), "--executor", "hpcsched", "--hpcsched-address",
                      cluster.scheduler_address], cwd, args.rules, env)
            return {"seconds": dt, "batch_jobs": len(cluster.jobs), "cluster_start_s": start}
    finally:
        cluster.close()
        shutil.rmtree(cwd, ignore_errors=True)


def bench_slurm(args: argparse.Namespace) -> dict:
    cwd = workflow(args.rules)
    try:
        dt = run([snakemake_exe(), "--executor", "slurm", "--default-resources",
                  f"slurm_partition={args.partition}", "mem_mb=100", "runtime=5",
                  "--slurm-no-account", "--slurm-status-command", "squeue",
                  "--slurm-init-seconds-before-status-checks", "1", "--latency-wait", "5"],
                 cwd, args.rules)
        return {"seconds": dt, "batch_jobs": args.rules}
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


SYSTEMS = {"hpcsched": bench_hpcsched, "slurm": bench_slurm}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rules", type=int, default=100)
    p.add_argument("--partition", default="debug")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    args = p.parse_args()
    rows = {}
    for name in args.systems.split(","):
        print(f"... {name}", file=sys.stderr, flush=True)
        rows[name] = SYSTEMS[name](args)
    print(f"\n# benchmarks/bench_snakemake.py ({time.strftime('%Y-%m-%d %H:%M')}, load "
          f"{os.getloadavg()[0]:.1f}): {args.rules} rules")
    for name, r in rows.items():
        extra = f", cluster start {r['cluster_start_s']:.1f} s" if "cluster_start_s" in r else ""
        print(f"{name:10s} {r['seconds']:8.1f} s  {args.rules / r['seconds']:6.2f} rules/s  "
              f"{r['batch_jobs']} batch jobs{extra}")
    if len(rows) == 2:
        print(f"slurm / hpcsched: {rows['slurm']['seconds'] / rows['hpcsched']['seconds']:.2f}x")


if __name__ == "__main__":
    main()
