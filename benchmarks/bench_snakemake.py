"""A Snakemake workflow of short rules: through the hpcsched executor plugin on a
LocalCluster and on a SLURMCluster of 2 batch jobs, against Snakemake's SLURM executor
(a batch job per rule) on the same SLURM and Snakemake's own local executor, in one run.

    python benchmarks/bench_snakemake.py [--rules 500] [--slurm-rules N]
        [--systems local,hpcsched,slurm,snakemake-local] [--fresh-process]

Needs snakemake, snakemake-executor-plugin-slurm and
plugins/snakemake-executor-plugin-hpcsched installed (Snakemake finds its plugins among
the installed packages: not editable, or with ``--config-settings
editable_mode=compat``), and a SLURM whose partition ``--partition``
(default debug) runs jobs here. The workflow: ``--rules`` jobs of a rule writing one
small file each, and ``all``. Timed: the ``snakemake`` command, from its start to its
exit (the clusters' workers are started and have joined before; their start-up is
printed apart). Each road runs ``--workers`` jobs at a time (2: one thread on each of 2
workers, 2 one-core batch jobs, ``--cores 2`` for the local executor) except the SLURM
executor, which runs as many as SLURM places (every core of the partition's nodes).
``--slurm-rules`` gives the SLURM executor a smaller workflow (a batch job per rule can
take long); rules/s compares the roads then. The SLURM executor runs with
``--slurm-status-command squeue`` and ``--slurm-no-account`` (a SLURM without accounting
storage, as a test machine). ``--fresh-process`` adds the plugin's
``--hpcsched-fresh-process`` road (a ``python -m snakemake`` command task per job) on
the LocalCluster.
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
    """Seconds the ``snakemake`` command ``cmd`` took to make ``rules`` outputs."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd + ["--jobs", "1000", "--config", f"count={rules}"], cwd=cwd,
                       capture_output=True, text=True, timeout=3600, env=env,
                       stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    done = len(os.listdir(os.path.join(cwd, "out"))) if os.path.isdir(os.path.join(cwd, "out")) else 0
    if r.returncode != 0 or done != rules:
        raise RuntimeError(f"{cmd[:3]}: exit {r.returncode}, {done}/{rules} outputs\n{r.stderr[-2000:]}")
    return dt


def through_plugin(cluster, cwd: str, rules: int, workers: int, t0: float,
                   *extra: str) -> dict:
    """The workflow through the hpcsched plugin on ``cluster``, once its workers joined."""
    from hpcsched import Client

    with Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(workers, timeout=300)
        start = time.perf_counter() - t0
        env = dict(os.environ)
        if cluster.security and cluster.security.secret:
            env["HPCSCHED_SECRET"] = cluster.security.secret_hex()
        dt = run([snakemake_exe(), "--executor", "hpcsched", "--hpcsched-address",
                  cluster.scheduler_address, *extra], cwd, rules, env)
    return {"seconds": dt, "rules": rules, "cluster_start_s": start}


def bench_hpcsched(args: argparse.Namespace) -> dict:
    from hpcsched.jobqueue.clusters import SLURMCluster

    cwd = workflow(args.rules)
    t0 = time.perf_counter()
    cluster = SLURMCluster(cores=1, processes=1, memory="500MB", walltime="01:00:00",
                           queue=args.partition, job_name=JOB_NAME,
                           log_directory=os.path.join(cwd, "logs"),
                           job_script_prologue=[f"export PYTHONPATH={_checkout.REPO}"])
    try:
        cluster.scale(jobs=args.workers)
        row = through_plugin(cluster, cwd, args.rules, args.workers, t0)
        return {**row, "batch_jobs": len(cluster.jobs)}
    finally:
        cluster.close()
        shutil.rmtree(cwd, ignore_errors=True)


