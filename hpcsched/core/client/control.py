"""The client's side of cluster control: requests to the scheduler and their answers.

``Client.run``, ``run_on_scheduler``, ``who_has``, ``has_what``, ``nthreads``
and ``upload_file`` are thin methods calling these functions, with
distributed's signatures and results
(https://distributed.dask.org/en/stable/api.html#client). The scheduler's
side is :mod:`hpcsched.core.scheduler.control`.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from hpcsched.core.client.submission import as_list
from hpcsched.core.protocol import messages as pc
from hpcsched.core.protocol.client import Rebalance
from hpcsched.core.protocol.serialize import dumps_function, dumps_object, loads_object

if TYPE_CHECKING:
    from hpcsched.core.client.client import Client

ON_ERROR = ("raise", "return", "ignore")


def outcome(entry: Any) -> tuple[bool, Any]:
    """(ok, result or exception) of one answer: a ``control-reply`` record, or one
    worker's ``{"status", "result" | "exception", "traceback"}`` of its ``results``."""
    if isinstance(entry, dict):
        status, result = entry.get("status"), entry.get("result")
        exception, traceback = entry.get("exception"), entry.get("traceback")
    else:
        status, result = entry.status, entry.result
        exception, traceback = entry.exception, entry.traceback
    if status == "OK":
        return True, loads_object(result) if result is not None else None
    exc = loads_object(exception) if exception else \
        RuntimeError(str(traceback or "unknown error"))
    if not isinstance(exc, BaseException):
        exc = RuntimeError(repr(exc))
    return False, exc


def _call_fields(function: Any, args: tuple, kwargs: dict) -> dict:
    if not callable(function):
        raise TypeError(f"expected a callable, got {type(function).__name__}")
    return {"function": dumps_function(function), "args": dumps_object(tuple(args)),
            "kwargs": dumps_object(dict(kwargs))}


def results(reply: Any) -> dict:
    """The per-worker answers of a ``control-reply``: ``{worker: {status, ...}}``."""
    return reply.results or {}


def run(client: Client, function: Any, args: tuple, kwargs: dict, *, workers: Any = None,
        wait: bool = True, on_error: str = "raise", timeout: float | None = None,
        nanny: bool = False) -> Any:
    """``function(*args, **kwargs)`` on every worker (or ``workers``): {address: result}.

    ``nanny``: in each worker's nanny instead; the worker forwards the call to it over the
    link nanny plugins use (:func:`hpcsched.core.worker.nanny.run_in_nanny`)."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if nanny:
        if not callable(function):
            raise TypeError(f"expected a callable, got {type(function).__name__}")
        from hpcsched.core.worker.nanny import run_in_nanny  # not at the top: nanny imports us

        call = dumps_object((function, tuple(args), dict(kwargs)))
        function, args, kwargs = run_in_nanny, (call,), {}
    reply = client.request(pc.Run("", wait=bool(wait), workers=as_list(workers),
                                  **_call_fields(function, args, kwargs)), timeout)
    out = {}
    for address, entry in sorted(results(reply).items()):
        ok, value = outcome(entry)
        if not ok and on_error == "raise":
            raise value
        if ok or on_error == "return":
            out[address] = value
    return out if wait else None


def run_on_scheduler(client: Client, function: Any, args: tuple, kwargs: dict,
                     timeout: float | None = None) -> Any:
    reply = client.request(pc.RunOnScheduler("", **_call_fields(function, args, kwargs)),
                           timeout)
    ok, value = outcome(reply)
    if not ok:
        raise value
    return value


def who_has(client: Client, futures: Any = None, timeout: float | None = 30.0) -> dict:
    if futures is not None and not isinstance(futures, (list, tuple, set)):
        futures = [futures]
    keys = None if futures is None else [getattr(f, "key", f) for f in futures]
    return client.request(pc.WhoHas("", keys), timeout).result


def has_what(client: Client, workers: Any = None, timeout: float | None = 30.0) -> dict:
    return client.request(pc.HasWhat("", as_list(workers)), timeout).result


def nthreads(client: Client, workers: Any = None, timeout: float | None = 30.0) -> dict:
    return client.request(pc.NThreads("", as_list(workers)), timeout).result


def upload_file(client: Client, filename: str | os.PathLike, load: bool = True,
                timeout: float | None = 120.0) -> dict:
    """Send a file to every worker (and to every worker that joins later): {address: path}."""
    path = os.fspath(filename)
    with open(path, "rb") as f:
        data = f.read()
    reply = client.request(pc.UploadFile("", os.path.basename(path), data, bool(load)),
                           timeout)
    out = {}
    for address, entry in sorted(results(reply).items()):
        ok, value = outcome(entry)
        if not ok:
            raise value
        out[address] = value
    return out


def rebalance(client: Client, futures: Any = None, workers: Any = None,
              timeout: float | None = 120.0) -> None:
    """Spread the futures' data (all data if None) evenly over ``workers`` (all if None);
    returns once every moved key's old copy is dropped (the new one is held first)."""
    if futures is not None and not isinstance(futures, (list, tuple, set)):
        futures = [futures]
    keys = None if futures is None else [getattr(f, "key", f) for f in futures]
    client.request(Rebalance("", keys, as_list(workers)), timeout)


def replicate(client: Client, futures: Any, n: int | None = None, workers: Any = None,
              timeout: float | None = 120.0) -> None:
    """Copy the futures' data onto ``n`` workers (all: None), of ``workers`` if given; returns
    once the scheduler sees every copy (``TimeoutError`` after ``timeout`` seconds)."""
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError(f"n must be None or a positive integer, got {n!r}")
    if not isinstance(futures, (list, tuple, set)):
        futures = [futures]
    for f in futures:
        f.result(timeout)
    keys = [getattr(f, "key", f) for f in futures]
    wanted = client.request(pc.Replicate("", keys, n, as_list(workers)), timeout).result
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.02
    while True:
        has = who_has(client, list(wanted))
        if all(set(targets) <= set(has.get(k, ())) for k, targets in wanted.items()):
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"replicas not made within {timeout}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def restart(client: Client, timeout: float | None = 120.0, wait_for_workers: bool = True) -> None:
    """Cancel every task and reset the workers' plugins; see ``Client.restart``."""
    n = len(client.scheduler_info()["workers"])
    client.future_table.cancel(list(client.futures.values()))
    reply = client.request(pc.Restart(""), timeout)
    for entry in results(reply).values():
        ok, value = outcome(entry)
        if not ok:
            raise value
    if wait_for_workers:
        client.wait_for_workers(n, timeout=timeout)


def wait_for_workers(client: Client, n_workers: int = 1, timeout: float | None = None) -> None:
    """Poll the scheduler until ``n_workers`` workers have joined; a cluster that can tell
    (``check_failures``) raises early when its workers failed to start."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.02
    while True:
        n = len(client.scheduler_info()["workers"])
        if n >= n_workers:
            return
        if client.cluster is not None and hasattr(client.cluster, "check_failures"):
            client.cluster.check_failures()
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"only {n} of {n_workers} workers joined within {timeout}s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
