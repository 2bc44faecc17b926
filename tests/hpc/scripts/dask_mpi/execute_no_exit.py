"""dask-mpi's own execute test script (execute_no_exit.py), its import lines changed and
its worker count hpcsched's.

``mpiexec -n 4``: ranks 0-2 make the cluster (rank 0 the scheduler and the client
function, ranks 1 and 2 workers, where dask-mpi has one), rank 3 stays out; after
``execute`` every rank goes on and meets the others in the script's own collective.
"""

from time import monotonic, sleep

from mpi4py.MPI import COMM_WORLD as world

from hpcsched import Client, execute

new_comm_assignment = 1 if world.rank == 3 else 0
comm = world.Split(new_comm_assignment)

if world.rank != 3:

    def client_code(offset, *, scale):
        with Client() as c:
            start = monotonic()
            while len(c.scheduler_info()["workers"]) != 2:
                assert monotonic() < start + 30
                sleep(0.2)
            names = {v["name"] for v in c.scheduler_info()["workers"].values()}
            assert names == {1, 2}, names
            assert c.submit(lambda x: x + offset, 10, workers=2).result() == 10 + offset
            assert c.gather(c.map(lambda x: x * scale, range(40))) == [
                x * scale for x in range(40)]
            print("execute client ran", flush=True)

    execute(client_code, client_args=(1,), client_kwargs={"scale": 3}, comm=comm)

world.Barrier()
x = 100 if world.rank == 0 else 200
x = world.bcast(x)
assert x == 100
print(f"execute_no_exit ok on rank {world.rank}", flush=True)