def bench_local(args: argparse.Namespace, *extra: str) -> dict:
    from hpcsched import LocalCluster

    cwd = workflow(args.rules)
    t0 = time.perf_counter()
    try:
        with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster:
            return {**through_plugin(cluster, cwd, args.rules, args.workers, t0, *extra),
                    "batch_jobs": 0}
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def bench_fresh(args: argparse.Namespace) -> dict:
    return bench_local(args, "--hpcsched-fresh-process")


def bench_snakemake_local(args: argparse.Namespace) -> dict:
    cwd = workflow(args.rules)
    try:
        dt = run([snakemake_exe(), "--cores", str(args.workers)], cwd, args.rules)
        return {"seconds": dt, "rules": args.rules, "batch_jobs": 0}
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def bench_slurm(args: argparse.Namespace) -> dict:
    rules = args.slurm_rules or args.rules
    cwd = workflow(rules)
    try:
        dt = run([snakemake_exe(), "--executor", "slurm", "--default-resources",
                  f"slurm_partition={args.partition}", "mem_mb=100", "runtime=5",
                  "--slurm-no-account", "--slurm-status-command", "squeue",
                  "--slurm-jobname-prefix", SLURM_PREFIX,
                  "--slurm-init-seconds-before-status-checks", "1", "--latency-wait", "5"],
                 cwd, rules)
        return {"seconds": dt, "rules": rules, "batch_jobs": rules}
    finally:
        cancel_own_jobs()
        shutil.rmtree(cwd, ignore_errors=True)


def cancel_own_jobs() -> None:
    """The executor cancels its jobs when it fails; a job it had no time to cancel
    (snakemake killed by the timeout) is ended here, found by the prefix of its name."""
    q = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                       timeout=60, check=False)
    ids = [i for i, _, name in (line.partition(" ") for line in q.stdout.splitlines())
           if name.startswith(SLURM_PREFIX + "_")]
    if ids:
        subprocess.run(["scancel", *ids], check=False, capture_output=True, timeout=60)


JOB_NAME = "bench-smk-hpcsched"
SLURM_PREFIX = "bench-smk-slurm"  # the SLURM executor's job names: <prefix>_<run id>
SYSTEMS = {"local": bench_local, "hpcsched": bench_hpcsched, "slurm": bench_slurm,
           "snakemake-local": bench_snakemake_local, "fresh-process": bench_fresh}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rules", type=int, default=500)
    p.add_argument("--slurm-rules", type=int, default=0,
                   help="rules of the SLURM executor's workflow (default: --rules)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--partition", default="debug")
    p.add_argument("--systems", default="local,hpcsched,slurm,snakemake-local")
    p.add_argument("--fresh-process", action="store_true",
                   help="also the plugin's --hpcsched-fresh-process road on a LocalCluster")
    args = p.parse_args()
    names = args.systems.split(",") + (["fresh-process"] if args.fresh_process else [])
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}: choose among {', '.join(SYSTEMS)}")
    rows = {}
    for name in names:
        print(f"... {name} ({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})",
              file=sys.stderr, flush=True)
        rows[name] = SYSTEMS[name](args)
        print(f"    {rows[name]['seconds']:.1f} s", file=sys.stderr, flush=True)
    print(f"\n# benchmarks/bench_snakemake.py ({time.strftime('%Y-%m-%d %H:%M')}, load "
          f"{os.getloadavg()[0]:.1f}): {args.rules} rules, {args.workers} at a time")
    for name, r in rows.items():
        extra = f", cluster start {r['cluster_start_s']:.1f} s" if "cluster_start_s" in r else ""
        print(f"{name:16s} {r['rules']:5d} rules {r['seconds']:8.1f} s  "
              f"{r['rules'] / r['seconds']:7.2f} rules/s  {r['batch_jobs']} batch jobs{extra}")
    if "slurm" in rows and "hpcsched" in rows:
        ratio = ((rows["hpcsched"]["rules"] / rows["hpcsched"]["seconds"])
                 / (rows["slurm"]["rules"] / rows["slurm"]["seconds"]))
        print(f"hpcsched / slurm executor, rules/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
