"""Bandwidth and latency of the mpi:// transport against raw mpi4py.

    mpiexec -n 2 python benchmarks/bench_mpi_transfer.py [--sizes 64,512] [--reps 5]

For each size (MiB), rank 1 receives a float64 array from rank 0:

* raw-fresh:  mpi4py ``Recv`` into a ``numpy.empty`` allocated for each transfer
  (what a receiver that keeps the data must do: the honest baseline);
* raw-reused: mpi4py ``Recv`` into one buffer reused every time (an upper bound:
  no page faults on fresh memory);
* ours: ``MPIComm.send(array)`` / ``MPIComm.recv()`` (header + zero-copy frame).

Each transfer is timed on the receiver, from the moment it asks for the data
(a small "go" message, so both sides start together without a spinning
barrier) until the array is in its hands; the median over ``--reps`` runs
after one warm-up run is printed in GB/s (10^9 bytes/s). Then small-message
round trips: raw blocking ``Send``/``Recv`` (spins a core on both sides) and
``MPIComm`` (polls with back-off: the latency paid for an idle rank using ~0%
CPU).
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,512", help="array sizes in MiB, comma-separated")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per case")
    parser.add_argument("--pings", type=int, default=2000, help="small-message round trips")
    args = parser.parse_args()

    from hpcsched.hpc import mpi

    MPI = mpi.mpi_module()  # initialized with MPI_THREAD_MULTIPLE, as the transport needs
    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        raise SystemExit("run with: mpiexec -n 2 python benchmarks/bench_mpi_transfer.py")
    rank = world.Get_rank()
    raw = world.Dup()
    go = np.zeros(1, dtype=np.uint8)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    results: dict[tuple[str, int], float] = {}

    def report(case: str, mib: int, times: list[float]) -> None:
        med = statistics.median(times)
        results[case, mib] = (mib * 2**20) / med / 1e9
        print(f"{case:>11s} {mib:5d} MiB: {results[case, mib]:6.2f} GB/s "
              f"(median {med * 1e3:7.1f} ms of {len(times)})", flush=True)

    from hpcsched.core.comm import registry

    mpi.init_endpoint(timeout=30)
    if rank == 0:
        comm = registry.connect("mpi://1", timeout=30)
    else:
        import queue

        accepted: queue.SimpleQueue = queue.SimpleQueue()
        listener = registry.listen("mpi://", accepted.put)
        comm = accepted.get(timeout=30)
        listener.stop()

    # The cases take turns within each repetition, so that drift of this shared
    # machine's speed hits them alike.
    cases = ("raw-fresh", "raw-reused", "ours")
    for mib in sizes:
        n = mib * 2**20 // 8
        times: dict[str, list[float]] = {case: [] for case in cases}
        if rank == 0:
            data = np.arange(n, dtype=np.float64)
        else:
            reused = np.empty(n, dtype=np.float64)
            reused.fill(0)  # touch the pages once, as a long-lived buffer would be
        for rep in range(args.reps + 1):
            for case in cases:
                if rank == 0:
                    if case == "ours":
                        assert comm.recv(timeout=60) == "go"
                        comm.send(data)
                    else:
                        raw.Recv(go, 1, 1)
                        raw.Send(data, 1, 2)
                    continue
                t0 = time.perf_counter()
                if case == "ours":
                    comm.send("go")
                    arr = comm.recv(timeout=60)
                    assert not arr.flags.owndata
                else:
                    raw.Send(go, 0, 1)
                    arr = np.empty(n, dtype=np.float64) if case == "raw-fresh" else reused
                    raw.Recv(arr, 0, 2)
                dt = time.perf_counter() - t0
                assert arr.shape == (n,) and arr[-1] == n - 1
                del arr
                if rep:  # the first round is a warm-up
                    times[case].append(dt)
        if rank == 1:
            for case in cases:
                report(case, mib, times[case])
            del reused
        else:
            del data

    # ---------------------------------------------------------------- latency
    msg = [{"op": "task-finished", "key": "inc-123", "nbytes": 8, "thread": 140234}]
    small = np.zeros(100, dtype=np.uint8)
    peer = 1 - rank
    rtts_raw = []
    for _ in range(args.pings):
        t0 = time.perf_counter()
        if rank == 0:
            raw.Send(small, peer, 3)
            raw.Recv(small, peer, 3)
        else:
            raw.Recv(small, peer, 3)
            raw.Send(small, peer, 3)
        rtts_raw.append(time.perf_counter() - t0)
    rtts = []
    for _ in range(args.pings):
        t0 = time.perf_counter()
        if rank == 0:
            comm.send(msg)
            comm.recv(timeout=30)
        else:
            comm.send(comm.recv(timeout=30))
        rtts.append(time.perf_counter() - t0)
    if rank == 0:
        for name, values in (("raw Send/Recv (spinning)", rtts_raw), ("MPIComm", rtts)):
            values.sort()
            print(f"round trip, {name}: median {values[len(values) // 2] * 1e6:7.1f} us, "
                  f"p90 {values[int(len(values) * 0.9)] * 1e6:7.1f} us", flush=True)
    else:
        for mib in sizes:
            print(f"ratio ours/raw-fresh {mib} MiB: "
                  f"{results['ours', mib] / results['raw-fresh', mib]:.2f}", flush=True)
    comm.close()
    mpi.shutdown_endpoint()
    raw.Free()


if __name__ == "__main__":
    main()
