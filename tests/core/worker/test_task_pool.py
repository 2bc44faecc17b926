"""The worker's task pool: every call runs at once, the pool shrinks back when idle."""

from __future__ import annotations

import threading

import pytest

from hpcsched.core.worker.task_pool import TaskPool
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(30)


def test_a_blocked_call_does_not_hold_up_the_next_and_the_pool_shrinks_back():
    pool = TaskPool(1, "test-pool")
    release, second_ran = threading.Event(), threading.Event()
    try:
        pool.submit(release.wait, 20)  # as a seceded task waiting on its subtasks
        pool.submit(second_ran.set)
        assert second_ran.wait(10)  # on a thread of its own: the pool grew
        assert pool.nthreads == 2
        release.set()
        wait_until(lambda: pool.nthreads == 1, what="the pool back to one idle thread")
        # the idle thread is reused
        third = threading.Event()
        pool.submit(third.set)
        assert third.wait(10) and pool.nthreads == 1
    finally:
        release.set()
        pool.shutdown()
    wait_until(lambda: pool.nthreads == 0, what="idle threads gone after shutdown")
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(print)


def test_many_calls_at_once_all_run():
    pool = TaskPool(2, "test-pool")
    done = threading.Semaphore(0)
    try:
        for _ in range(50):
            pool.submit(done.release)
        for _ in range(50):
            assert done.acquire(timeout=10)
    finally:
        pool.shutdown()
    wait_until(lambda: pool.nthreads == 0, what="idle threads gone after shutdown")
