"""Tasks that submit tasks on MPI worker ranks, and a result that cannot be sent.

Under ``mpiexec -n 4 python -m hpcsched``: a worker rank's client reaches
rank 0's scheduler over MPI point-to-point. Every worker has one thread, so a
task waiting on its subtasks without seceding would wait forever.
"""

import time

from hpcsched import Client, get_client, get_worker, rejoin, secede, worker_client


def fib(n):
    if n < 2:
        return n
    with worker_client() as client:
        a = client.submit(fib, n - 1)
        b = client.submit(fib, n - 2)
        return sum(client.gather([a, b]))


def fib_secede(n):
    if n < 2:
        return n
    client = get_client()
    a, b = client.submit(fib_secede, n - 1), client.submit(fib_secede, n - 2)
    secede()
    total = sum(client.gather([a, b]))
    rejoin()
    return total


def whoami(_):
    client = get_client()
    return client.id, client.scheduler_address, get_worker().address


def plain_client(x):
    with Client() as client:
        fut = client.submit(abs, x)
        secede()
        return fut.result(timeout=30), client.scheduler_address


class RefusesPickling:
    def __reduce__(self):
        raise ValueError("RefusesPickling will not be pickled")


def refuses():
    return RefusesPickling()


def kind_of(x):
    return type(x).__name__


with Client() as client:
    print(f"fib(9) = {client.submit(fib, 9).result(timeout=60)}", flush=True)
    print(f"fib_secede(8) = {client.submit(fib_secede, 8).result(timeout=60)}", flush=True)
    seen = client.gather(client.map(whoami, range(12)), timeout=60)
    per_worker = {}
    for cid, _, worker in seen:
        per_worker.setdefault(worker, set()).add(cid)
    assert all(len(ids) == 1 for ids in per_worker.values()), per_worker
    print(f"task clients reach {sorted({a for _, a, _ in seen})}", flush=True)
    print(f"plain Client() in a task: {client.submit(plain_client, -5).result(timeout=60)}",
          flush=True)
    start = time.monotonic()
    try:
        client.submit(refuses, pure=False).result(timeout=30)
    except ValueError as e:
        print(f"unserializable result raised {type(e).__name__}: {e} after "
              f"{time.monotonic() - start:.1f}s", flush=True)
    else:
        raise AssertionError("an unserializable result should err its future")
    x = client.submit(refuses, workers=["mpi://1"], pure=False)
    there = client.submit(kind_of, x, workers=["mpi://2"])  # must travel between ranks
    try:
        there.result(timeout=30)
    except ValueError as e:
        print(f"dependent on another rank raised {type(e).__name__}: {e}", flush=True)
    else:
        raise AssertionError("a dependency that cannot be sent should err its dependent")
    print(f"workers at the end: {len(client.scheduler_info()['workers'])}", flush=True)
