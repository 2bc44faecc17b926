"""Workers come and go all day (adaptive clusters, preempted jobs): the scheduler keeps
nothing of those that left, beyond its bounded records (the task stream, the events)."""

from __future__ import annotations

import gc

import pytest

from hpcsched import Client
from hpcsched.core import config
from hpcsched.core.comm.base import Security
from hpcsched.core.scheduler.server import Scheduler
from hpcsched.core.state.model import WorkerInfo
from hpcsched.core.worker.server import Worker
from tests.conftest import wait_until


def inc(x):
    return x + 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stealing", [True, False])
def test_the_scheduler_keeps_nothing_of_workers_that_left(stealing):
    security = Security.generate()
    with config.set({"scheduler.work-stealing": stealing}), \
            Scheduler("tcp://127.0.0.1:0", security, dashboard_address=None).start() as s, \
            Client(s.address, security=security) as client:
        for wave in range(3):
            workers = [Worker(s.address, nthreads=1, security=security).start()
                       for _ in range(4)]
            try:
                s.wait_for_workers(4, timeout=30)
                # more tasks than threads, some downstream of others: queued, placed next
                # to their inputs, backlogged, stolen
                xs = client.map(inc, range(40), key=[f"x-{wave}-{i}" for i in range(40)])
                ys = [client.submit(inc, client.submit(inc, x)) for x in xs]
                assert client.gather(ys) == [i + 3 for i in range(40)]
                del xs, ys
            finally:
                for w in workers:
                    w.close()
            wait_until(lambda: not s.workers_info(), timeout=30, what="the workers gone")
        del workers, w
        heap_entries = {id(e) for e in s.state.placement.free_heap}
        gc.collect()
        kept = [o for o in gc.get_objects() if type(o) is WorkerInfo]
        assert kept, "the test found no WorkerInfo to look at"
        for ws in kept:
            # a lazy heap of the workers with free slots keeps outdated entries, bounded by
            # twice the workers plus 64: nothing else may keep a worker that left
            holders = [r for r in gc.get_referrers(ws) if r is not kept]
            assert all(id(r) in heap_entries for r in holders), (ws, [
                type(r).__name__ for r in holders if id(r) not in heap_entries])
