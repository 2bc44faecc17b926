# ruff: noqa: I001 - _checkout is imported first, before anything that imports hpcsched
"""MPI mode against dask-mpi and mpi4py.futures, side by side in one run.

    python benchmarks/bench_mpi.py [--tasks 10000] [--leaves 8192] [--sizes 64,512]
                                   [--repeat 2] [--idle 10] [--first 3] [--json FILE]

The driver (no MPI) launches every sub-run itself, one after the other, and
prints one table with ratios. Sub-runs (4 ranks on this 2-core machine):

* throughput: ``map`` of ``--tasks`` no-op tasks, gathered; and the
  ``--leaves``-leaf binary tree reduction (leaves are no-op tasks, inner nodes
  add: 2 x leaves - 1 tasks) submitted as ONE graph. Best of ``--repeat``
  after a warm-up map.

  - hpcsched: ``mpiexec -n 4 python -m hpcsched bench_mpi.py --role hs-throughput``
    (rank 0: scheduler + client, 3 worker ranks);
  - dask-mpi: ``mpiexec -n 4 python bench_mpi.py --role dm-throughput``
    (``dask_mpi.initialize()``: rank 0 scheduler, rank 1 client, 2 workers, TCP);
  - mpi4py.futures: ``mpiexec -n 3 python -m mpi4py.futures bench_mpi.py
    --role mf-throughput``, ``map(..., chunksize=1)``. It has no task graphs:
    the tree runs as one ``map`` per level, each level's results going back to
    the master before the next level starts.

* transfer (hpcsched job, 4 ranks): a task on worker A makes a float64 array
  of ``--sizes`` MiB, a task on worker B takes it as an argument; time from
  the producer's end to the consumer's start (both clocks are this machine's),
  which includes the scheduler's round trip. In the same job, interleaved per
  repetition, the raw baseline between the same two ranks: a task on A does a
  blocking mpi4py ``Send``, a task on B ``Recv``s into a fresh ``numpy.empty``
  (raw-fresh) or into one reused buffer (raw-reused), timed on B from its
  "go" message to the end of ``Recv`` (as benchmarks/bench_mpi_transfer.py).

* idle: each system on 4 ranks after one task, CPU time (user + system) of
  every rank process over ``--idle`` seconds, measured by this driver (psutil).

* first result: from ``Popen(mpiexec ...)`` to the first task's result in the
  client (``time.time()`` on both sides), median of ``--first`` runs per system.

* sweep (``--only sweep``): parameter sweeps, the task farm's workload. A ``map`` of
  ``--sweep-sizes`` no-op elements (default 100,000; ``--sweep-sizes 100000,1000000``
  adds a million), gathered, on 4 ranks each: hpcsched (a bulk map over 3 worker
  ranks), mpi4py.futures (``mpiexec -n 4 -m mpi4py.futures``: 3 workers) with
  ``chunksize`` 1, 16 and 256, and ``concurrent.futures.ProcessPoolExecutor(3)`` with
  ``chunksize=16`` (no MPI: the same machine's processes). Wall time, best of
  ``--repeat``, and the CPU time of the submitting process (rank 0 / the driver) for
  the same best run. Then a sweep of ``--sweep-ms`` elements of a 1 ms task
  (``time.sleep(0.001)``) on hpcsched's 3 worker ranks, with its efficiency: ideal time
  (elements x the task's own measured duration on a worker / 3 workers) over measured,
  and against the nominal 1 ms.

hpcsched's modules are byte-compiled first, as an installed package's are
(``_launch.compile_package``). ``--only first`` runs the first-result part alone.

Before and after, in one run (hpcsched alone, throughput and sweep)::

    python benchmarks/bench_mpi.py --checkout <base> --checkout . --rounds 3 \
        --only throughput,sweep [--instructions] --leaves 4096 --tasks 5000 --sweep-ms 0

``--checkout`` (repeated, the first the base) runs hpcsched's sub-runs with each
checkout's package in turn (its root on ``PYTHONPATH`` and the working directory),
``--rounds`` times with the order alternated, this script's workloads for all. With
``--instructions`` rank 0 (scheduler and client) runs under valgrind's callgrind
(``_callgrind.py``), its instrumentation switched on around each timed workload alone:
instructions per task (per element for the sweep), the fewest of ``--repeat``, where
the wall clock of a loaded machine cannot resolve a few per cent. The worker ranks run
natively.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import operator
import os
import shlex
import statistics
import sys
import time

from _callgrind import Counter, missing_tools, valgrind
from _launch import timed  # benchmarks/ is on the path: the scripts run from it

HERE = os.path.abspath(__file__)


# ====================================================================== tasks
def noop(x):
    return x


def tree_graph(leaves: int) -> tuple[dict, tuple]:
    """``{key: (func, *args)}`` of the binary reduction; returns (graph, root key)."""
    dsk: dict = {("leaf", i): (noop, i) for i in range(leaves)}
    level, names = 0, [("leaf", i) for i in range(leaves)]
    while len(names) > 1:
        level += 1
        nxt = []
        for i in range(0, len(names) - 1, 2):
            key = ("add", level, i // 2)
            dsk[key] = (operator.add, names[i], names[i + 1])
            nxt.append(key)
        if len(names) % 2:
            nxt.append(names[-1])
        names = nxt
    return dsk, names[0]


def report(**result) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def package() -> str:
    """The checkout whose hpcsched this process runs (``--checkout`` checks it)."""
    import hpcsched

    return os.path.dirname(os.path.dirname(hpcsched.__file__))


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def fewest_instructions(args: argparse.Namespace, repeat: int, fn) -> int:
    """This process's instructions (it runs under callgrind: ``--callgrind-out``) of the
    cheapest of ``repeat`` runs of ``fn``."""
    counter = Counter(os.getpid(), args.callgrind_out)
    counts = []
    for _ in range(repeat):
        with counter.window() as counted:
            fn()
        counts.append(int(counted[0]))
    return min(counts)


# ====================================================================== sub-runs
def run_distributed_like(system: str, client, args: argparse.Namespace) -> None:
    """Throughput on a Client with dask.distributed's API (hpcsched or dask)."""
    n = args.tasks
    client.gather(client.map(noop, range(200), pure=False))  # warm-up: functions, connections
    expected = list(range(n))

    def do_map() -> None:
        futures = client.map(noop, range(n), pure=False)
        assert client.gather(futures) == expected

    dsk, root = tree_graph(args.leaves)
    total = args.leaves * (args.leaves - 1) // 2

    def do_tree() -> None:
        assert client.get(dsk, root) == total

    if args.callgrind_out:
        report(system=system, package=package(), map_instructions=fewest_instructions(args, args.repeat, do_map),
               tree_instructions=fewest_instructions(args, args.repeat, do_tree), map_tasks=n,
               tree_tasks=len(dsk), workers=len(client.scheduler_info()["workers"]))
        return
    t_map = best_of(args.repeat, do_map)
    t_tree = best_of(args.repeat, do_tree)
    report(system=system, map_s=t_map, map_tasks=n, tree_s=t_tree, tree_tasks=len(dsk),
           workers=len(client.scheduler_info()["workers"]),
           package=package() if system == "hpcsched" else None)


