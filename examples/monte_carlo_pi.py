"""Estimate pi by throwing random darts at a square, in parallel chunks.

Run it on 4 MPI ranks (rank 0: scheduler + this script, ranks 1-3: workers):

    mpiexec -n 4 python -m hpcsched examples/monte_carlo_pi.py [total darts]

or without MPI (a LocalCluster on this machine): python examples/monte_carlo_pi.py
"""

import sys
import time

import numpy as np

from hpcsched import Client


def darts_in_circle(seed: int, n: int) -> int:
    """Throw ``n`` darts into the unit square; count those inside the quarter circle.

    Defined in this script: hpcsched ships it to the workers by value.
    """
    rng = np.random.default_rng(seed)
    x = rng.random(n)
    y = rng.random(n)
    return int(np.count_nonzero(x * x + y * y <= 1.0))


def main() -> None:
    total = int(float(sys.argv[1])) if len(sys.argv) > 1 else 20_000_000
    chunk = 1_000_000
    sizes = [chunk] * (total // chunk) + ([total % chunk] if total % chunk else [])

    with Client() as client:  # under `python -m hpcsched`: the MPI job's scheduler
        nworkers = len(client.scheduler_info()["workers"])
        start = time.perf_counter()
        # one task per chunk, each with its own seed: independent random streams
        futures = client.map(darts_in_circle, range(len(sizes)), sizes)
        hits = sum(client.gather(futures))
        elapsed = time.perf_counter() - start

    estimate = 4.0 * hits / total
    print(f"pi ~ {estimate:.6f} (error {abs(estimate - np.pi):.1e}) from {total:,} darts "
          f"in {len(sizes)} tasks on {nworkers} workers: {elapsed:.2f} s")


if __name__ == "__main__":
    main()
