"""A group that never ran reaches every free worker through the scheduler's loop.

The scheduler state hands a group of unknown duration to a few free workers per
event (``policies.FIRST_WAVE_WORKERS``) and asks for a ``FillQueue`` to hand the
next ones theirs; the server handles it in its next iteration, once the first
messages are out (any other event goes on with it too). Real scheduler, workers and
client over TCP in this process; the scheduler's tick is made long, so that no tick
hands out the rest: tasks that take a while all start together, on every worker, as
with dask's queuing.
"""

from __future__ import annotations

import time

import pytest

from hpcsched import Client
from hpcsched.core import config
from hpcsched.core.comm.base import Security
from hpcsched.core.scheduler.server import Scheduler
from hpcsched.core.state import policies
from hpcsched.core.worker.server import Worker

N_WORKERS = 2 * policies.FIRST_WAVE_WORKERS + 8
SLEEP = 1.0


def slow(i: int) -> tuple[str, float]:
    """Sleep; where and when it started."""
    from hpcsched import get_worker

    started = time.time()
    time.sleep(SLEEP)
    return get_worker().address, started


@pytest.mark.timeout(120)
def test_long_tasks_of_a_new_group_start_on_every_worker_at_once():
    security = Security.generate()
    workers: list[Worker] = []
    with config.set({"scheduler.extensions": []}), \
            Scheduler("tcp://127.0.0.1:0", security, tick_interval=30.0,
                      dashboard_address=None).start() as s:
        try:
            for _ in range(N_WORKERS):
                workers.append(Worker(s.address, nthreads=1, security=security).start())
            s.wait_for_workers(N_WORKERS, timeout=30)
            with Client(s.address, security=security) as client:
                dsk = {("slow", i): (slow, i) for i in range(3 * N_WORKERS)}
                out = client.get(dsk, list(dsk))
        finally:
            for w in workers:
                w.close()
    first = {}  # worker -> its first task's start
    for address, started in out:
        first[address] = min(started, first.get(address, started))
    assert len(first) == N_WORKERS
    # every worker started its first task before any task could have finished
    assert max(first.values()) - min(first.values()) < SLEEP / 2, sorted(first.values())
