"""MPI mode at width: many ranks, one map, a clean exit; hpcsched against dask-mpi.

    python benchmarks/bench_mpi_width.py [--ranks 256] [--tasks 10000]
                                         [--systems hpcsched,dask-mpi] [--timeout 900]
                                         [--min-free 2GB] [--json FILE]

The driver (no MPI) launches one job per system, one after the other, on the same
``--ranks`` (oversubscribed on a small machine: the ranks share its cores):

* hpcsched: ``mpiexec -n R python -m hpcsched bench_mpi_width.py --role hs``
  (rank 0: scheduler and script, R - 1 worker ranks);
* dask-mpi: ``mpiexec -n R python bench_mpi_width.py --role dm``
  (``dask_mpi.initialize()``: rank 0 scheduler, rank 1 client, R - 2 workers).

Each job waits for all its workers, maps ``inc`` over ``range(--tasks)`` (one
thread per worker), checks the sum and ends. Figures: *ready*, from
``Popen(mpiexec ...)`` to every worker joined; *map*, the map and gather;
*wall*, from ``Popen`` to every process gone (the exit included); *peak
memory*, the largest sum of the rank processes' RSS (sampled by this driver
every 0.5 s; shared pages count once per rank, as ``ps`` counts them) and of
their PSS (each shared page divided among the processes sharing it: what the
job takes of the machine's memory). A job
that fails, outlives ``--timeout`` or brings the machine's available memory
below ``--min-free`` is killed, every process it started with it
(benchmarks/_launch.py), and reported as such.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.abspath(__file__)


def inc(x: int) -> int:
    return x + 1


def report(**result) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def run_map(client, workers: int, args: argparse.Namespace, t_ready: float) -> None:
    n = args.tasks
    t0 = time.time()
    total = sum(client.gather(client.map(inc, range(n), pure=False)))
    t_map = time.time() - t0
    assert total == n * (n + 1) // 2, total
    report(ready=t_ready, map_s=t_map, tasks=n, workers=workers)


# ====================================================================== the jobs
def role_hs(args: argparse.Namespace) -> None:
    from hpcsched import Client

    with Client() as client:  # python -m hpcsched: every worker rank has joined
        t_ready = time.time()
        run_map(client, len(client.scheduler_info()["workers"]), args, t_ready)


def role_dm(args: argparse.Namespace) -> None:
    import dask_mpi
    from distributed import Client

    dask_mpi.initialize(nthreads=1, dashboard=False, memory_limit=None)
    with Client() as client:
        client.wait_for_workers(args.ranks - 2, timeout=args.timeout)
        t_ready = time.time()
        run_map(client, len(client.scheduler_info()["workers"]), args, t_ready)


ROLES = {"hs": role_hs, "dm": role_dm}


# ====================================================================== the driver
def command(system: str, args: argparse.Namespace) -> list[str]:
    opts = ["--role", "hs" if system == "hpcsched" else "dm", "--tasks", str(args.tasks),
            "--ranks", str(args.ranks), "--timeout", str(args.timeout)]
    prefix = ["mpiexec", "-n", str(args.ranks), sys.executable]
    if system == "hpcsched":
        return [*prefix, "-m", "hpcsched", HERE, *opts]
    return [*prefix, HERE, *opts]


class MemoryWatch:
    """Samples the sums of RSS and of PSS over the ``ranks`` rank processes of one run; ends
    the run if the machine's available memory falls below ``min_free`` bytes."""

    def __init__(self, ranks: int, min_free: int):
        self.ranks = ranks
        self.min_free = min_free
        self.peak = 0
        self.peak_pss = 0
        self.peak_ranks = 0
        self.starved: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, mark: str) -> None:
        self._thread = threading.Thread(target=self._run, args=(mark,), daemon=True)
        self._thread.start()

    def _run(self, mark: str) -> None:
        import _launch
        import psutil

        known: dict[int, psutil.Process] = {}
        while not self._stop.wait(0.5):
            if len(known) < self.ranks:  # ranks appear while the job starts
                for p in _launch.rank_processes(mark, HERE):
                    known.setdefault(p.pid, p)
            total = pss = 0
            for pid, p in list(known.items()):
                try:
                    mem = p.memory_full_info()  # Linux: smaps_rollup, cheap
                except psutil.Error:
                    del known[pid]
                    continue
                total += mem.rss
                pss += getattr(mem, "pss", mem.rss)
            if total > self.peak:
                self.peak, self.peak_ranks = total, len(known)
            self.peak_pss = max(self.peak_pss, pss)
            available = psutil.virtual_memory().available
            if available < self.min_free and self.starved is None:
                self.starved = (f"killed: {available / 2**30:.1f} GiB of memory left with "
                                f"{total / 2**30:.1f} GiB in {len(known)} ranks")
                _launch.kill_marked(mark)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


