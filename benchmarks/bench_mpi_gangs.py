"""Gangs (tasks holding ``ranks=N`` worker ranks) against starting each MPI program alone.

    python benchmarks/bench_mpi_gangs.py [--gangs 500] [--members 100] [--work 0.05]
        [--efficiency-work 2.0] [--repeat 5] [--srun-steps 20] [--baseline DIR]

One run measures, on this machine (each sub-run a process tree of its own, ended with it):

* **Gang formation**: no-op gangs of 2, 4 and 8 ranks per second under ``mpiexec -n 9
  python -m hpcsched --nthreads 1`` (each makes its communicator, ``get_task_comm()``, and
  returns; from the first submit to the last result, after a warm-up gang), against one
  ``mpiexec -n R`` per member (an mpi4py program that only initializes and barriers), and
  against ``srun -n R`` steps on the emulated nodes (``ci/nodes``; skipped without their
  SLURM).
* **An ensemble** of ``--members`` members of 4 ranks, each a compute-bound mpi4py program
  (ten rounds of a pure-Python loop of ``--work`` seconds and an ``Allreduce``): as gang
  tasks in one job, against the same members run by ``mpiexec -n 4`` one after another,
  and by a shell loop of background ``mpiexec -n 4`` (two at a time: the 8 worker slots
  of the gang job).
* **Compute efficiency** of one gang of 4 against the same program under its own
  ``mpiexec -n 4``: the time of the program's rounds (between two barriers, the same
  loop count in both) in each. ``--repeat`` rounds, each running the direct program and
  the gang once, back to back, first one then the other by turns (a load that rises or
  falls steadily favours neither). Each round gives one ratio, direct / gang; the
  figure is the median of the ratios, with their smallest and largest (and quartiles from
  four rounds on), and the machine's 1-minute load at each round. A ratio pairs two runs
  close in time, so a load that changes between rounds cancels out (the smallest time of
  one kind over the smallest of the other would pair runs far apart and mostly measure
  which got the quietest moment). The gang's job has a fifth process (rank 0: scheduler
  and script, idle meanwhile) on the same cores.
  ``--baseline DIR`` also runs the gang on the hpcsched checkout in ``DIR`` (its own
  copy of this file) in each round: a change's effect in the same run.

The inner modes (``--inner ...``) are what the sub-runs execute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
SLURM_CONF = os.path.join(
    os.environ.get("BATCH_STATE_DIR", "/var/tmp/hpcsched-batch"), "slurm-nodes", "slurm.conf"
)


# ---------------------------------------------------------------- the MPI programs
def rounds(comm, work: float, n_rounds: int = 10) -> float:
    """The member program: ``n_rounds`` of ``work`` seconds of arithmetic (a loop sized
    once per process) each followed by an Allreduce; the seconds between two barriers."""
    import numpy as np

    n = _loop_size(work)
    comm.Barrier()
    t0 = time.perf_counter()
    total = np.zeros(1)
    for _ in range(n_rounds):
        s = 0.0
        for i in range(n):
            s += i * 0.5
        part = np.array([s])
        comm.Allreduce(part, total)
    comm.Barrier()
    return time.perf_counter() - t0


_sizes: dict[float, int] = {}


def _loop_size(work: float) -> int:
    """Iterations of the loop for ``work`` seconds on an idle core (measured here once, so
    that every member of a run does the same arithmetic: a fixed count, fixed per run)."""
    n = _sizes.get(work)
    if n is None:
        n = int(os.environ.get("BENCH_LOOP", "0")) or 0
        if not n:
            t0 = time.perf_counter()
            s = 0.0
            for i in range(200_000):
                s += i * 0.5
            n = int(200_000 * work / max(time.perf_counter() - t0, 1e-6))
        _sizes[work] = n
    return n


def inner_member(ns: argparse.Namespace) -> None:
    from mpi4py import MPI

    took = rounds(MPI.COMM_WORLD, ns.work)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print("RESULT " + json.dumps({"rounds_s": took}), flush=True)


def inner_noop(ns: argparse.Namespace) -> None:
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()


def gang_noop(i):
    import hpcsched

    return hpcsched.get_task_comm().Get_size()


def gang_member(work):
    import hpcsched

    return rounds(hpcsched.get_task_comm(), work)


def inner_formation(ns: argparse.Namespace) -> None:
    from hpcsched import Client

    with Client() as client:
        client.submit(gang_noop, -1, ranks=ns.ranks).result(timeout=60)  # warm-up
        t0 = time.perf_counter()
        sizes = client.gather(client.map(gang_noop, range(ns.gangs), ranks=ns.ranks), timeout=600)
        took = time.perf_counter() - t0
        assert sizes == [ns.ranks] * ns.gangs
        print("RESULT " + json.dumps({"gangs_per_s": ns.gangs / took}), flush=True)


def inner_ensemble(ns: argparse.Namespace) -> None:
    from hpcsched import Client

    with Client() as client:
        client.submit(gang_noop, -1, ranks=4).result(timeout=60)  # warm-up
        t0 = time.perf_counter()
        futures = client.map(gang_member, [ns.work] * ns.members, ranks=4, pure=False)
        took_each = client.gather(futures, timeout=3600)
        took = time.perf_counter() - t0
        print("RESULT " + json.dumps({"seconds": took, "rounds_s": took_each}), flush=True)


# ---------------------------------------------------------------- the driver
def run(cmd: list[str], env: dict | None = None, timeout: float = 3600) -> list[dict]:
    from _launch import launch

    return launch(cmd, timeout, env=env)[0]


def hpcsched_job(nprocs: int, *args: str, checkout: str | None = None) -> list[dict]:
    """``args`` run under ``mpiexec -n nprocs python -m hpcsched``: this checkout's, or the
    one in ``checkout`` (its package first on the path, its copy of this file; ``-P``:
    not the working directory's, which ``-m`` would put first)."""
    here, env, isolate = HERE, None, []
    if checkout is not None:
        here = os.path.join(checkout, "benchmarks", os.path.basename(HERE))
        env = {**os.environ, "PYTHONPATH": checkout}
        isolate = ["-P"]
    return run(
        [
            "mpiexec",
            "-n",
            str(nprocs),
            sys.executable,
            *isolate,
            "-m",
            "hpcsched",
            "--nthreads",
            "1",
            here,
            *args,
        ],
        env=env,
    )


def per_second(count: int, cmd: list[str], env: dict | None = None) -> float:
    """Runs of ``cmd`` per second, ``count`` one after another."""
    t0 = time.perf_counter()
    for _ in range(count):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=300, env=env)
    return count / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--inner", default=None)
    p.add_argument("--gangs", type=int, default=500)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--members", type=int, default=100)
    p.add_argument("--work", type=float, default=0.05)
    p.add_argument("--efficiency-work", type=float, default=2.0)
    p.add_argument("--mpiexec-runs", type=int, default=20)
    p.add_argument("--srun-steps", type=int, default=20)
    p.add_argument("--repeat", type=int, default=5,
                   help="efficiency: rounds, each one run of every kind (median ratio)")
    p.add_argument("--parts", default="formation,ensemble,efficiency")
    p.add_argument("--baseline", default=None,
                   help="efficiency: also run the gang on the hpcsched checkout in this dir")
    ns = p.parse_args()
    if ns.inner is not None:
        {
            "member": inner_member,
            "noop": inner_noop,
            "formation": inner_formation,
            "ensemble": inner_ensemble,
        }[ns.inner](ns)
        return
    sys.path.insert(0, os.path.dirname(HERE))
    from _launch import compile_package

    compile_package()
    # one loop size for every process of the run: the same arithmetic in each member
    os.environ["BENCH_LOOP"] = str(_loop_size(ns.work))
    slurm = shutil.which("srun") and os.path.exists(SLURM_CONF)
    report: dict = {"formation": {}, "ensemble": {}, "efficiency": {}}
    parts = ns.parts.split(",")
    for r in (2, 4, 8) if "formation" in parts else ():
        gangs = hpcsched_job(
            9,
            "--inner",
            "formation",
            "--ranks",
            str(r),
            "--gangs",
            str(ns.gangs if r == 2 else ns.gangs // 2),
        )[0]["gangs_per_s"]
        direct = per_second(
            ns.mpiexec_runs, ["mpiexec", "-n", str(r), sys.executable, HERE, "--inner", "noop"]
        )
        row = {"gangs_per_s": round(gangs, 1), "mpiexec_per_s": round(direct, 2)}
        if slurm:
            env = {**os.environ, "SLURM_CONF": SLURM_CONF}
            row["srun_steps_per_s"] = round(
                per_second(
                    ns.srun_steps,
                    [
                        "srun",
                        "-p",
                        "multi",
                        "-n",
                        str(r),
                        "--overcommit",
                        "--mpi=pmi2",
                        "--time=5",
                        sys.executable,
                        HERE,
                        "--inner",
                        "noop",
                    ],
                    env,
                ),
                2,
            )
        report["formation"][r] = row
        print(f"formation ranks={r}: {row}", file=sys.stderr, flush=True)
    if "ensemble" in parts:
        report["ensemble"] = ensemble(ns)
    if "efficiency" in parts:
        report["efficiency"] = efficiency(ns)
    print("BENCH " + json.dumps(report), flush=True)


def ensemble(ns: argparse.Namespace) -> dict:
    """The members as gangs in one job, by mpiexec one after another, by a shell loop."""
    member = [sys.executable, HERE, "--inner", "member", "--work", str(ns.work)]
    res = hpcsched_job(
        9, "--inner", "ensemble", "--members", str(ns.members), "--work", str(ns.work)
    )[0]
    t0 = time.perf_counter()
    for _ in range(ns.members):
        run(["mpiexec", "-n", "4", *member])
    one_by_one = time.perf_counter() - t0
    loop = (
        f"for i in $(seq {ns.members}); do mpiexec -n 4 {' '.join(member)} >/dev/null & "
        "if (( i % 2 == 0 )); then wait; fi; done; wait"
    )
    t0 = time.perf_counter()
    subprocess.run(["bash", "-c", loop], check=True, timeout=3600)
    shell_loop = time.perf_counter() - t0
    out = {
        "members": ns.members,
        "work_per_round_s": ns.work,
        "gangs_s": round(res["seconds"], 2),
        "mpiexec_one_after_another_s": round(one_by_one, 2),
        "shell_loop_two_at_a_time_s": round(shell_loop, 2),
    }
    print(f"ensemble: {out}", file=sys.stderr, flush=True)
    return out


def efficiency(ns: argparse.Namespace) -> dict:
    """One gang of 4 (in a job of 4 worker ranks) against the same program under its own
    mpiexec -n 4 (and the gang on ``ns.baseline``'s checkout): ``ns.repeat`` rounds, each
    running every kind once, back to back, in an order that turns each round (so that a
    load rising or falling through a round favours none); each round's ratio direct /
    gang, whose median and spread are the figures (module docstring)."""
    import statistics

    os.environ.pop("BENCH_LOOP", None)  # measured for this work, not the ensemble's
    os.environ["BENCH_LOOP"] = str(_loop_size(ns.efficiency_work))
    work = str(ns.efficiency_work)
    job = ("--inner", "ensemble", "--members", "1", "--work", work)
    kinds = {
        "mpiexec": lambda: run(["mpiexec", "-n", "4", sys.executable, HERE, "--inner",
                                "member", "--work", work])[0]["rounds_s"],
        "gang": lambda: hpcsched_job(5, *job)[0]["rounds_s"][0],
    }
    if ns.baseline:
        kinds["baseline_gang"] = lambda: hpcsched_job(
            5, *job, checkout=ns.baseline)[0]["rounds_s"][0]
    runs: dict[str, list[float]] = {name: [] for name in kinds}
    loads = []
    for i in range(ns.repeat):
        order = list(kinds) if i % 2 == 0 else list(reversed(kinds))
        loads.append(round(os.getloadavg()[0], 2))
        for name in order:
            runs[name].append(kinds[name]())
    out: dict = {f"{name}_rounds_s": [round(x, 3) for x in xs] for name, xs in runs.items()}
    out["load_1min_at_each_round"] = loads
    for name, xs in runs.items():
        if name == "mpiexec":
            continue
        ratios = sorted(d / g for d, g in zip(runs["mpiexec"], xs, strict=True))
        out[f"{name}_efficiency_median"] = round(statistics.median(ratios), 3)
        out[f"{name}_efficiency_min_max"] = [round(ratios[0], 3), round(ratios[-1], 3)]
        if len(ratios) >= 4:
            q = statistics.quantiles(ratios, n=4)
            out[f"{name}_efficiency_quartiles"] = [round(q[0], 3), round(q[2], 3)]
    print(f"efficiency: {out}", file=sys.stderr, flush=True)
    return out

if __name__ == "__main__":
    main()
