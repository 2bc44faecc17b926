"""dask-mpi's initialize(comm=..., exit=False) test script, import lines changed.

World rank 3 stays out of the cluster (a sub-communicator of ranks 0-2 runs
it); every rank then meets in the script's own collectives on COMM_WORLD,
which must still work after the cluster has closed.
"""

from mpi4py.MPI import COMM_WORLD as world

from hpcsched import Client, initialize, send_close_signal

new_comm_assignment = 1 if world.rank == 3 else 0
comm = world.Split(new_comm_assignment)

if world.rank != 3:
    is_client = initialize(comm=comm, exit=False)
    assert is_client == (comm.rank == 0), (world.rank, is_client)

    if is_client:
        with Client() as c:
            assert len(c.scheduler_info()["workers"]) == comm.size - 1
            assert c.submit(lambda x: x + 1, 10).result(timeout=30) == 11
            assert c.submit(lambda x: x + 1, 20).result(timeout=30) == 21
        send_close_signal()
        send_close_signal()  # idempotent

world.Barrier()
x = 100 if world.rank == 0 else 200
x = world.bcast(x)
assert x == 100
print(f"no_exit ok on rank {world.rank}", flush=True)
