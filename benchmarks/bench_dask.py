"""dask collections on hpcsched vs dask.distributed and dask-mpi, side by side in one run.

    python benchmarks/bench_dask.py [--repeat 3] [--only tcp,mpi] [--workloads array,xarray]
                                    [--blas-threads 1] [--timeout 900] [--json FILE]

Workloads, each a plain ``.compute()`` with the system's client as dask's
default scheduler (checked in every sub-run):

* ``array``: ``(x @ x.T).sum()`` where ``x = da.random.RandomState(42).random_sample(
  (4000, 4000), chunks=500)`` -- 8 x 8 chunks made on the workers, 512 block
  products and their reductions;
* ``dataframe``: ``dask.datasets.timeseries`` of 20 daily partitions (86,400
  rows each, generated on the workers: nothing is read or downloaded),
  ``groupby("name").agg({"x": "mean", "y": "sum", "id": "max"})``. dask reduces
  its 20 partial results through a shuffle into 2 partitions and lets the
  scheduler choose how: dask.distributed and dask-mpi use their "p2p" shuffle
  extension, hpcsched a shuffle made of tasks -- so the graphs differ;
* ``dataframe-tasks``: the same with ``shuffle_method="tasks"``: one graph for all;
* ``xarray``: the pangeo workflow over netCDF files the driver writes once before the
  sub-runs (a year of daily temperature, precipitation and wind on a 1-degree grid,
  float32, one file per month: 284 MB): ``open_mfdataset(parallel=True)`` (the files
  opened in tasks on the workers), a monthly ``resample().mean()`` written ``to_zarr``, a
  ``groupby("time.season")`` climatology and a 7-day ``rolling`` mean, computed together
  in one ``dask.compute`` and reduced to a sum per variable (the timed part includes the
  opening). It needs xarray, h5netcdf and zarr.

Root tasks (``--workloads roots`` names the four): graphs whose first layer is many
independent tasks, each a few microseconds of work, so the time is the systems' own
cost per task:

* ``bag-roots``: ``db.from_sequence(range(100_000), npartitions=20_000).map(inc).sum()``;
* ``array-roots``: ``da.from_array(np.arange(200_000.0), chunks=10).sum()`` (20,000
  chunks);
* ``dataframe-roots``: ``dd.from_pandas(df, npartitions=10_000).x.sum()`` of a
  200,000-row frame;
* ``delayed-roots``: ``dask.compute(*[dask.delayed(inc)(i) for i in range(10_000)])``
  (10,000 independent calls, each one a result the client gathers).

The driver (no MPI) launches every sub-run in a process tree of its own
(``benchmarks/_launch.py``: killed at ``--timeout``, and whatever is left of it
is ended when it returns or fails), one after the other:

* tcp, hpcsched: ``python bench_dask.py --role hs-tcp`` -- ``LocalCluster(n_workers=2,
  threads_per_worker=1)`` (worker processes over TCP) and ``Client(cluster)``;
* tcp, dask.distributed: ``python bench_dask.py --role dd-tcp`` -- ``LocalCluster(
  n_workers=2, threads_per_worker=1, processes=True)`` and ``Client(cluster)``;
* mpi, hpcsched: ``mpiexec -n 4 python -m hpcsched bench_dask.py --role hs-mpi``
  (rank 0: scheduler + client, 3 worker ranks of 1 thread);
* mpi, dask-mpi: ``mpiexec -n 4 python bench_dask.py --role dm-mpi``
  (``dask_mpi.initialize(nthreads=1)``: rank 0 scheduler, rank 1 client, 2 workers, TCP).

4 ranks on this 2-core machine are oversubscribed, as in bench_mpi.py. Each
sub-run computes a small array and dataframe first (imports on the workers),
then each workload once, timed. The load of a shared machine changes from one
minute to the next, so the sub-runs go in ``--repeat`` rounds, each system once
per round and the order alternating between rounds; the best time is kept. Every process
runs with ``--blas-threads`` BLAS threads (``OMP_NUM_THREADS`` etc.; 1 is what
dask.distributed's nanny sets for its workers; 0 leaves the environment as
it is). The results of every system and repetition are checked equal.

Besides wall-clock times, each sub-run reports the CPU time (user + system) that
all of its processes (client, scheduler, workers, launchers) spent during each
compute: on a loaded machine it varies much less than the wall-clock time.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import atexit
import json
import math
import os
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# ====================================================================== workloads
def array_workload(n: int = 4000, chunk: int = 500):
    import dask.array as da

    x = da.random.RandomState(42).random_sample((n, n), chunks=chunk)
    return (x @ x.T).sum()


def dataframe_workload(days: int = 20, **agg_kwargs):
    import dask

    df = dask.datasets.timeseries(start="2000-01-01", end=f"2000-01-{days + 1:02d}",
                                  freq="1s", partition_freq="1D", seed=42)
    assert df.npartitions == days, df.npartitions
    return df.groupby("name").agg({"x": "mean", "y": "sum", "id": "max"}, **agg_kwargs)


def dataframe_tasks_workload():
    """The same groupby with the shuffle of its partial results run as tasks on both systems
    (by default dask.distributed picks its "p2p" shuffle, hpcsched makes it "tasks")."""
    return dataframe_workload(shuffle_method="tasks")


def as_plain(value) -> object:
    """A workload's result as JSON-able data (floats round-trip exactly)."""
    if isinstance(value, dict):  # the xarray workflow's sums
        return {k: float(v) for k, v in value.items()}
    if hasattr(value, "sort_index"):  # the dataframe
        value = value.sort_index()
        return {"index": [str(i) for i in value.index],
                **{c: [float(v) for v in value[c]] for c in value.columns}}
    return float(value)


