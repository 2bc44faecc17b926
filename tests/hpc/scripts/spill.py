"""Results three times the workers' memory limit, under mpiexec: they spill, the job lives.

Started as ``mpiexec -n 3 python -m hpcsched --memory-limit 250MB spill.py``: two worker
ranks of 250 MB each, 1.5 GB of results held at once, then read back.
"""

import numpy as np
import psutil

from hpcsched import Client, get_worker, wait

MB = 1_000_000
N = 76  # x 20 MB = 1.52 GB: three times the two workers' 500 MB


def block(i):
    return np.full(20 * MB // 8, i, dtype=np.float64)


def first(x):
    return float(x[0])


def memory_figures():
    w = get_worker()
    buf = w.memory.spill_buffer
    return {"spilled": buf.disk_bytes if buf is not None else 0,
            "rss": psutil.Process().memory_info().rss, "limit": w.memory_limit}


with Client() as client:
    futures = [client.submit(block, i, pure=False) for i in range(N)]
    wait(futures, timeout=240)
    firsts = client.gather([client.submit(first, f) for f in futures], timeout=240)
    assert firsts == [float(i) for i in range(N)], firsts
    workers = sorted(client.scheduler_info()["workers"])
    figures = [client.submit(memory_figures, workers=[w], pure=False).result(timeout=60)
               for w in workers]
    # most results are on disk, and no rank holds more than its limit
    assert sum(f["spilled"] for f in figures) >= N * 20 * MB // 2, figures
    assert all(f["rss"] < f["limit"] for f in figures), figures
    print(f"spill ok: {N * 20} MB of results, {len(workers)} workers: {figures}", flush=True)
