"""Tasks that submit tasks, as dask.distributed's "Launch Tasks from Tasks" shows them.

Every test runs over TCP (a LocalCluster of ``hpcsched worker`` processes) and
over ``inproc://`` (worker threads in this process): one worker with ONE thread,
so that a task waiting on its subtasks without giving its thread back would
wait forever (each test has a timeout).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from hpcsched import Client, LocalCluster, get_client, get_worker, rejoin, secede, worker_client
from tests.conftest import wait_until, worker_env

pytestmark = pytest.mark.timeout(120)

WAIT = 60


@pytest.fixture(scope="module", params=["tcp", "inproc"])
def one_thread(request: pytest.FixtureRequest) -> Iterator[tuple[LocalCluster, Client]]:
    cluster = LocalCluster(n_workers=1, threads_per_worker=1,
                           processes=request.param == "tcp", timeout=60,
                           worker_env=worker_env())
    try:
        with Client(cluster, set_as_default=False) as client:
            yield cluster, client
    finally:
        cluster.close()


def inc(x):
    return x + 1


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
    a = client.submit(fib_secede, n - 1)
    b = client.submit(fib_secede, n - 2)
    secede()
    x, y = client.gather([a, b])
    rejoin()
    return x + y


def test_recursive_fib_with_worker_client_on_one_thread(one_thread):
    _, client = one_thread
    assert client.submit(fib, 8).result(timeout=WAIT) == 21


def test_recursive_fib_with_get_client_and_secede_on_one_thread(one_thread):
    _, client = one_thread
    assert client.submit(fib_secede, 7).result(timeout=WAIT) == 13


def whoami(_):
    c = get_client()
    return c.id, c.scheduler_address, get_worker().address


def test_get_client_is_one_client_per_worker_on_the_tasks_cluster(one_thread):
    cluster, client = one_thread
    results = client.gather(client.map(whoami, range(4)), timeout=WAIT)
    assert len({r[0] for r in results}) == 1  # reused by every task of the worker
    assert {r[1] for r in results} == {cluster.scheduler_address}
    assert {r[2] for r in results} == set(client.scheduler_info()["workers"])


def plain_client_submits(x):
    # Client() inside a task reaches the task's own cluster; waiting on its futures
    # needs the task's thread slot given back (one thread)
    with Client() as c:
        fut = c.submit(inc, x)
        secede()
        return fut.result(timeout=30), c.scheduler_address


def test_plain_client_inside_a_task_connects_to_the_tasks_scheduler(one_thread):
    cluster, client = one_thread
    value, address = client.submit(plain_client_submits, 1).result(timeout=WAIT)
    assert value == 2
    assert address == cluster.scheduler_address  # not a new LocalCluster of its own
    assert len(client.scheduler_info()["workers"]) == 1


def short_or_submitting(x, submit):
    if not submit:
        return threading.current_thread().name
    with worker_client() as c:
        return c.submit(inc, x).result(timeout=30)


def test_short_task_group_on_the_loop_thread_may_still_get_a_client(one_thread):
    """Tasks known to take well under a millisecond run on the worker's loop thread, where
    blocking for a client would stall the worker; such a task is moved to a task thread."""
    _, client = one_thread
    batches = iter(range(0, 3000, 30))
    held = []  # the scheduler keeps a group's measured durations while it holds its tasks

    def group_runs_on_the_loop() -> bool:  # once its measured durations are short
        start = next(batches)
        futures = [client.submit(short_or_submitting, i, False, key=f"short-{i}")
                   for i in range(start, start + 30)]
        held.extend(futures)
        # the loop's iteration runs on its own thread, or on the transport's thread that
        # handed it the messages (the TCP I/O thread): either way not on a task thread
        return client.gather(futures, timeout=WAIT)[-1].startswith(("hpcsched-worker",
                                                                    "hpcsched-tcp-io"))

    wait_until(group_runs_on_the_loop, timeout=WAIT, what="short tasks on the loop thread")
    fut = client.submit(short_or_submitting, 41, True, key="short-99999")
    assert fut.result(timeout=WAIT) == 42
    more = client.gather([client.submit(short_or_submitting, i, False, key=f"short-{i}")
                          for i in range(5000, 5003)], timeout=WAIT)
    assert all(n.startswith("hpcsched-task") for n in more), more  # the group stays off it


def nested_worker_clients(n):
    with worker_client() as c:
        return c.submit(inc, n).result(timeout=30)


def test_many_seceded_tasks_at_once_do_not_starve_their_subtasks(one_thread):
    _, client = one_thread
    results = client.gather(client.map(nested_worker_clients, range(8)), timeout=WAIT)
    assert results == [n + 1 for n in range(8)]


def test_outside_a_task_get_worker_and_secede_refuse_clearly():
    with pytest.raises(ValueError, match="No worker found"):
        get_worker()
    with pytest.raises(ValueError, match="inside a task"):
        secede()
    with pytest.raises(ValueError, match="inside a task"):
        rejoin()