def role_hs_throughput(args: argparse.Namespace) -> None:
    from hpcsched import Client

    with Client() as client:
        run_distributed_like("hpcsched", client, args)


def role_dm_throughput(args: argparse.Namespace) -> None:
    import dask_mpi
    from distributed import Client

    dask_mpi.initialize(nthreads=1, dashboard=False, memory_limit=None,
                        interface=args.dask_interface or None)
    with Client() as client:
        client.wait_for_workers(2, timeout=60)
        run_distributed_like("dask-mpi", client, args)


def role_mf_throughput(args: argparse.Namespace) -> None:
    from mpi4py.futures import MPIPoolExecutor

    n = args.tasks
    with MPIPoolExecutor() as ex:
        list(ex.map(noop, range(200), chunksize=1))  # warm-up

        def do_map() -> None:
            assert list(ex.map(noop, range(n), chunksize=1)) == list(range(n))

        def do_tree() -> None:
            values = list(ex.map(noop, range(args.leaves), chunksize=1))
            while len(values) > 1:  # one map per level: no graphs in mpi4py.futures
                odd = [values[-1]] if len(values) % 2 else []
                values = list(ex.map(operator.add, values[0::2], values[1::2],
                                     chunksize=1)) + odd
            assert values[0] == args.leaves * (args.leaves - 1) // 2

        t_map = best_of(args.repeat, do_map)
        t_tree = best_of(args.repeat, do_tree)
        report(system="mpi4py.futures", map_s=t_map, map_tasks=n, tree_s=t_tree,
               tree_tasks=2 * args.leaves - 1, workers=ex._num_workers
               if hasattr(ex, "_num_workers") else None)


