# ruff: noqa: I001 - _checkout is imported first, before anything that imports hpcsched
"""Many workers over TCP: hpcsched vs dask.distributed, side by side in one run.

    python benchmarks/bench_swarm.py [--workers 10,200,1000,2000] [--hosts 4]
                                     [--tasks 10000] [--pairs 5000] [--leaves 4096]
                                     [--systems hpcsched,dask] [--json out.json]
                                     [--workloads map,futures,graph] [--repeat 3]
                                     [--idle 10]
    python benchmarks/bench_swarm.py --instructions --checkout <base> --checkout . \
        --workers 200,1000 --workloads graph --leaves 4096 --repeat 2 --rounds 2

For each system and each number of workers N, as a user would run it: one
scheduler process started from the command line with a scheduler file, N
one-thread workers connecting to it over TCP from ``--hosts`` processes
(``N / hosts`` workers each, as a node running many workers would), and a
client in this process. Measured:

* ``join_s``: from starting the worker processes until the scheduler counts N
  workers (``wait_for_workers``);
* ``idle_cpu_pct``: the scheduler process's CPU over ``--idle`` seconds (10)
  with N idle workers and a connected client, in % of one core. The window
  spans a whole heartbeat interval (10 s from 1,000 workers on): workers that
  joined together heartbeat together, and a 5 s window holds their burst or
  none of it (2.4 % and 0.2-0.6 % in turn at 1,000 workers);
* ``map_per_s``: ``client.map`` of ``--tasks`` no-op tasks, gathered;
* ``tree_futures_per_s``: ``--pairs`` futures reduced pairwise with
  ``submit(add, a, b)`` (one call per task, futures passed inline);
* ``tree_graph_per_s``: a binary tree of ``--leaves`` leaves as one graph
  (``client.get``);
* ``cpu_per_task_us``: the scheduler's CPU time over the workloads' every
  repetition, per task;
* ``rss_mib``: the scheduler's resident memory with N idle workers, after the
  workloads.

Each workload runs ``--repeat`` times (default 3) on the same workers and the
best rate is kept, as ``bench_local.py`` and ``bench_mpi.py`` keep theirs: a
workload lasts about a second, and one run swings by up to 1.5x either way on
this 2-core machine, at 200 workers as at 1,000. ``--workloads`` picks among
map, futures (the tree of futures) and graph; each figure also goes to stderr as soon as it is measured (dask's trees at 2,000
workers take many minutes on a small machine).

``--instructions`` counts instead what the wall clock of a loaded machine cannot resolve:
the scheduler process runs under valgrind's callgrind with its instrumentation off, and
each workload is counted alone (``callgrind_control`` switches it on before the workload
and off and dumps after it): instructions per task, the fewest of the repetitions.
Workers that joined together heartbeat together, and a heartbeat burst inside a window
that valgrind stretches to many seconds would be counted with the workload, so in this
mode the workers' heartbeat interval is set to 20 minutes (``worker.heartbeat-interval``,
``scheduler.worker-ttl`` 3 hours); ``idle_instructions_per_s`` counts an idle
``--idle`` window the same way (the lower of one before the workloads and one after),
what the scheduler's timers add per second of a window, taken off each workload's count;
``--json`` keeps the counts as counted, with their windows' seconds.
With ``--client`` the process of the client (this one, run again under callgrind) is
counted in the same windows, net of its own idle rate: what the scheduler's figure
leaves out of a workload (packing a graph, futures, results).
``--checkout`` (repeated, the first the base) runs the whole measurement for each
checkout's package in turn, ``--rounds`` times with the order alternated, this script's
workloads for every one of them.

Every process a measurement starts is ended by it (terminate, then kill).
dask's workers run with ``memory_limit=0`` (no memory monitor), as
hpcsched's do by default, and without their statistical profiler (a 10 ms
timer per worker: hundreds of workers sharing one process's event loop would
spend it on their timers, where on a cluster each has a process of its own),
so that the worker processes measure the scheduler rather than their own
polling. Needs ``pip install
'dask[distributed]'`` for the dask rows.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from operator import add

from _callgrind import Counter, missing_tools, valgrind
from bench_local import noop, tree_graph  # the same workloads as bench_local.py

HERE = os.path.abspath(__file__)


# ----------------------------------------------------------------- worker hosts
def _host_hpcsched(scheduler_file: str, count: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from hpcsched.core.comm.scheduler_file import read_scheduler_file
    from hpcsched.core.worker.server import Worker

    address, security = read_scheduler_file(scheduler_file)
    workers = [Worker(address, nthreads=1, security=security, death_timeout=120)
               for _ in range(count)]
    # all at once, as the worker processes of a node start (and as dask's are awaited
    # together below): Worker.start blocks until the scheduler has answered
    with ThreadPoolExecutor(64) as pool:
        list(pool.map(lambda w: w.start(), workers))
    _wait_for_signal()
    for w in workers:
        w.close()


def _host_dask(scheduler_file: str, count: int) -> None:
    import asyncio

    from distributed import Worker

    async def main() -> None:
        workers = [Worker(scheduler_file=scheduler_file, nthreads=1, memory_limit=0,
                          dashboard=False) for _ in range(count)]
        await asyncio.gather(*workers)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await asyncio.gather(*(w.close(timeout=5) for w in workers), return_exceptions=True)

    asyncio.run(main())


def _wait_for_signal() -> None:
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    while not stop.wait(1.0):
        pass


# ----------------------------------------------------------------- one measurement
class Processes:
    """The scheduler and worker-host processes of one measurement; ends them all."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _wait_file(path: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) or os.path.getsize(path) == 0:
        if proc.poll() is not None:
            raise RuntimeError(f"scheduler exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no scheduler file {path} after {timeout}s")
        time.sleep(0.05)


