"""Coordination primitives (Lock, Semaphore, Event, Variable, Queue, MultiLock), run the
same over TCP (LocalCluster) and under mpiexec: ``check(client, tmp_dir, add_worker)``.

Nothing here depends on timing: a wait that must end is given a generous timeout,
a wait that must not end a short one (its failure is the expected outcome).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from hpcsched import Event, Lock, MultiLock, Queue, Semaphore, Variable


def raises(exc: type, fn: Any, *args: Any, **kwargs: Any) -> BaseException:
    try:
        fn(*args, **kwargs)
    except exc as e:
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def known(client: Any, key: Any) -> bool:
    """Whether the scheduler still holds ``key`` in memory (asked after every message this
    client sent before, releases included: one sender, one scheduler loop)."""
    return client.run_on_scheduler(
        lambda dask_scheduler: key in dask_scheduler.state.tasks and
        dask_scheduler.state.tasks[key].state == "memory")


def until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{predicate} still false after {timeout}s")
        time.sleep(0.05)


def check(client: Any, tmp_dir: str, add_worker: Any) -> None:
    workers = client.scheduler_info()["workers"]
    addr = sorted(workers)[0]
    nthreads = workers[addr]["nthreads"]
    Client = type(client)

    # ---- Lock
    lock = Lock("conf-lock")
    assert lock.acquire() and lock.locked()
    assert Lock("conf-lock").acquire(timeout=0.2) is False
    assert Lock("conf-lock").acquire(blocking=False) is False
    raises(ValueError, Lock("conf-lock").acquire, blocking=False, timeout=1)
    lock.release()
    assert not lock.locked()
    raises(RuntimeError, lock.release)
    with Lock("conf-lock"):
        assert Lock("conf-lock").locked()
    assert Lock().name != Lock().name

    # tasks take the lock in turn: each adds one to a Variable under it
    def add_one(i: int) -> int:
        with Lock("conf-count"):
            v = Variable("conf-count")
            v.set(v.get(timeout=30) + 1)
        return i

    Variable("conf-count").set(0)
    assert client.gather(client.map(add_one, range(8), pure=False)) == list(range(8))
    assert Variable("conf-count").get(timeout=5) == 8

    # a lock held by a client that leaves is released
    other = Client(client.scheduler_address, security=client.security,
                   set_as_default=False)
    assert Lock("conf-left", client=other).acquire(timeout=5)
    assert Lock("conf-left").locked()
    other.close()
    left = Lock("conf-left")
    assert left.acquire(timeout=30)
    raises(RuntimeError, Lock("conf-left").release)  # a fresh object holds nothing
    left.release()

    # ---- Semaphore
    sem = Semaphore(max_leases=2, name="conf-sem")
    assert sem.acquire() and sem.acquire(timeout="1s")
    assert sem.get_value() == 2
    assert Semaphore(2, "conf-sem").acquire(timeout="200ms") is False
    raises(ValueError, Semaphore(3, "conf-sem").acquire, timeout=1)
    assert sem.release() and sem.get_value() == 1
    sem.release()
    raises(RuntimeError, sem.release)
    raises(ValueError, Semaphore, 0)

    # ---- Event; waiting tasks give their thread back: every thread of one worker waits,
    # and the task that sets the event still runs there
    ev = Event("conf-ev")
    assert not ev.is_set() and ev.wait(timeout=0.2) is False
    waiters = [client.submit(lambda: Event("conf-ev").wait(timeout=120), workers=[addr],
                             pure=False) for _ in range(nthreads + 1)]

    def set_event() -> bool:
        Event("conf-ev").set()
        return True

    assert client.submit(set_event, workers=[addr], pure=False).result(120)
    assert client.gather(waiters) == [True] * (nthreads + 1)
    assert ev.is_set() and ev.wait(timeout=1)
    ev.clear()
    assert not ev.is_set()

    # ---- Variable: waits for a value; futures stay alive while stored
    var = Variable("conf-var")
    raises(TimeoutError, var.get, timeout=0.2)
    getters = [client.submit(lambda: Variable("conf-var").get(timeout=120), workers=[addr],
                             pure=False) for _ in range(nthreads + 1)]
    setter = client.submit(lambda: Variable("conf-var").set({"x": 1}), workers=[addr],
                           pure=False)
    assert client.gather(getters) == [{"x": 1}] * (nthreads + 1)
    setter.result(30)
    fut = client.submit(lambda: 40 + 2, pure=False)
    key = fut.key
    assert fut.result(30) == 42
    var.set(fut)
    del fut
    gc.collect()
    assert known(client, key), "a future stored in a Variable was released"
    got = var.get(timeout=5)
    assert got.key == key and got.result(30) == 42
    assert client.submit(lambda: Variable("conf-var").get(timeout=5).result(), pure=False
                         ).result(30) == 42
    del got
    gc.collect()
    var.delete()
    until(lambda: not known(client, key))
    raises(TimeoutError, var.get, timeout=0)

    # ---- Queue
    q = Queue("conf-q", maxsize=2)
    raises(TimeoutError, q.get, timeout=0.2)
    q.put(1)
    q.put("two", timeout=1)
    raises(TimeoutError, q.put, 3, timeout=0.2)
    assert q.qsize() == 2 and q.get() == 1 and q.get(timeout=1) == "two"
    for i in range(2):
        q.put(i)
    assert q.get(batch=True) == [0, 1] and q.get(batch=True) == []
    getters = [client.submit(lambda: Queue("conf-q", maxsize=2).get(timeout=120),
                             workers=[addr], pure=False) for _ in range(nthreads + 1)]

    def fill(n: int) -> int:
        qq = Queue("conf-q", maxsize=2)
        for i in range(n):
            qq.put(i, timeout=120)
        return n

    assert client.submit(fill, nthreads + 1, workers=[addr], pure=False).result(120)
    assert sorted(client.gather(getters)) == list(range(nthreads + 1))
    batch = client.submit(lambda: Queue("conf-q", maxsize=2).get(batch=2, timeout=120),
                          pure=False)
    q.put("a")
    q.put("b")
    assert batch.result(120) == ["a", "b"]
    fut = client.submit(lambda: "queued", pure=False)
    key = fut.key
    assert fut.result(30) == "queued"
    q.put(fut)
    del fut
    gc.collect()
    assert known(client, key), "a future put in a Queue was released"
    got = q.get(timeout=5)
    assert got.result(30) == "queued"
    del got
    gc.collect()
    until(lambda: not known(client, key))
    raises(ValueError, Queue, maxsize=-1)

    # values and events outlive the client that made them
    other = Client(client.scheduler_address, security=client.security,
                   set_as_default=False)
    Variable("conf-kept", client=other).set(other.submit(lambda: 7, pure=False))
    Queue("conf-kept", client=other).put("kept")
    Event("conf-kept", client=other).set()
    other.close()
    assert Variable("conf-kept").get(timeout=5).result(30) == 7
    assert Queue("conf-kept").get(timeout=5) == "kept"
    assert Event("conf-kept").is_set()
    Variable("conf-kept").delete()

    # ---- MultiLock
    ml = MultiLock(["conf-a", "conf-b"])
    assert ml.acquire(timeout=5)
    assert MultiLock(["conf-b", "conf-c"]).acquire(timeout=0.2) is False
    one_of = MultiLock(["conf-b", "conf-c"])
    assert one_of.acquire(num_locks=1, timeout=5)  # conf-c is free
    ml.release()
    one_of.release()
    raises(ValueError, one_of.release)
    with MultiLock(["conf-a", "conf-b", "conf-c"]):
        assert MultiLock(["conf-a"]).acquire(blocking=False) is False
    # a waiting task gives its thread back
    held = MultiLock(["conf-m"])
    assert held.acquire()

    def take() -> bool:
        m = MultiLock(["conf-m"])
        ok = m.acquire(timeout=120)
        if ok:
            m.release()
        return ok

    waiting = [client.submit(take, workers=[addr], pure=False) for _ in range(nthreads + 1)]
    assert client.submit(lambda: 1, workers=[addr], pure=False).result(120) == 1
    held.release()
    assert client.gather(waiting) == [True] * (nthreads + 1)

    # ---- a malformed request drops its sender alone
    bad = Client(client.scheduler_address, security=client.security,
                   set_as_default=False)
    try:
        bad.scheduler_comm.send({"op": "lock-acquire", "request_id": "x",
                                 "name": "conf-bad", "lease": 5, "timeout": -1})
        until(lambda: bad.status != "running")
    finally:
        bad.close()
    assert not Lock("conf-bad").locked()
    assert client.submit(lambda: 2, pure=False).result(30) == 2

    # a task already seceded (worker_client) stays seceded across a wait: it still waits
    # on futures it submits without holding a thread slot
    def nested() -> int:
        from hpcsched import worker_client

        with worker_client() as c:
            assert Event("conf-nested").wait(timeout=120)
            fs = [c.submit(lambda i: i, i, workers=[addr], pure=False)
                  for i in range(nthreads + 1)]
            return sum(c.gather(fs, timeout=60))

    Event("conf-nested").set()
    tasks = [client.submit(nested, workers=[addr], pure=False) for _ in range(nthreads)]
    assert client.gather(tasks) == [sum(range(nthreads + 1))] * nthreads
