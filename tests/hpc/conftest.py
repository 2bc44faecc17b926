"""Fixtures of the MPI tests run by pytest-mpi under mpiexec.

``cluster`` builds a cluster of the world's ranks, once per module: rank 0 runs a
scheduler on ``mpi://0`` and a Client over ``inproc://``; every other rank runs a Worker
in the background of its pytest process, and serves in the fixture's teardown until rank
0 closes the scheduler.
"""

from __future__ import annotations

import pytest

WAIT = 30.0  # seconds a rank waits for the others


def _rank_and_size() -> tuple[int, int]:
    from hpcsched.hpc.mpi_init import mpi_module

    world = mpi_module().COMM_WORLD
    return world.Get_rank(), world.Get_size()


@pytest.fixture(scope="module")
def cluster():
    """rank 0: (client, scheduler, world size); other ranks: None (their worker serves)."""
    from hpcsched.core.client import client as client_mod
    from hpcsched.hpc import mpi

    rank, size = _rank_and_size()
    mpi.init_endpoint(timeout=WAIT)
    try:
        if rank == 0:
            from hpcsched.core.scheduler.server import Scheduler

            sched = Scheduler("mpi://0").start()
            inproc = sched.add_listener("inproc://")
            try:
                sched.wait_for_workers(size - 1, timeout=WAIT)
                client = client_mod.Client(inproc, set_as_default=False)
                try:
                    yield client, sched, size
                finally:
                    client.close()
            finally:
                sched.close(timeout=10)
        else:
            from hpcsched.core.worker.server import Worker

            worker = Worker("mpi://0", nthreads=2, memory_limit=2**30, name=f"rank-{rank}")
            worker.start()
            try:
                yield None
                # every test has returned here: serve until rank 0 is done with us
                assert worker.wait_closed(240), "rank 0 never closed the scheduler"
                assert worker.close_reason == "scheduler closing", worker.close_reason
            finally:
                worker.close()
    finally:
        mpi.shutdown_endpoint()