def same(a: object, b: object, rel: float = 1e-9) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            same(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(
            same(x, y, rel) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return isinstance(b, float) and math.isclose(a, b, rel_tol=rel)
    return a == b


XARRAY_DIR = "BENCH_DASK_XARRAY_DIR"  # environment: where the driver wrote the netCDF files


def write_xarray_files(directory: str) -> None:
    """The ``xarray`` workload's input: 12 monthly netCDF files, 284 MB in all."""
    import numpy as np
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(42)
    time = pd.date_range("2001-01-01", "2001-12-31", freq="D")
    lat, lon = np.arange(-89.5, 90, 1.0), np.arange(0.5, 360, 1.0)
    annual = np.cos(2 * np.pi * (time.day_of_year.values - 200) / 365)[:, None, None]
    shape = (len(time), len(lat), len(lon))
    base = 288 - 30 * np.abs(np.sin(np.deg2rad(lat)))[None, :, None] + 10 * annual
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), (base + rng.normal(0, 2, shape)).astype("float32")),
         "pr": (("time", "lat", "lon"), rng.gamma(0.8, 2.5, shape).astype("float32")),
         "wind": (("time", "lat", "lon"), (rng.weibull(2.0, shape) * 7).astype("float32"))},
        coords={"time": time, "lat": lat, "lon": lon})
    for month, part in ds.groupby("time.month"):
        part.to_netcdf(os.path.join(directory, f"day_2001{month:02d}.nc"), engine="h5netcdf")


class XarrayWorkflow:
    """The ``xarray`` workload: ``compute()`` opens the files and runs the whole workflow
    (the opening is part of what is timed, as in a notebook)."""

    def __init__(self) -> None:
        self.directory = os.environ[XARRAY_DIR]

    def _graph(self) -> tuple:
        import xarray as xr

        paths = sorted(os.path.join(self.directory, f) for f in os.listdir(self.directory)
                       if f.endswith(".nc"))
        ds = xr.open_mfdataset(paths, engine="h5netcdf", parallel=True, chunks={"time": 31},
                               combine="by_coords")
        monthly = ds.resample(time="1MS").mean()
        store = os.path.join(self.directory, f"monthly-{os.getpid()}.zarr")
        write = monthly.to_zarr(store, mode="w", consolidated=False, compute=False)
        sums = {f"{step} {v}": out[v].sum() for step, out in (
            ("monthly", monthly), ("climatology", ds.groupby("time.season").mean()),
            ("rolling", ds.rolling(time=7, center=True).mean())) for v in ds.data_vars}
        return sums, write

    def compute(self) -> dict:
        import dask

        sums, write = self._graph()
        values, _ = dask.compute(sums, write)
        return {k: float(v) for k, v in values.items()}

    def __dask_graph__(self) -> dict:
        import dask

        sums, write = self._graph()
        return dict(dask.base.collections_to_expr([*sums.values(), write]).__dask_graph__())


def inc(x: int) -> int:
    return x + 1


def bag_roots_workload():
    import dask.bag as db

    return db.from_sequence(range(100_000), npartitions=20_000).map(inc).sum()


def array_roots_workload():
    import dask.array as da
    import numpy as np

    return da.from_array(np.arange(200_000.0), chunks=10).sum()


def dataframe_roots_workload():
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    df = pd.DataFrame({"x": np.arange(200_000), "y": np.arange(200_000) * 2.0})
    return dd.from_pandas(df, npartitions=10_000).x.sum()