# ---------------------------------------------------------------- sweeps
def sleep_ms(x):
    time.sleep(0.001)
    return x


def sleep_cost(n: int) -> float:
    """Mean seconds of ``sleep_ms`` where it runs (sleep oversleeps by a little)."""
    t0 = time.perf_counter()
    for i in range(n):
        sleep_ms(i)
    return (time.perf_counter() - t0) / n


def role_hs_sweep(args: argparse.Namespace) -> None:
    from hpcsched import Client

    sizes = [int(x) for x in args.sweep_sizes.split(",") if x]
    out: dict = {"maps": {}}
    with Client() as client:
        workers = sorted(client.scheduler_info()["workers"])
        client.gather(client.map(noop, range(1000), pure=False))  # warm-up
        for n in sizes:
            expected = list(range(n))

            def do_map(n: int = n, expected: list = expected) -> None:
                futures = client.map(noop, range(n), pure=False)
                assert client.gather(futures) == expected
                del futures

            if args.callgrind_out:
                out["maps"][str(n)] = {"instructions": fewest_instructions(args, args.repeat,
                                                                           do_map)}
                continue
            wall, cpu = timed(args.repeat, do_map)
            out["maps"][str(n)] = {"wall": wall, "cpu": cpu}
        if args.sweep_ms:
            costs = client.gather([client.submit(sleep_cost, 300, workers=[w], pure=False)
                                   for w in workers])
            n = args.sweep_ms
            t0 = time.perf_counter()
            futures = client.map(sleep_ms, range(n), pure=False)
            assert client.gather(futures) == list(range(n))
            wall = time.perf_counter() - t0
            task = statistics.mean(costs)
            out["sweep"] = {"elements": n, "workers": len(workers), "wall": wall,
                            "task_s": task, "efficiency": n * task / len(workers) / wall,
                            "efficiency_nominal": n * 0.001 / len(workers) / wall}
    report(system="hpcsched", package=package(), **out)


def role_mf_sweep(args: argparse.Namespace) -> None:
    from mpi4py.futures import MPIPoolExecutor

    sizes = [int(x) for x in args.sweep_sizes.split(",") if x]
    out: dict = {}
    with MPIPoolExecutor() as ex:
        list(ex.map(noop, range(1000), chunksize=16))  # warm-up: every worker started
        for chunk in (1, 16, 256):
            for n in sizes:
                if chunk == 1 and n > args.sweep_chunk1_max:
                    continue  # minutes at this rate: behind --sweep-chunk1-max

                def do_map(n: int = n, chunk: int = chunk) -> None:
                    assert list(ex.map(noop, range(n), chunksize=chunk)) == list(range(n))

                wall, cpu = timed(args.repeat, do_map)
                out[f"{chunk}/{n}"] = {"wall": wall, "cpu": cpu}
    report(system="mpi4py.futures", maps=out)


