"""A closed cluster lets go of everything it had: no object of its stays reachable.

Notebooks make and close clusters many times, batch sessions run for hours: once a
LocalCluster and its Client are closed and dropped, one ``gc.collect()`` frees the
scheduler, its state (tasks, workers), the in-process workers and the client, and the
threads they started are gone -- also when the client was left open and only its cluster
was closed. Only objects of this process are checked (worker processes are the
autouse leak check's).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import weakref

import pytest

from hpcsched import _lazy
from hpcsched.core.client.client import Client, default_client
from tests.conftest import _local_cluster, wait_until

CYCLES = 3


def inc(x):
    return x + 1


def new_threads(before: set[threading.Thread]) -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t not in before and t.is_alive())


def use(cluster, close_client: bool) -> list[weakref.ref]:
    """Compute on ``cluster`` with a client, close them; weak references to what they held."""
    client = Client(cluster)  # the default client, and dask's scheduler when dask is loaded
    try:
        assert client.submit(inc, 1).result(timeout=30) == 2
        assert client.gather(client.map(inc, range(10))) == list(range(1, 11))
        with pytest.raises(ZeroDivisionError):
            client.submit(lambda: 1 / 0).result(timeout=30)
        scheduler = cluster.scheduler
        assert scheduler.state.tasks  # the futures above hold theirs
        # the client's exit hook too: atexit lets go of it when the client closes
        held = [scheduler, scheduler.state, scheduler.loop, cluster, client, client._at_exit,
                *cluster._threads.values()]
    finally:
        if close_client:
            client.close()
        cluster.close()
    return [weakref.ref(o) for o in held]


def collected(refs: list[weakref.ref]) -> list[str]:
    """What is still alive after one collection."""
    gc.collect()
    return [type(o).__name__ for o in (r() for r in refs) if o is not None]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_closed_clusters_and_clients_are_collected_and_leave_no_thread(processes):
    before = set(threading.enumerate())
    refs: list[weakref.ref] = []
    for _ in range(CYCLES):
        # with a dashboard: its server and threads go too
        refs += use(_local_cluster(n_workers=1, processes=processes,
                                   dashboard_address="127.0.0.1:0"), close_client=True)
        # the threads of this cluster, its workers and its client end with them (idle
        # task threads and the callback thread a moment after the close returns)
        wait_until(lambda: not [n for n in new_threads(before) if n != "hpcsched-tcp-io"],
                   timeout=15, what="the threads of a closed cluster to end")
    # the I/O thread shared by every TCP connection ends after its last one
    wait_until(lambda: not new_threads(before), timeout=10, what="no thread left")
    assert collected(refs) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_a_client_left_open_lets_go_of_its_closed_cluster(processes):
    with contextlib.suppress(ImportError):
        import dask.config  # noqa: F401 - the client becomes dask's scheduler: a hold too
    before = set(threading.enumerate())
    refs: list[weakref.ref] = []
    for _ in range(CYCLES):
        refs += use(_local_cluster(n_workers=1, processes=processes, dashboard_address=None),
                    close_client=False)
    # told its scheduler closes, the client ends its threads on its own
    wait_until(lambda: not new_threads(before), timeout=15, what="the clients' threads to end")
    assert default_client() is None
    assert collected(refs) == []


def test_a_callback_forgotten_no_longer_waits_for_its_module():
    """What a client prepares for dask's import is forgotten when the client closes: a
    program that never imports dask would keep one per client."""
    module = "tests_launchers_test_release_never_imported"
    assert module not in sys.modules
    called = []
    one, other = (lambda: called.append(1)), (lambda: called.append(2))
    _lazy.when_imported(module, one)
    _lazy.when_imported(module, other)
    _lazy.not_when_imported(module, one)
    assert _lazy._pending[module] == [other]
    _lazy.not_when_imported(module, other)
    _lazy.not_when_imported(module, other)  # forgotten already: nothing happens
    assert module not in _lazy._pending
    if not _lazy._pending:  # no module awaited: the import hook is gone
        assert _lazy._finder not in sys.meta_path
    assert called == []


@pytest.mark.timeout(60)
def test_a_closed_cluster_kept_holds_no_task_or_worker():
    """A closed cluster still referenced (a notebook's output history keeps what a cell
    showed) holds none of the tasks of the client left open, nor their arguments, nor
    its workers."""
    cluster = _local_cluster(n_workers=1, processes=False, dashboard_address=None)
    client = Client(cluster, set_as_default=False)
    try:
        payload = bytearray(1_000_000)
        futures = [client.submit(len, payload, pure=False) for _ in range(3)]
        assert [f.result(timeout=30) for f in futures] == [1_000_000] * 3
        state = weakref.ref(cluster.scheduler.state)
        assert cluster.scheduler.state.tasks and cluster.scheduler.state.workers
    finally:
        cluster.close()
        client.close()
    assert not cluster.scheduler.state.tasks and not cluster.scheduler.state.workers
    assert collected([state]) == []