class DelayedRoots:
    """The ``delayed-roots`` workload: 10,000 independent calls computed together (the
    result is their sum, to be compared)."""

    def __init__(self, n: int = 10_000) -> None:
        import dask

        self.calls = [dask.delayed(inc)(i) for i in range(n)]

    def compute(self) -> int:
        import dask

        return sum(dask.compute(*self.calls))

    def __dask_graph__(self) -> dict:
        import dask

        return dict(dask.base.collections_to_expr(self.calls).__dask_graph__())


ROOTS = ("bag-roots", "array-roots", "dataframe-roots", "delayed-roots")
WORKLOADS = {"array": array_workload, "dataframe": dataframe_workload,
             "dataframe-tasks": dataframe_tasks_workload, "xarray": XarrayWorkflow,
             "bag-roots": bag_roots_workload, "array-roots": array_roots_workload,
             "dataframe-roots": dataframe_roots_workload, "delayed-roots": DelayedRoots}


# ====================================================================== sub-runs
def run_workloads(system: str, client, args: argparse.Namespace) -> None:
    """Time ``.compute()`` of each workload on ``client`` (dask's default scheduler)."""
    import _launch
    import dask

    scheduler = dask.base.get_scheduler()  # distributed: client.get; hpcsched: an object
    assert scheduler == client.get or getattr(scheduler, "client", None) is client, \
        f"the client is not dask's scheduler: {scheduler!r}"
    workers = len(client.scheduler_info()["workers"])
    array_workload(1000, 500).compute()  # warm-up: imports and connections on the workers
    dataframe_workload(2).compute()
    procs = _launch.marked_processes(os.environ[_launch.MARK])  # every process of this run
    for name in args.workloads.split(","):
        times, cpu, value = [], [], None
        for _ in range(args.repeat):
            collection = WORKLOADS[name]()
            cpu0 = cpu_seconds(procs)
            t0 = time.perf_counter()
            result = collection.compute()
            times.append(time.perf_counter() - t0)
            cpu.append(cpu_seconds(procs) - cpu0)
            plain = as_plain(result)
            assert value is None or same(plain, value, 0.0), "repetitions differ"
            value = plain
        ntasks = len(WORKLOADS[name]().__dask_graph__())
        report(system=system, workload=name, times=times, cpu=cpu, value=value,
               workers=workers, processes=len(procs), tasks=ntasks)


def cpu_seconds(procs: list) -> float:
    """User + system CPU time of ``procs`` (those still alive)."""
    import psutil

    total = 0.0
    for p in procs:
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def report(**result) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def quiet_distributed() -> None:
    import logging

    logging.getLogger("distributed").setLevel(logging.ERROR)


def role_hs_tcp(args: argparse.Namespace) -> None:
    from hpcsched import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        run_workloads("hpcsched", client, args)


def role_dd_tcp(args: argparse.Namespace) -> None:
    from distributed import Client, LocalCluster

    quiet_distributed()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        run_workloads("dask.distributed", client, args)


def role_hs_mpi(args: argparse.Namespace) -> None:
    from hpcsched import Client

    with Client() as client:
        run_workloads("hpcsched", client, args)


def role_dm_mpi(args: argparse.Namespace) -> None:
    import dask_mpi
    from distributed import Client

    quiet_distributed()
    dask_mpi.initialize(nthreads=1, dashboard=False, memory_limit=None)
    with Client() as client:
        client.wait_for_workers(2, timeout=60)
        run_workloads("dask-mpi", client, args)


ROLES = {"hs-tcp": role_hs_tcp, "dd-tcp": role_dd_tcp, "hs-mpi": role_hs_mpi,
         "dm-mpi": role_dm_mpi}

# mode -> [(system, role, command prefix before this script)]
SUBRUNS = {
    "tcp": [("hpcsched", "hs-tcp", []), ("dask.distributed", "dd-tcp", [])],
    "mpi": [("hpcsched", "hs-mpi", ["mpiexec", "-n", "4", "@python", "-m", "hpcsched"]),
            ("dask-mpi", "dm-mpi", ["mpiexec", "-n", "4"])],
}