def run_system(system: str, args: argparse.Namespace, min_free: int) -> dict:
    import _launch

    watch = MemoryWatch(args.ranks, min_free)
    t0 = time.time()
    try:
        results, _, t_start, _ = _launch.launch(command(system, args), args.timeout,
                                                on_start=watch.start)
        failure = None
    except RuntimeError as e:
        results, t_start, failure = [], t0, str(e)
    finally:
        watch.stop()
    out: dict = {"wall_s": time.time() - t_start, "peak_rss": watch.peak,
                 "peak_pss": watch.peak_pss, "peak_ranks": watch.peak_ranks}
    if watch.starved or failure or not results:
        reason = watch.starved or failure or "no result"
        # what ended it (its first line), then the end of what the job printed
        head, _, rest = reason.partition("\n")
        out["failed"] = head + ("\n" + rest[-3000:] if rest else "")
        return out
    [res] = results
    out.update(ready_s=res["ready"] - t_start, map_s=res["map_s"], tasks=res["tasks"],
               workers=res["workers"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--systems", default="hpcsched,dask-mpi")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    p.add_argument("--min-free", default="2GB",
                   help="end a job that leaves the machine less available memory")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args()
    if args.role:
        ROLES[args.role](args)
        return
    import _launch

    from hpcsched.core.units import parse_bytes

    _launch.compile_package()  # as installed: see _launch.compile_package

    figures: dict = {"command": " ".join(sys.argv), "time": time.strftime("%Y-%m-%d %H:%M"),
                     "ranks": args.ranks, "systems": {}}
    for system in args.systems.split(","):
        print(f"... {system} on {args.ranks} ranks", file=sys.stderr, flush=True)
        figures["systems"][system] = run_system(system, args, parse_bytes(args.min_free))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    print_table(figures)


def print_table(f: dict) -> None:
    print(f"\n# {f['command']}  ({f['time']})")
    print(f"\n{f['ranks']} ranks          workers   ready (s)   map (s)   wall (s)   "
          "peak memory, sum over ranks: PSS, RSS (per rank)")
    rows = f["systems"]
    for s, r in rows.items():
        per_rank = r["peak_rss"] / max(r["peak_ranks"], 1) / 2**20
        mem = (f"{r['peak_pss'] / 2**30:.2f} GiB, {r['peak_rss'] / 2**30:.2f} GiB "
               f"({per_rank:.0f} MiB x {r['peak_ranks']})")
        if "failed" in r:
            print(f"{s:18s} FAILED after {r['wall_s']:.1f} s, {mem}: "
                  f"{r['failed'].splitlines()[0][-200:]}")
            continue
        print(f"{s:18s}{r['workers']:8d}{r['ready_s']:12.1f}{r['map_s']:10.2f}"
              f"{r['wall_s']:11.1f}   {mem}")
    ok = {s: r for s, r in rows.items() if "failed" not in r}
    if "hpcsched" in ok and len(ok) > 1:
        hs = ok["hpcsched"]
        for s, r in ok.items():
            if s != "hpcsched":
                print(f"hpcsched / {s}: wall {hs['wall_s'] / r['wall_s']:.2f}x, "
                      f"map time {hs['map_s'] / r['map_s']:.2f}x, "
                      f"peak memory {hs['peak_pss'] / r['peak_pss']:.2f}x (PSS), "
                      f"{hs['peak_rss'] / r['peak_rss']:.2f}x (RSS)")


if __name__ == "__main__":
    main()
