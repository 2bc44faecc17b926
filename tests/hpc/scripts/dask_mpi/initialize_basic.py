"""dask-mpi's own initialize test script, with only its import lines changed.

``mpiexec -n 4 python initialize_basic.py``. Under dask-mpi rank 1 is the
client and two ranks are workers; here rank 0 is scheduler and client, so
three ranks are workers, named by their rank as dask-mpi names them.
"""

from time import monotonic, sleep

from mpi4py import MPI

from hpcsched import Client, get_worker, initialize

initialize()
n_workers = MPI.COMM_WORLD.Get_size() - 1

with Client() as c:
    start = monotonic()
    while len(c.scheduler_info()["workers"]) != n_workers:
        assert monotonic() < start + 30
        sleep(0.2)
    names = {w["name"] for w in c.scheduler_info()["workers"].values()}
    assert names == set(range(1, n_workers + 1)), names

    assert c.submit(lambda x: x + 1, 10).result(timeout=30) == 11
    assert c.submit(lambda x: x + 1, 20, workers=2).result(timeout=30) == 21
    # workers=<rank> pins the task to that rank
    assert c.submit(lambda: get_worker().name, workers=2, pure=False).result(timeout=30) == 2
print("initialize_basic ok", flush=True)
