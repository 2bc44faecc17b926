"""The worker server as a shell over its parts: every item its inbox can hold has one
handler, and the events a worker makes itself reach its state machine named by a
``stimulus_id``, on both roads (single tasks, and the ranges of a bulk map), in a real
cluster whose workers are threads of this process."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from typing import Any

import pytest

from hpcsched import Client, LocalCluster
from hpcsched.core.state import events as ev
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.worker import server
from hpcsched.core.worker.parts import inbox
from hpcsched.core.worker.server import OWN_EVENTS, Worker

pytestmark = pytest.mark.timeout(120)

#: the events a worker makes itself (not decoded from a message)
MADE_HERE = (*OWN_EVENTS, ev.RangeThreadDone, ev.RangesWaiting, ev.PauseWorker)


def test_every_kind_of_inbox_item_has_one_handler():
    items = {
        inbox.FromScheduler,
        inbox.SchedulerGone,
        inbox.FromPeer,
        inbox.PeerGone,
        inbox.ToScheduler,
        inbox.RangesDone,
    }
    assert set(Worker.inbox.table) == items | set(OWN_EVENTS) | {
        ev.RangeThreadDone,
        ev.RangesWaiting,
    }
    # every event the worker makes for its state machine is one the state handles
    assert set(MADE_HERE) <= set(WorkerState.handlers.table)


def test_the_worker_is_a_thin_shell():
    tree = ast.parse(inspect.getsource(server))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Worker"]
    methods = [n.name for n in cls.body if isinstance(n, ast.FunctionDef)]
    assert len(methods) <= 30, methods


@pytest.fixture(scope="module")
def cluster_client() -> Iterator[tuple[LocalCluster, Client]]:
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=2, processes=False, timeout=60, dashboard_address=None
    )
    try:
        with Client(cluster, set_as_default=False) as client:
            yield cluster, client
    finally:
        cluster.close()


def inc(x: int) -> int:
    return x + 1


def slow_inc(x: int) -> int:  # long enough never to run on the loop's thread
    import time

    time.sleep(0.002)
    return x + 1


def record_events(dask_worker: Any) -> None:
    """Keep every event the worker's state machine handles (on the loop, which owns it)."""

    def install() -> None:
        state = dask_worker.state
        seen = dask_worker.seen_events = []
        handle = state.handle

        def recording(event: Any) -> list:
            seen.append(event)
            return handle(event)

        state.handle = recording

    dask_worker.loop.call(install)


def stop_recording(dask_worker: Any) -> list:
    def uninstall() -> list:
        del dask_worker.state.handle  # the method again
        return [(type(e).__name__, e.stimulus_id) for e in dask_worker.seen_events]

    return dask_worker.loop.call(uninstall)


@pytest.mark.parametrize("fn", [inc, slow_inc], ids=["on-the-loop", "on-a-thread"])
def test_the_workers_own_events_carry_a_stimulus_id(cluster_client, road, fn):
    _, client = cluster_client
    client.run(record_events)
    try:
        futures = road.calls(client, fn, 40)
        assert client.gather(futures) == [i + 1 for i in range(40)]
    finally:
        seen = client.run(stop_recording)
    names = {cls.__name__ for cls in MADE_HERE}
    made_here = [(kind, sid) for events in seen.values() for kind, sid in events if kind in names]
    kinds = {kind for kind, _ in made_here}
    # the road's own events: a task's result, or the ranges' threads ending
    assert ("ExecuteSuccess" in kinds) is (road.name == "tasks"), kinds
    assert ("RangeThreadDone" in kinds) is (road.name == "bulk"), kinds
    unnamed = [kind for kind, sid in made_here if not sid]
    assert not unnamed, f"events made by the worker without a stimulus_id: {unnamed}"
    for kind, sid in made_here:
        assert sid.rpartition("-")[2].isdigit(), (kind, sid)
    ids = [sid for kind, sid in made_here if kind not in ("RangesWaiting",)]
    assert len(ids) == len(set(ids)), "a stimulus_id names one event"