# ====================================================================== the driver
def command(prefix: list[str], role: str, args: argparse.Namespace) -> list[str]:
    head = [sys.executable if a == "@python" else a for a in prefix]
    if "@python" not in prefix:
        head.append(sys.executable)
    return [*head, HERE, "--role", role, "--repeat", "1", "--workloads", args.workloads]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    p.add_argument("--repeat", type=int, default=3,
                   help="rounds: each sub-run is launched once per round (best is kept)")
    p.add_argument("--only", default="tcp,mpi", help="which comparisons: tcp, mpi")
    p.add_argument("--workloads", default="array,dataframe,dataframe-tasks",
                   help="comma-separated workloads (roots: the four root-task ones)")
    p.add_argument("--blas-threads", type=int, default=1,
                   help="BLAS threads of every process (0: leave the environment as it is)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per sub-run")
    p.add_argument("--json", default=None, help="also write all figures to this file")
    args = p.parse_args()
    names = [n for w in args.workloads.split(",") for n in (ROOTS if w == "roots" else (w,))]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workloads {', '.join(unknown)}: choose among "
                f"{', '.join(WORKLOADS)} or roots")
    args.workloads = ",".join(names)
    if args.role:
        ROLES[args.role](args)
        return

    import _launch

    env = {v: str(args.blas_threads) for v in BLAS_VARS} if args.blas_threads else {}
    if "xarray" in args.workloads.split(","):
        data = tempfile.TemporaryDirectory(prefix="bench-dask-xarray-")
        atexit.register(data.cleanup)
        print("... writing the xarray workload's netCDF files", file=sys.stderr, flush=True)
        write_xarray_files(data.name)
        env[XARRAY_DIR] = data.name
    figures: dict = {"command": " ".join(["python", *sys.argv]),
                     "time": time.strftime("%Y-%m-%d %H:%M"), "runs": {}}
    modes = [m for m in ("tcp", "mpi") if m in args.only.split(",")]
    for mode in modes:
        for system, _, _ in SUBRUNS[mode]:
            figures["runs"][f"{mode}/{system}"] = {}
    for rnd in range(args.repeat):  # rounds: each system once per round, alternating order
        for mode in modes:
            subruns = SUBRUNS[mode] if rnd % 2 == 0 else SUBRUNS[mode][::-1]
            for system, role, prefix in subruns:
                print(f"... round {rnd + 1}/{args.repeat}, {mode}: {system}", file=sys.stderr,
                      flush=True)
                results, _, _, _ = _launch.launch(command(prefix, role, args), args.timeout,
                                                  env=env)
                per_workload = figures["runs"][f"{mode}/{system}"]
                for r in results:
                    if r["workload"] in per_workload:
                        per_workload[r["workload"]]["times"] += r["times"]
                        per_workload[r["workload"]]["cpu"] += r["cpu"]
                    else:
                        per_workload[r["workload"]] = r
    check(figures)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    print_table(figures)


def check(figures: dict) -> None:
    """Every system computed the same values (the dataframe's and the array's)."""
    reference: dict = {}
    for run, per_workload in figures["runs"].items():
        for name, r in per_workload.items():
            ref = reference.setdefault(name, (run, r["value"]))
            if not same(r["value"], ref[1]):
                raise AssertionError(f"{name}: {run} computed {r['value']!r}, "
                                     f"{ref[0]} {ref[1]!r}")


def print_table(f: dict) -> None:
    print(f"\n# {f['command']}  ({f['time']})\n")
    print(f"{'workload (tasks)':26s}{'vs':18s}{'hpcsched s':>11s}{'peer s':>9s}{'peer/ours':>11s}"
          f"{'CPU s: ours':>13s}{'peer':>7s}{'peer/ours':>11s}   every run (s): hpcsched | peer")
    runs = f["runs"]
    for mode, peer in (("tcp", "dask.distributed"), ("mpi", "dask-mpi")):
        ours, theirs = runs.get(f"{mode}/hpcsched"), runs.get(f"{mode}/{peer}")
        if not ours or not theirs:
            continue
        for name in ours:
            a, b = min(ours[name]["times"]), min(theirs[name]["times"])
            ca, cb = min(ours[name]["cpu"]), min(theirs[name]["cpu"])
            every = " ".join(f"{t:.2f}" for t in ours[name]["times"]) + " | " + " ".join(
                f"{t:.2f}" for t in theirs[name]["times"])
            label = f"{name} ({ours[name]['tasks']})"
            print(f"{label:26s}{peer:18s}{a:11.2f}{b:9.2f}{b / a:10.2f}x"
                  f"{ca:13.2f}{cb:7.2f}{cb / ca:10.2f}x   {every}")
    procs = {run: (next(iter(r.values()))["workers"], next(iter(r.values()))["processes"])
             for run, r in runs.items() if r}
    print("(best of each; peer/ours > 1: hpcsched is faster. CPU s: user + system time of every "
          "process of the run during the compute. workers, processes: "
          + ", ".join(f"{k} {w}, {n}" for k, (w, n) in procs.items()) + ")")


if __name__ == "__main__":
    main()