#: the environment of a counted measurement: no heartbeat burst inside a counted window
QUIET_HEARTBEATS = {"HPCSCHED_WORKER__HEARTBEAT_INTERVAL": "1200",
                    "HPCSCHED_SCHEDULER__WORKER_TTL": "10800"}


@contextlib.contextmanager
def swarm(system: str, n: int, hosts: int, instructions: bool = False) -> Iterator[tuple]:
    """A scheduler process started from the command line, ``n`` one-thread workers from
    ``hosts`` processes, and a client in this process once they have all joined: yields
    (client, the scheduler's psutil.Process, seconds the workers took to join, and with
    ``instructions`` a :class:`Counter` of the scheduler's instructions, else None). Every
    process it started is ended when it exits (bench_soak.py uses it too)."""
    import psutil

    tmp = tempfile.mkdtemp(prefix="bench-swarm-")
    sfile = os.path.join(tmp, "scheduler.json")
    # dask's scheduler unpickles the graphs, whose functions live in bench_local: every
    # process must import it, wherever the benchmark is started from
    path = os.pathsep.join(p for p in (os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p)
    # dask's workers get ten minutes to connect (its default is 30 s): at 2,000 workers on
    # a small machine they time out before the scheduler has accepted them all
    env = dict(os.environ, PYTHONWARNINGS="ignore", DASK_LOGGING__DISTRIBUTED="error",
               DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="600s",
               DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED="False", PYTHONPATH=path)
    counter_out = os.path.join(tmp, "callgrind.out")
    prefix = valgrind(counter_out) if instructions else []
    if instructions:
        env.update(QUIET_HEARTBEATS)
    procs = Processes()
    try:
        if system == "hpcsched":
            # started in the temporary directory: ``-m`` puts the working directory first
            # on the path, where another checkout's package would be found before ours
            sched = procs.start([*prefix, sys.executable, "-m", "hpcsched", "scheduler",
                                 "--port", "0", "--scheduler-file", sfile,
                                 "--log-level", "error"], env=env, cwd=tmp,
                                stderr=subprocess.DEVNULL if instructions else None)
        else:
            sched = procs.start([sys.executable, "-m", "distributed.cli.dask_scheduler",
                                 "--port", "0", "--dashboard-address", ":0",
                                 "--scheduler-file", sfile], env=env,
                                stderr=subprocess.DEVNULL)
        _wait_file(sfile, sched)
        sp = psutil.Process(sched.pid)
        hosts = max(1, min(hosts, n))
        per = [n // hosts + (1 if i < n % hosts else 0) for i in range(hosts)]
        t0 = time.perf_counter()
        for count in per:
            procs.start([sys.executable, HERE, "_host", system, sfile, str(count)], env=env)
        if system == "hpcsched":
            from hpcsched import Client
        else:
            from distributed import Client
        with Client(scheduler_file=sfile) as client:
            client.wait_for_workers(n, timeout=600)
            counter = Counter(sched.pid, counter_out) if instructions else None
            yield client, sp, time.perf_counter() - t0, counter
    finally:
        procs.close()
        shutil.rmtree(tmp, ignore_errors=True)


def measure(system: str, n: int, args) -> dict:
    if args.instructions:
        return measure_instructions(system, n, args)
    with swarm(system, n, args.hosts) as (client, sp, join, _):
        c0 = sp.cpu_times()
        time.sleep(args.idle)
        c1 = sp.cpu_times()
        idle = 100 * ((c1.user + c1.system) - (c0.user + c0.system)) / args.idle
        out = {"system": system, "workers": n, "join_s": round(join, 2),
               "idle_cpu_pct": round(idle, 2), "package": scheduler_package(system, client)}
        print(f"{system} {n}: {out}", file=sys.stderr, flush=True)
        workloads = args.workloads.split(",")
        total = 0
        cpu0 = sp.cpu_times()
        for rep in range(args.repeat):
            if "map" in workloads:
                t = time.perf_counter()
                futs = client.map(noop, range(args.tasks), pure=False)
                assert client.gather(futs)[-1] == args.tasks - 1
                best(out, "map_per_s", args.tasks / (time.perf_counter() - t))
                total += args.tasks
                print(f"{system} {n}: map {out['map_per_s']}/s", file=sys.stderr,
                      flush=True)
                del futs
            if "futures" in workloads:
                t = time.perf_counter()
                ntree = tree_of_futures(client, args.pairs)
                best(out, "tree_futures_per_s", ntree / (time.perf_counter() - t))
                total += ntree
                print(f"{system} {n}: tree of futures {out['tree_futures_per_s']}/s",
                      file=sys.stderr, flush=True)
            if "graph" in workloads:
                dsk, root = tree_graph(args.leaves, f"swarm-{system}-{n}-{rep}-")
                t = time.perf_counter()
                assert client.get(dsk, root) == args.leaves * (args.leaves - 1) // 2
                best(out, "tree_graph_per_s", len(dsk) / (time.perf_counter() - t))
                total += len(dsk)
        cpu1 = sp.cpu_times()
        out["cpu_per_task_us"] = round(
            1e6 * ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / max(total, 1), 1)
        out["rss_mib"] = round(sp.memory_info().rss / 2**20, 1)
    return out


def measure_instructions(system: str, n: int, args) -> dict:
    """The scheduler's instructions per task of each workload, and per second of an idle
    window. A workload's window, stretched by valgrind, also holds the scheduler's timers:
    the idle rate (the lower of a window before the workloads and one after) times the
    window's seconds is taken off. The fewest of the repetitions
    is kept (the first may still compile, cache or grow a table); all go to ``--json``."""
    if system != "hpcsched":
        raise ValueError("--instructions counts hpcsched's scheduler only")
    client_out = os.environ.get(CLIENT_VARIABLE)
    with swarm(system, n, args.hosts, instructions=True) as (client, sp, join, counter):
        out: dict = {"system": system, "workers": n, "join_s": round(join, 2),
                     "package": scheduler_package(system, client)}
        # --client: this process, the client's, is counted too, in the same windows
        counters = {"": counter}
        if client_out:
            counters["client_"] = Counter(os.getpid(), client_out)
        rates: dict[str, float] = {}

        @contextlib.contextmanager
        def windows() -> Iterator[dict[str, list[float]]]:
            with contextlib.ExitStack() as stack:
                yield {who: stack.enter_context(c.window()) for who, c in counters.items()}

        windows_counted: list[tuple[str, int, dict[str, list[float]]]] = []

        def keep(name: str, counted: dict[str, list[float]], tasks: int) -> None:
            windows_counted.append((name, tasks, counted))
            for who, (count, seconds) in counted.items():  # the counts as counted, too
                out.setdefault(f"{name}_{who}counted", []).append([count, round(seconds, 2)])

        def idle_window() -> None:
            with windows() as idle:
                time.sleep(args.idle)
            for who, (count, seconds) in idle.items():
                rate = round(count / seconds)
                out.setdefault(f"idle_{who}counted", []).append(rate)
                rates[who] = min(rates.get(who, rate), rate)

        # an idle window before the workloads and one after: a cluster that has just
        # joined may still be busy for a while (the workers' heartbeat intervals are
        # told), and the lower of the two rates is the timers'
        idle_window()
        workloads = args.workloads.split(",")
        for rep in range(args.repeat):
            if "map" in workloads:
                with windows() as counted:
                    futs = client.map(noop, range(args.tasks), pure=False)
                    assert client.gather(futs)[-1] == args.tasks - 1
                    del futs
                keep("map", counted, args.tasks)
            if "futures" in workloads:
                with windows() as counted:
                    ntree = tree_of_futures(client, args.pairs)
                keep("tree_futures", counted, ntree)
            if "graph" in workloads:
                dsk, root = tree_graph(args.leaves, f"swarm-{system}-{n}-{rep}-")
                with windows() as counted:
                    assert client.get(dsk, root) == args.leaves * (args.leaves - 1) // 2
                keep("tree_graph", counted, len(dsk))
            print(f"{system} {n}: {out}", file=sys.stderr, flush=True)
        idle_window()
        for who, rate in rates.items():
            out[f"idle_{who}instructions_per_s"] = rate
        for name, tasks, counted in windows_counted:
            for who, (count, seconds) in counted.items():
                runs = out.setdefault(f"{name}_{who}instructions_per_task_runs", [])
                runs.append(round((count - rates[who] * seconds) / tasks))
                out[f"{name}_{who}instructions_per_task"] = min(runs)
    return out


def scheduler_package(system: str, client) -> str | None:
    """The checkout whose hpcsched the scheduler runs (``--checkout`` checks it)."""
    if system != "hpcsched":
        return None

    def package() -> str:
        import hpcsched

        return os.path.dirname(os.path.dirname(hpcsched.__file__))

    return client.run_on_scheduler(package)


def tree_of_futures(client, pairs: int) -> int:
    """``pairs`` futures reduced pairwise with ``submit(add, a, b)``, one call per task,
    futures passed inline; the result checked. The number of tasks it ran."""
    level = client.map(noop, range(pairs), pure=False)
    tasks = pairs
    while len(level) > 1:
        nxt = [client.submit(add, level[i], level[i + 1], pure=False)
               for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        tasks += len(level) // 2
        level = nxt
    assert level[0].result() == pairs * (pairs - 1) // 2
    return tasks


def best(out: dict, name: str, rate: float) -> None:
    """Keep the best of the repetitions' rates (each workload lasts about a second at
    these rates, and one run swings by up to 1.5x either way on a small machine)."""
    out[name] = max(out.get(name, 0), round(rate))


COLUMNS = ["workers", "system", "join_s", "idle_cpu_pct", "map_per_s", "tree_futures_per_s",
           "tree_graph_per_s", "cpu_per_task_us", "rss_mib"]
COUNTED = ["workers", "system", "join_s", "idle_instructions_per_s",
           "map_instructions_per_task", "tree_futures_instructions_per_task",
           "tree_graph_instructions_per_task"]
#: with --client, the client's process too
COUNTED_CLIENT = ["idle_client_instructions_per_s", "map_client_instructions_per_task",
                  "tree_futures_client_instructions_per_task",
                  "tree_graph_client_instructions_per_task"]
#: names the callgrind output of this process, the client's, when it runs under callgrind
CLIENT_VARIABLE = "BENCH_SWARM_CLIENT_CALLGRIND"
#: names the checkout a measurement's processes import, when ``--checkout`` picks one
CHECKOUT_VARIABLE = "BENCH_SWARM_CHECKOUT"


def _use_checkout() -> None:
    """This process, and those it starts, import the checkout ``--checkout`` picked."""
    checkout = os.environ.get(CHECKOUT_VARIABLE)
    if checkout:
        sys.path.insert(0, checkout)
        os.environ["PYTHONPATH"] = os.pathsep.join([checkout, os.environ["PYTHONPATH"]])


def run_child(argv: list[str], env: dict, quiet: bool = True) -> None:
    """Run one measurement (``quiet``: its table not shown); if this process is ended
    meanwhile (SIGTERM), the child is too, by a SIGTERM that lets it end its own
    scheduler and workers."""
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL if quiet else None)
    try:
        if child.wait() != 0:
            raise RuntimeError(f"{' '.join(argv)} exited with {child.returncode}")
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def by_checkout(args, argv: list[str]) -> None:
    """``--checkout``: the measurement of ``argv`` for each checkout, alternated."""
    checkouts = [os.path.abspath(c) for c in args.checkout]
    for c in checkouts:
        if not os.path.isdir(os.path.join(c, "hpcsched")):
            sys.exit(f"--checkout {c} holds no hpcsched package")
    forwarded, skip = [], False
    for a in argv:  # this run's arguments but --checkout, --rounds and --json
        if skip:
            skip = False
        elif a in ("--checkout", "--rounds", "--json"):
            skip = True
        elif not a.startswith(("--checkout=", "--rounds=", "--json=")):
            forwarded.append(a)
    columns = ["round", "checkout", *(COUNTED if args.instructions else COLUMNS),
               *(COUNTED_CLIENT if args.client else [])]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns), flush=True)
    rows = []
    for r in range(args.rounds):
        for c in checkouts if r % 2 == 0 else checkouts[::-1]:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "rows.json")
                run_child([sys.executable, HERE, *forwarded, "--json", out],
                          dict(os.environ, **{CHECKOUT_VARIABLE: c}))
                with open(out) as f:
                    for row in json.load(f):
                        if row.get("package", c) != c:
                            raise RuntimeError(f"the run for {c} measured the scheduler of "
                                               f"{row['package']}")
                        rows.append(dict(row, round=r + 1, checkout=c))
                        print("| " + " | ".join(str(rows[-1].get(k, row.get("error", "")))
                                                for k in columns) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main() -> None:
    _use_checkout()
    if len(sys.argv) > 1 and sys.argv[1] == "_host":
        system, sfile, count = sys.argv[2], sys.argv[3], int(sys.argv[4])
        (_host_hpcsched if system == "hpcsched" else _host_dask)(sfile, count)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="10,200,1000,2000")
    p.add_argument("--hosts", type=int, default=4, help="worker processes the workers share")
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--pairs", type=int, default=5_000)
    p.add_argument("--leaves", type=int, default=4096)
    p.add_argument("--systems", default="hpcsched,dask")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--workloads", default="map,futures,graph")
    p.add_argument("--idle", type=float, default=10.0,
                   help="seconds over which the idle scheduler's CPU is measured")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of each workload per measurement: the best rate is kept")
    p.add_argument("--instructions", action="store_true",
                   help="count the scheduler's instructions per task (valgrind) instead")
    p.add_argument("--client", action="store_true",
                   help="with --instructions: count the client's process too")
    p.add_argument("--checkout", action="append",
                   help="a checkout whose package to measure (repeat; the first is the base)")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --checkout: rounds over the checkouts, the order alternated")
    args = p.parse_args()
    if args.instructions:
        if missing_tools():
            p.error(f"--instructions: {', '.join(missing_tools())} not on the PATH")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.client and not args.instructions:
        p.error("--client counts with --instructions only")
    if args.checkout:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        by_checkout(args, sys.argv[1:])
        return
    if args.client and not os.environ.get(CLIENT_VARIABLE):
        # this measurement again, in a process under callgrind (its instrumentation off
        # but in the windows); the processes it starts run natively
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "client.out")
            run_child([*valgrind(out), sys.executable, HERE, *sys.argv[1:]],
                      dict(os.environ, **{CLIENT_VARIABLE: out}), quiet=False)
        return
    columns = COUNTED + (COUNTED_CLIENT if args.client else []) if args.instructions \
        else COLUMNS
    # a SIGTERM (timeout(1), a batch system's limit) ends the measurement's processes too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rows = []
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for n in (int(x) for x in args.workers.split(",")):
        for system in args.systems.split(","):
            try:
                row = measure(system, n, args)
            except Exception as e:  # one failing measurement must not hide the others
                row = {"system": system, "workers": n, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print("| " + " | ".join(str(row.get(c, row.get("error", ""))) for c in columns)
                  + " |", flush=True)
        pair = {r["system"]: r for r in rows if r["workers"] == n and "error" not in r}
        if {"hpcsched", "dask"} <= set(pair):
            ratios = {k: round(pair["hpcsched"][k] / pair["dask"][k], 1)
                      for k in ("map_per_s", "tree_futures_per_s", "tree_graph_per_s")
                      if pair["dask"].get(k) and pair["hpcsched"].get(k)}
            print(f"|  {n} | hpcsched/dask | {ratios} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
