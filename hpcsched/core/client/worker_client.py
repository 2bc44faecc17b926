"""Tasks that submit tasks: the client inside a task.

``get_client`` and ``worker_client``, with dask.distributed's names and
meaning ("Launch Tasks from Tasks" in its documentation); ``get_worker``,
``secede`` and ``rejoin`` are the worker's (:mod:`hpcsched.core.worker.context`)::

    from hpcsched import Client, worker_client

    def fib(n):
        if n < 2:
            return n
        with worker_client() as client:      # gives this task's thread back meanwhile
            a, b = client.submit(fib, n - 1), client.submit(fib, n - 2)
            return a.result() + b.result()

    with Client() as client:
        print(client.submit(fib, 10).result())

Inside a task, :func:`get_client` returns the client of the worker running it,
connected to that worker's scheduler with the worker's credentials (over TCP,
``inproc://`` or MPI alike); one per worker, made on first use, reused by every
task, closed with the worker (the worker holds it: ``Worker.task_client``).
``Client()`` without an address inside a task connects to the same scheduler (a
new client the caller owns).

This module sits below :class:`~hpcsched.core.client.client.Client` (the
primitives and dask's scheduler, which the Client uses, call
:func:`get_client`), so it makes a Client through :mod:`hpcsched.core.seams`
rather than by importing it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hpcsched.core import seams
from hpcsched.core.worker.context import (  # noqa: F401 - the tasks' API, in one place
    TaskNeedsThread,
    current,
    get_task_gpus,
    get_worker,
    in_task,
    off_loop,
    rejoin,
    secede,
    seceded,
    task_env,
)


def get_client(address: str | None = None, timeout: float | None = None) -> Any:
    """A :class:`~hpcsched.core.client.client.Client` of the cluster this task runs on.

    Inside a task: the worker's own client (made on first use, then shared by
    every task of the worker). Outside a task: the default client (the last
    one created with ``set_as_default=True``), or a new client for ``address``.
    Raises ``ValueError`` when there is none and no address.

    A task that then waits for the futures it submits should :func:`secede`
    first (or use :func:`worker_client`), or it may wait forever for a thread
    slot it holds itself.
    """
    running = current()
    if running is not None and (address is None or address == running.worker.scheduler_address):
        off_loop(running, "get_client()")
        worker = running.worker

        def make() -> Any:
            return seams.resolve("client")(
                worker.scheduler_address, security=worker.security, timeout=timeout,
                set_as_default=False, name=f"worker-{worker.name or 'w'}")

        return worker.task_client(make)
    default = seams.resolve("default-client")()
    if default is not None and (address is None or address == default.scheduler_address):
        return default
    if address is not None:
        return seams.resolve("client")(address, timeout=timeout)
    raise ValueError("No global client found and no address provided: create a Client "
                     "first, or call get_client() inside a task")


@contextlib.contextmanager
def worker_client(timeout: float | None = None, separate_thread: bool = True
                  ) -> Iterator[Any]:
    """The worker's client for the block, with the task seceded meanwhile.

    ``separate_thread=False`` keeps the task in the thread pool (it may then
    deadlock a worker whose every thread waits so). Example::

        def total(parts):
            with worker_client() as client:
                futures = client.map(load, parts)
                return sum(client.gather(futures))
    """
    client = get_client(timeout=timeout)
    if separate_thread:
        secede()
    try:
        yield client
    finally:
        if separate_thread:
            rejoin()
