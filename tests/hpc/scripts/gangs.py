"""Gang tasks (``ranks=4``) mixed with ordinary tasks; prints what the test checks.

Each gang forms its communicator, allreduces over it, and its rank 0 returns the size,
the sum, and each member's world rank with when it was in the task; the test checks the
results, that two gangs ran at once on disjoint ranks, and that no rank was in two gangs
at once.  argv: number of gangs, number of ordinary tasks.
"""

import json
import sys
import time

import hpcsched
from hpcsched import Client

N_GANGS, N_PLAIN = (int(a) for a in sys.argv[1:3])


def member(x):
    from mpi4py import MPI

    start = time.time()
    comm = hpcsched.get_task_comm()
    size, total = comm.Get_size(), comm.allreduce(x)
    world = comm.allreduce(MPI.COMM_WORLD.Get_rank())
    ranks = comm.gather(MPI.COMM_WORLD.Get_rank())
    stop = time.time()
    spans = comm.gather((MPI.COMM_WORLD.Get_rank(), comm.Get_rank(), start, stop))
    return {"size": size, "sum": total, "world": world, "ranks": ranks, "spans": spans}


def inc(x):
    return x + 1


with Client() as client:
    gangs, plain = [], []
    for i in range(max(N_GANGS, N_PLAIN)):
        if i < N_GANGS:
            gangs.append(client.submit(member, i, ranks=4, pure=False))
        plain += client.map(inc, range(i * 10, i * 10 + N_PLAIN // N_GANGS)) \
            if i < N_GANGS else []
    results = client.gather(gangs, timeout=120)
    plain_sum = sum(client.gather(plain, timeout=120))
    print("GANGS " + json.dumps({"results": results, "plain": [len(plain), plain_sum]}),
          flush=True)
