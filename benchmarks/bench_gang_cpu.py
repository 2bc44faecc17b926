"""Who takes the CPU while one gang of 4 computes: the CPU seconds and wake-ups of every rank.

    python benchmarks/bench_gang_cpu.py [--nprocs 9] [--work 0.5] [--repeat 3]

A gang's members compute in step (each round ends in an ``Allreduce``), so any CPU the
other processes of the job take on the same cores slows every member (see
``hpcsched/hpc/gang.py``). Wall-clock times on a shared machine say little about that;
what a process takes does not depend on the machine's load. So this measures, between
the two barriers around the gang's rounds (``bench_mpi_gangs.rounds``: ten rounds of
``--work`` seconds of arithmetic and an ``Allreduce``):

* **per rank** of ``mpiexec -n NPROCS python -m hpcsched --nthreads 1`` (rank 0 the
  scheduler with the script, four gang members, the other worker ranks idle): CPU seconds
  (time on a CPU, ``/proc/<pid>/task/*/schedstat``, counted in nanoseconds) and voluntary
  context switches per second (wake-ups, ``/proc/<pid>/task/*/status``), and the same per
  thread (named by the rank's Python threads, asked before the gang starts);
* the same program under its own ``mpiexec -n 4`` (no scheduler, no idle ranks).

The figures to compare between two commits are ``others_cpu_per_s``: the CPU seconds of
every process but the members per second of the rounds, and the members'
``members_overhead_cpu_per_s`` (their threads other than the one computing), with the
others' wake-ups per second. All are counted by the kernel, not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mpi_gangs import rounds  # noqa: E402

HERE = os.path.abspath(__file__)


def thread_counters(pid: int) -> dict[int, tuple[float, int]]:
    """``{tid: (cpu seconds, voluntary context switches)}`` of the process ``pid``."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu = int(f.read().split()[0]) / 1e9  # ns on a CPU (stat's are 10 ms ticks)
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                vcs = next(int(line.split()[1]) for line in f
                           if line.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration, IndexError, ValueError):
            continue
        out[int(tid)] = (cpu, vcs)
    return out


def siblings() -> list[int]:
    """The rank processes of this job on this node: the children of this rank's parent
    (hydra's proxy), this one included."""
    import psutil

    return [p.pid for p in psutil.Process(os.getppid()).children()]


def thread_names() -> dict:
    """This process's Python threads ``{tid: name}``, and its pid."""
    return {"pid": os.getpid(),
            "names": {t.native_id: t.name for t in threading.enumerate()}}


def measured(comm, work: float, names: dict[int, dict]) -> dict:
    """``rounds`` on ``comm``; its rank 0 reads every sibling's counters just after the
    first barrier and just before the last (the barriers are ``rounds``'s own)."""
    me = comm.Get_rank()
    pids = siblings() if me == 0 else []
    box: dict = {}

    class Probe:  # reads the counters at the barriers, on rank 0 only
        def __init__(self, comm):
            self._comm = comm
            self._n = 0

        def __getattr__(self, name):
            return getattr(self._comm, name)

        def Barrier(self):
            if self._n == 1 and me == 0:
                box["after"] = {pid: thread_counters(pid) for pid in pids}
                box["t1"] = time.monotonic()
            self._comm.Barrier()
            if self._n == 0 and me == 0:
                box["before"] = {pid: thread_counters(pid) for pid in pids}
                box["t0"] = time.monotonic()
            self._n += 1

    took = rounds(Probe(comm), work)
    if me != 0:
        return {"rounds_s": took}
    seconds = box["t1"] - box["t0"]
    procs = {}
    for pid in pids:
        before, after = box["before"].get(pid, {}), box["after"].get(pid, {})
        label = names.get(pid, {}).get("names", {})
        threads = {}
        for tid, (cpu, vcs) in after.items():
            cpu0, vcs0 = before.get(tid, (0.0, 0))
            name = label.get(tid) or label.get(str(tid)) or ("main" if tid == pid else "?")
            threads[f"{name}:{tid}"] = (round(cpu - cpu0, 4), round((vcs - vcs0) / seconds, 1))
        procs[pid] = {"cpu_s": round(sum(c for c, _ in threads.values()), 4),
                      "wakeups_per_s": round(sum(w for _, w in threads.values()), 1),
                      "threads": threads}
    return {"rounds_s": took, "seconds": seconds, "pids": procs}