def role_pp_sweep(args: argparse.Namespace) -> None:
    from concurrent.futures import ProcessPoolExecutor

    sizes = [int(x) for x in args.sweep_sizes.split(",") if x]
    out: dict = {}
    with ProcessPoolExecutor(3) as ex:
        list(ex.map(noop, range(1000), chunksize=16))
        for n in sizes:
            def do_map(n: int = n) -> None:
                assert list(ex.map(noop, range(n), chunksize=16)) == list(range(n))

            wall, cpu = timed(args.repeat, do_map)
            out[str(n)] = {"wall": wall, "cpu": cpu}
    report(system="ProcessPoolExecutor", maps=out)


# ---------------------------------------------------------------- transfer tasks
def produce(nbytes: int):
    import numpy as np

    arr = np.ones(nbytes // 8, dtype=np.float64)  # touched: a real result
    return arr, time.time()


def consume(pair) -> tuple[float, bool]:
    started = time.time()
    arr, produced = pair
    assert arr[-1] == 1.0
    return started - produced, bool(arr.flags.owndata)


def raw_send(nbytes: int, dest: int, tag: int) -> int:
    import numpy as np
    from mpi4py import MPI

    data = np.ones(nbytes // 8, dtype=np.float64)
    go = np.zeros(1, dtype=np.uint8)
    MPI.COMM_WORLD.Recv(go, dest, tag)  # blocking: the raw baseline, as in bench_mpi_transfer
    MPI.COMM_WORLD.Send(data, dest, tag + 1)
    return 0


def raw_recv(nbytes: int, source: int, tag: int, reuse: bool) -> float:
    import numpy as np
    from mpi4py import MPI

    n = nbytes // 8
    buffers = sys.__dict__.setdefault("_bench_mpi_buffers", {})  # survives between tasks
    if reuse and n not in buffers:
        buffers[n] = np.zeros(n, dtype=np.float64)  # touched once, as a long-lived buffer
    go = np.zeros(1, dtype=np.uint8)
    t0 = time.perf_counter()
    MPI.COMM_WORLD.Send(go, source, tag)
    arr = buffers[n] if reuse else np.empty(n, dtype=np.float64)
    MPI.COMM_WORLD.Recv(arr, source, tag + 1)
    dt = time.perf_counter() - t0
    assert arr[-1] == 1.0
    return dt


def rank_of(address: str) -> int:
    return int(address.rsplit("/", 1)[1])


def role_hs_transfer(args: argparse.Namespace) -> None:
    from hpcsched import Client

    sizes = [int(s) for s in args.sizes.split(",")]
    out: dict = {}
    with Client() as client:
        a, b = sorted(client.scheduler_info()["workers"])[:2]
        ra, rb = rank_of(a), rank_of(b)
        tag = 100
        for mib in sizes:
            nbytes = mib * 2**20
            times: dict[str, list[float]] = {"raw-fresh": [], "raw-reused": [], "hpcsched": []}
            reps = args.transfer_reps if mib < 256 else max(2, args.transfer_reps - 2)
            for rep in range(reps + 1):  # the first round is a warm-up
                for case in ("raw-fresh", "raw-reused", "hpcsched"):
                    if case == "hpcsched":
                        p = client.submit(produce, nbytes, workers=[a], pure=False)
                        c = client.submit(consume, p, workers=[b], pure=False)
                        dt, owndata = c.result(timeout=300)
                        assert not owndata, "the array was copied on its way"
                        del p, c
                    else:
                        tag += 2
                        s = client.submit(raw_send, nbytes, rb, tag, workers=[a], pure=False)
                        r = client.submit(raw_recv, nbytes, ra, tag, case == "raw-reused",
                                          workers=[b], pure=False)
                        dt = r.result(timeout=300)
                        s.result(timeout=60)
                        del s, r
                    if rep:
                        times[case].append(dt)
            out[str(mib)] = {case: statistics.median(v) for case, v in times.items()}
            out[str(mib)]["reps"] = reps
    report(system="hpcsched", transfer=out)


# ---------------------------------------------------------------- first result / idle
def role_hs_first(args: argparse.Namespace) -> None:
    from hpcsched import Client

    with Client() as client:
        client.submit(noop, 1).result()
        print(f"FIRST {time.time():.6f}", flush=True)
        idle(args)


def role_dm_first(args: argparse.Namespace) -> None:
    import dask_mpi
    from distributed import Client

    dask_mpi.initialize(nthreads=1, dashboard=False, memory_limit=None,
                        interface=args.dask_interface or None)
    with Client() as client:
        client.submit(noop, 1).result()
        print(f"FIRST {time.time():.6f}", flush=True)
        idle(args)


def role_mf_first(args: argparse.Namespace) -> None:
    from mpi4py.futures import MPIPoolExecutor

    with MPIPoolExecutor() as ex:
        ex.submit(noop, 1).result()
        print(f"FIRST {time.time():.6f}", flush=True)
        if args.idle_run:  # every worker has started (spawned lazily) and is idle
            list(ex.map(noop, range(50), chunksize=1))
        idle(args)


def idle(args: argparse.Namespace) -> None:
    if args.idle_run:
        print("READY", flush=True)
        time.sleep(args.idle + 1.0)  # the driver measures CPU meanwhile


ROLES = {
    "hs-throughput": role_hs_throughput, "dm-throughput": role_dm_throughput,
    "mf-throughput": role_mf_throughput, "hs-transfer": role_hs_transfer,
    "hs-first": role_hs_first, "dm-first": role_dm_first, "mf-first": role_mf_first,
    "hs-sweep": role_hs_sweep, "mf-sweep": role_mf_sweep, "pp-sweep": role_pp_sweep,
}


# ====================================================================== the driver
def command(system: str, role: str, nprocs: int, args: argparse.Namespace,
            extra: list[str] = ()) -> list[str]:
    py = sys.executable
    opts = ["--role", role, "--tasks", str(args.tasks), "--leaves", str(args.leaves),
            "--repeat", str(args.repeat), "--sizes", args.sizes, "--idle", str(args.idle),
            "--transfer-reps", str(args.transfer_reps), "--sweep-sizes", args.sweep_sizes,
            "--sweep-ms", str(args.sweep_ms), "--sweep-chunk1-max", str(args.sweep_chunk1_max),
            "--dask-interface", args.dask_interface, *extra]
    if system == "ProcessPoolExecutor":
        return [py, HERE, *opts]
    mpiexec = ["mpiexec", *shlex.split(args.mpiexec_args), "-n", str(nprocs)]
    if system == "hpcsched" and args.callgrind_out:  # rank 0 counted, the others native
        return [*mpiexec[:-2], "-n", "1", *valgrind(args.callgrind_out), py, "-m", "hpcsched",
                HERE, *opts, "--callgrind-out", args.callgrind_out, ":",
                "-n", str(nprocs - 1), py, "-m", "hpcsched", HERE, *opts]
    if system == "hpcsched":
        return [*mpiexec, py, "-m", "hpcsched", HERE, *opts]
    if system == "mpi4py.futures":
        return [*mpiexec, py, "-m", "mpi4py.futures", HERE, *opts]
    return [*mpiexec, py, HERE, *opts]


def launch(cmd: list[str], timeout: float, on_line=None) -> tuple[list[dict], str, float, float]:
    """Run ``cmd`` (see benchmarks/_launch.py); (RESULT dicts, stderr tail, start, FIRST)."""
    import _launch

    return _launch.launch(cmd, timeout, on_line)


def rank_processes(mark: str) -> list:
    """The rank processes of the sub-run marked ``mark``."""
    import _launch

    return _launch.rank_processes(mark, HERE)


def measure_idle(system: str, role: str, args: argparse.Namespace) -> dict:
    import psutil

    usage: dict = {}

    def on_line(line: str, mark: str) -> None:
        if line.strip() != "READY":
            return
        procs = rank_processes(mark)
        before = {p.pid: sum(p.cpu_times()[:2]) for p in procs}
        t0 = time.monotonic()
        time.sleep(args.idle)
        elapsed = time.monotonic() - t0
        for p in procs:
            try:
                usage[p.pid] = 100 * (sum(p.cpu_times()[:2]) - before[p.pid]) / elapsed
            except psutil.NoSuchProcess:
                pass

    launch(command(system, role, 4, args, ["--idle-run"]), 120, on_line)
    values = sorted(usage.values())
    return {"per_rank": values, "max": max(values), "mean": statistics.mean(values)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    p.add_argument("--idle-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--leaves", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=2, help="timed repetitions (best is kept)")
    p.add_argument("--sizes", default="64,512", help="transfer sizes in MiB")
    p.add_argument("--transfer-reps", type=int, default=5)
    p.add_argument("--idle", type=float, default=10.0, help="seconds of idleness measured")
    p.add_argument("--first", type=int, default=3, help="runs for the first-result latency")
    p.add_argument("--sweep-sizes", default="100000",
                   help="elements of the no-op sweeps (comma-separated)")
    p.add_argument("--sweep-ms", type=int, default=10_000,
                   help="elements of the 1 ms sweep (0: none)")
    p.add_argument("--sweep-chunk1-max", type=int, default=100_000,
                   help="largest sweep mpi4py.futures runs with chunksize=1")
    p.add_argument("--only", default="throughput,transfer,idle,first,sweep")
    p.add_argument("--systems", default="hpcsched,dask-mpi,mpi4py.futures")
    p.add_argument("--dask-interface", default="",
                   help="dask-mpi's interface= (across nodes it must be named: eth0)")
    p.add_argument("--mpiexec-args", default="",
                   help="more arguments of every mpiexec, placing the ranks (across nodes: "
                        "'-launcher ssh -launcher-exec ci/nodes/nsssh -iface hsbr0 "
                        "-hosts 10.77.0.11,10.77.0.12,10.77.0.13')")
    p.add_argument("--json", default=None, help="also write all figures to this file")
    p.add_argument("--checkout", action="append",
                   help="a checkout whose package to measure (repeat; the first is the base)")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --checkout: rounds over the checkouts, the order alternated")
    p.add_argument("--instructions", action="store_true",
                   help="with --checkout: count rank 0's instructions (valgrind) instead")
    p.add_argument("--callgrind-out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role:
        ROLES[args.role](args)
        return
    if args.checkout:
        if args.instructions and missing_tools():
            p.error(f"--instructions: {', '.join(missing_tools())} not on the PATH")
        if args.rounds < 1:
            p.error("--rounds must be at least 1")
        by_checkout(args)
        return
    if args.instructions:
        p.error("--instructions counts with --checkout only")

    import _launch

    _launch.compile_package()  # as installed: see _launch.compile_package
    only = set(args.only.split(","))
    systems = [(s, short, n) for s, short, n in
               [("hpcsched", "hs", 4), ("dask-mpi", "dm", 4), ("mpi4py.futures", "mf", 3)]
               if s in args.systems.split(",")]
    figures: dict = {"command": " ".join(sys.argv), "time": time.strftime("%Y-%m-%d %H:%M")}
    if "throughput" in only:
        figures["throughput"] = {}
        for system, short, n in systems:
            print(f"... throughput: {system} on {n} ranks", file=sys.stderr, flush=True)
            [res], _, _, _ = launch(command(system, f"{short}-throughput", n, args), 900)
            figures["throughput"][system] = res
    if "sweep" in only:
        figures["sweep"] = {}
        for system, role in (("hpcsched", "hs-sweep"), ("mpi4py.futures", "mf-sweep"),
                             ("ProcessPoolExecutor", "pp-sweep")):
            print(f"... sweep: {system}", file=sys.stderr, flush=True)
            [res], _, _, _ = launch(command(system, role, 4, args), 3600)
            figures["sweep"][system] = res
    if "transfer" in only:
        print("... transfer: hpcsched vs raw mpi4py", file=sys.stderr, flush=True)
        [res], _, _, _ = launch(command("hpcsched", "hs-transfer", 4, args), 900)
        figures["transfer"] = res["transfer"]
    if "idle" in only:
        figures["idle"] = {}
        for system, short, _ in systems:
            print(f"... idle: {system} on 4 ranks", file=sys.stderr, flush=True)
            figures["idle"][system] = measure_idle(system, f"{short}-first", args)
    if "first" in only:
        figures["first"] = {}
        for system, short, _ in systems:
            print(f"... first result: {system}", file=sys.stderr, flush=True)
            lat = []
            for _ in range(args.first):
                _, _, t0, t_first = launch(command(system, f"{short}-first", 4, args), 120)
                lat.append(t_first - t0)
            figures["first"][system] = {"runs": lat, "median": statistics.median(lat)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    print_table(figures)


def _measured(result: dict, checkout: str) -> None:
    if result["package"] != checkout:
        raise RuntimeError(f"the run for {checkout} measured the package of "
                           f"{result['package']}")


def by_checkout(args: argparse.Namespace) -> None:
    """hpcsched's throughput and sweep for each ``--checkout``, ``--rounds`` times, the
    order alternated; one row per run."""
    import tempfile

    import _launch

    checkouts = [os.path.abspath(c) for c in args.checkout]
    for c in checkouts:
        if not os.path.isdir(os.path.join(c, "hpcsched")):
            sys.exit(f"--checkout {c} holds no hpcsched package")
        _launch.compile_package(c)
    only = set(args.only.split(","))
    if args.instructions:
        print("| round | checkout | map (instructions per task) | tree | sweep (per element) | |")
    else:
        print("| round | checkout | map (tasks/s) | tree | sweep (elements/s) | sweep CPU s |")
    print("|---|---|---|---|---|---|", flush=True)
    rows = []
    for r in range(args.rounds):
        for c in checkouts if r % 2 == 0 else checkouts[::-1]:
            row: dict = {"round": r + 1, "checkout": c}
            with tempfile.TemporaryDirectory() as tmp:
                # one file name per sub-run: a second process's dumps would overwrite the
                # first's, numbered from 1 again
                args.callgrind_out = os.path.join(tmp, "throughput.out") \
                    if args.instructions else ""
                if "throughput" in only:
                    [res], _, _, _ = _launch.launch(
                        command("hpcsched", "hs-throughput", 4, args), 3600,
                        env={"PYTHONPATH": c}, cwd=c)
                    _measured(res, c)
                    if args.instructions:
                        row["map"] = round(res["map_instructions"] / res["map_tasks"])
                        row["tree"] = round(res["tree_instructions"] / res["tree_tasks"])
                    else:
                        row["map"] = round(res["map_tasks"] / res["map_s"])
                        row["tree"] = round(res["tree_tasks"] / res["tree_s"])
                if "sweep" in only:
                    args.callgrind_out = args.callgrind_out and os.path.join(tmp, "sweep.out")
                    [res], _, _, _ = _launch.launch(command("hpcsched", "hs-sweep", 4, args),
                                                    3600, env={"PYTHONPATH": c}, cwd=c)
                    _measured(res, c)
                    (n, m), = res["maps"].items()
                    if args.instructions:
                        row["sweep"] = round(m["instructions"] / int(n))
                    else:
                        row["sweep"] = round(int(n) / m["wall"])
                        row["sweep_cpu"] = round(m["cpu"], 3)
            rows.append(row)
            print("| " + " | ".join(str(row.get(k, "")) for k in
                                    ("round", "checkout", "map", "tree", "sweep", "sweep_cpu"))
                  + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)


def print_table(f: dict) -> None:
    print(f"\n# {f['command']}  ({f['time']})")
    if "throughput" in f:
        t = f["throughput"]
        names = list(t)
        print("\nthroughput, tasks/s           " + "".join(f"{s:>16s}" for s in names)
              + "".join(f"   hpcsched/{s}" for s in names if s != "hpcsched"))
        for what, label in (("map", "map, no-op tasks"), ("tree", "tree reduction, 1 graph")):
            rate = {s: t[s][f"{what}_tasks"] / t[s][f"{what}_s"] for s in t}
            ntasks = next(iter(t.values()))[f"{what}_tasks"]
            line = f"{label + f' ({ntasks})':30s}" + "".join(f"{rate[s]:16.0f}" for s in names)
            if "hpcsched" in rate:
                line += "".join(f"{rate['hpcsched'] / rate[s]:{13 + len(s)}.2f}x"
                                for s in names if s != "hpcsched")
            print(line)
        print("(hpcsched: 3 worker ranks; dask-mpi: 2 workers; mpi4py.futures: 3 ranks = "
              "2 workers, its tree is one map per level)")
    if "sweep" in f:
        print_sweep(f["sweep"])
    if "transfer" in f:
        print("\nworker-to-worker transfer   hpcsched   raw fresh   raw reused   "
              "hpcsched/raw fresh")
        for mib, r in f["transfer"].items():
            nbytes = int(mib) * 2**20
            gbs = {k: nbytes / v / 1e9 for k, v in r.items() if k != "reps"}
            print(f"{mib:>5s} MiB (median of {r['reps']})    {gbs['hpcsched']:6.2f}      "
                  f"{gbs['raw-fresh']:6.2f}      {gbs['raw-reused']:6.2f}   GB/s   "
                  f"{gbs['hpcsched'] / gbs['raw-fresh']:6.0%}")
    if "idle" in f:
        print("\nidle CPU per rank (% of a core)    max    mean   per rank")
        for s, r in f["idle"].items():
            ranks = " ".join(f"{v:.2f}" for v in r["per_rank"])
            print(f"{s:32s}{r['max']:6.2f}  {r['mean']:6.2f}   {ranks}")
    if "first" in f:
        print("\nfirst result after mpiexec (s)    median   runs")
        for s, r in f["first"].items():
            runs = " ".join(f"{v:.2f}" for v in r["runs"])
            print(f"{s:32s}{r['median']:6.2f}    {runs}")


def print_sweep(sw: dict) -> None:
    """The sweeps' table: elements/s (wall), CPU seconds of the submitting process, and
    hpcsched's ratio to each (same run)."""
    hs = sw.get("hpcsched", {}).get("maps", {})
    rows: list[tuple[str, str, dict]] = [("hpcsched (bulk map)", n, r) for n, r in hs.items()]
    for key, r in sw.get("mpi4py.futures", {}).get("maps", {}).items():
        chunk, n = key.split("/")
        rows.append((f"mpi4py.futures chunksize={chunk}", n, r))
    for n, r in sw.get("ProcessPoolExecutor", {}).get("maps", {}).items():
        rows.append(("ProcessPoolExecutor(3) chunksize=16", n, r))
    print("\nsweep of no-op elements (4 ranks)       elements   elements/s   CPU s (rank 0)"
          "   hpcsched/this (wall)")
    for name, n, r in rows:
        ratio = ""
        if n in hs:
            ratio = f"{r['wall'] / hs[n]['wall']:10.2f}x"
        print(f"{name:38s}{int(n):>10d}{int(n) / r['wall']:13.0f}{r['cpu']:12.2f}   {ratio}")
    ms = sw.get("hpcsched", {}).get("sweep")
    if ms:
        print(f"\n1 ms sweep: {ms['elements']} elements on {ms['workers']} worker ranks in "
              f"{ms['wall']:.2f} s; a task takes {ms['task_s'] * 1e3:.3f} ms there: "
              f"efficiency {ms['efficiency']:.1%} ({ms['efficiency_nominal']:.1%} of the "
              f"nominal 1 ms)")


if __name__ == "__main__":
    main()
