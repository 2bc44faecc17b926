"""A numpy array made on one worker is a dependency of a task on another worker.

The consumer checks that the array arrived over the zero-copy path: it does not
own its memory (it lives in the buffer MPI received into) and is not a copy.
"""

import os

import numpy as np

from hpcsched import Client

N = 8 * 2**20 // 8  # 8 MiB of float64: far above the transport's data threshold


def produce(n):
    return np.arange(n, dtype=np.float64)


def consume(arr):
    return {"pid": os.getpid(), "sum": float(arr.sum()), "owndata": bool(arr.flags.owndata),
            "base": type(arr.base).__name__, "writeable": bool(arr.flags.writeable)}


with Client() as client:
    workers = sorted(client.scheduler_info()["workers"])
    assert len(workers) >= 2, workers
    a = client.submit(produce, N, workers=[workers[0]])
    b = client.submit(consume, a, workers=[workers[1]])
    info = b.result(timeout=60)
    where = client.submit(os.getpid, workers=[workers[0]]).result(timeout=30)
    assert info["pid"] != where, "the consumer ran on the producer's rank"
    assert info["sum"] == N * (N - 1) / 2, info
    assert not info["owndata"], f"the array was copied on its way: {info}"
    print(f"transfer ok: {info}", flush=True)