def gang_task(work: float, names: dict) -> dict:
    import hpcsched

    return measured(hpcsched.get_task_comm(), work, {int(k): v for k, v in names.items()})


def inner_gang(ns: argparse.Namespace) -> None:
    from hpcsched import Client

    with Client() as client:
        client.submit(gang_task, 0.01, {}, ranks=4, pure=False).result(timeout=120)  # warm-up
        ran = client.run(thread_names)
        names = {v["pid"]: v for v in ran.values()}
        names[os.getpid()] = thread_names()
        members = {v["pid"]: address for address, v in ran.items()}  # for the report's roles
        res = client.submit(gang_task, ns.work, names, ranks=4, pure=False).result(timeout=600)
        res["roles"] = {pid: "scheduler+script" if pid == os.getpid() else members.get(pid, "?")
                        for pid in res["pids"]}
        print("RESULT " + json.dumps(res), flush=True)


def inner_direct(ns: argparse.Namespace) -> None:
    from mpi4py import MPI

    res = measured(MPI.COMM_WORLD, ns.work, {})
    if MPI.COMM_WORLD.Get_rank() == 0:
        res["roles"] = {pid: "direct" for pid in res["pids"]}
        print("RESULT " + json.dumps(res), flush=True)


def summary(res: dict, member_pids: set[int] | None) -> dict:
    """Members: the processes that computed (the four busiest); the others' CPU, and the
    members' CPU outside their computing thread."""
    procs = res["pids"]
    if member_pids is None:
        member_pids = set(sorted(procs, key=lambda p: -procs[p]["cpu_s"])[:4])
    others = sum(v["cpu_s"] for p, v in procs.items() if p not in member_pids)
    overhead = 0.0
    for p in member_pids:
        cpus = sorted((c for c, _ in procs[p]["threads"].values()), reverse=True)
        overhead += sum(cpus[1:])
    seconds = res["seconds"]
    return {"rounds_s": round(res["rounds_s"], 3), "others_cpu_s": round(others, 4),
            "others_cpu_per_s": round(others / seconds, 5),
            "members_overhead_cpu_per_s": round(overhead / seconds, 5),
            "members_cpu_s": round(sum(procs[p]["cpu_s"] for p in member_pids), 3),
            "others_wakeups_per_s": round(sum(v["wakeups_per_s"] for p, v in procs.items()
                                              if p not in member_pids), 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--inner", default=None)
    p.add_argument("--nprocs", type=int, default=9)
    p.add_argument("--work", type=float, default=0.5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--detail", action="store_true", help="print every rank's threads")
    ns = p.parse_args()
    if ns.inner is not None:
        {"gang": inner_gang, "direct": inner_direct}[ns.inner](ns)
        return
    from _launch import compile_package, launch
    from bench_mpi_gangs import _loop_size

    compile_package()
    os.environ["BENCH_LOOP"] = str(_loop_size(ns.work))  # the same arithmetic in every run
    out: dict = {"gang": [], "direct": []}
    for _ in range(ns.repeat):  # alternating, so that the machine's load meets both alike
        for name, cmd in (
            ("gang", ["mpiexec", "-n", str(ns.nprocs), sys.executable, "-m", "hpcsched",
                      "--nthreads", "1", HERE, "--inner", "gang", "--work", str(ns.work)]),
            ("direct", ["mpiexec", "-n", "4", sys.executable, HERE, "--inner", "direct",
                        "--work", str(ns.work)]),
        ):
            res = launch(cmd, 900)[0][0]
            out[name].append(summary(res, None))
            if ns.detail:
                for pid, v in sorted(res["pids"].items(), key=lambda kv: -kv[1]["cpu_s"]):
                    print(name, res["roles"].get(pid), v["cpu_s"], v["wakeups_per_s"],
                          {k: t for k, t in v["threads"].items() if t[0] or t[1]},
                          file=sys.stderr)
            print(name, out[name][-1], file=sys.stderr, flush=True)
    print("BENCH " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
