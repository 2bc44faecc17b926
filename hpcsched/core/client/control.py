"""The client's side of cluster control: requests to the scheduler and their answers.

``Client.run``, ``run_on_scheduler``, ``who_has``, ``has_what``, ``processing``, ``nthreads``,
``upload_file``, ``replicate``, ``rebalance``, ``restart``, ``shutdown`` and
``wait_for_workers`` are thin methods over a :class:`ClusterRequests`, with
distributed's signatures and results
(https://distributed.dask.org/en/stable/api.html#client). It needs the
client's connection (requests and their replies), its future table
(``restart`` cancels every future) and the cluster the client started, if
any (to report workers that failed to start). The scheduler's side is
:mod:`hpcsched.core.scheduler.control`.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from hpcsched.core.client.submission import as_list
from hpcsched.core.protocol import messages as pc
from hpcsched.core.protocol.calls import outcome
from hpcsched.core.protocol.serialize import dumps_function, dumps_object
from hpcsched.core.units import parse_interval

if TYPE_CHECKING:
    from hpcsched.core.client.connection import SchedulerConnection
    from hpcsched.core.client.future_state import FutureTable

ON_ERROR = ("raise", "return", "ignore")


def _call_fields(function: Any, args: tuple, kwargs: dict) -> dict:
    if not callable(function):
        raise TypeError(f"expected a callable, got {type(function).__name__}")
    return {"function": dumps_function(function), "args": dumps_object(tuple(args)),
            "kwargs": dumps_object(dict(kwargs))}


def results(reply: Any) -> dict:
    """The per-worker answers of a ``control-reply``: ``{worker: {status, ...}}``."""
    return reply.results or {}


def _keys(futures: Any) -> list | None:
    if futures is None:
        return None
    if not isinstance(futures, (list, tuple, set)):
        futures = [futures]
    return [getattr(f, "key", f) for f in futures]


class ClusterRequests:
    """Cluster control over the connection ``conn`` (module docstring)."""

    def __init__(self, conn: SchedulerConnection, table: FutureTable, cluster: Any = None):
        self.conn = conn
        self.table = table
        self.cluster = cluster

    def scheduler_info(self, timeout: float | None = 30.0) -> dict:
        """The scheduler's description of itself and its workers (``Client.scheduler_info``)."""
        return self.conn.request(pc.SchedulerInfo(""), timeout).info

    def run(self, function: Any, args: tuple, kwargs: dict, *, workers: Any = None,
            wait: bool = True, on_error: str = "raise", timeout: float | None = None,
            nanny: bool = False) -> Any:
        """``function(*args, **kwargs)`` on every worker (or ``workers``): {address: result}.

        ``nanny``: in each worker's nanny instead; the worker forwards the call to it over
        the link nanny plugins use (:func:`hpcsched.core.worker.nanny.run_in_nanny`)."""
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if nanny:
            if not callable(function):
                raise TypeError(f"expected a callable, got {type(function).__name__}")
            call = dumps_object((function, tuple(args), dict(kwargs)))
            from hpcsched.core.worker.nanny import run_in_nanny  # subprocess: imported when used

            function, args, kwargs = run_in_nanny, (call,), {}
        reply = self.conn.request(pc.Run("", wait=bool(wait), workers=as_list(workers),
                                         **_call_fields(function, args, kwargs)), timeout)
        out = {}
        for address, entry in sorted(results(reply).items()):
            ok, value = outcome(entry)
            if not ok and on_error == "raise":
                raise value
            if ok or on_error == "return":
                out[address] = value
        return out if wait else None

    def run_on_scheduler(self, function: Any, args: tuple, kwargs: dict,
                         timeout: float | None = None) -> Any:
        reply = self.conn.request(pc.RunOnScheduler("", **_call_fields(function, args, kwargs)),
                                  timeout)
        ok, value = outcome(reply)
        if not ok:
            raise value
        return value

    def who_has(self, futures: Any = None, timeout: float | None = 30.0) -> dict:
        return self.conn.request(pc.WhoHas("", _keys(futures)), timeout).result

    def has_what(self, workers: Any = None, timeout: float | None = 30.0) -> dict:
        return self.conn.request(pc.HasWhat("", as_list(workers)), timeout).result

    def processing(self, workers: Any = None, timeout: float | None = 30.0) -> dict:
        return self.conn.request(pc.Processing("", as_list(workers)), timeout).result

    def nthreads(self, workers: Any = None, timeout: float | None = 30.0) -> dict:
        return self.conn.request(pc.NThreads("", as_list(workers)), timeout).result

    def upload_file(self, filename: str | os.PathLike, load: bool = True,
                    timeout: float | None = 120.0) -> dict:
        """Send a file to every worker (and to every worker that joins later):
        {address: path}."""
        path = os.fspath(filename)
        with open(path, "rb") as f:
            data = f.read()
        reply = self.conn.request(pc.UploadFile("", os.path.basename(path), data, bool(load)),
                                  timeout)
        out = {}
        for address, entry in sorted(results(reply).items()):
            ok, value = outcome(entry)
            if not ok:
                raise value
            out[address] = value
        return out

    def rebalance(self, futures: Any = None, workers: Any = None,
                  timeout: float | None = 120.0) -> None:
        """Spread the futures' data (all data if None) evenly over ``workers`` (all if None);
        returns once every moved key's old copy is dropped (the new one is held first)."""
        self.conn.request(pc.Rebalance("", _keys(futures), as_list(workers)), timeout)

    def replicate(self, futures: Any, n: int | None = None, workers: Any = None,
                  timeout: float | None = 120.0) -> None:
        """Copy the futures' data onto ``n`` workers (all: None), of ``workers`` if given;
        returns once the scheduler sees every copy (``TimeoutError`` after ``timeout``)."""
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"n must be None or a positive integer, got {n!r}")
        if not isinstance(futures, (list, tuple, set)):
            futures = [futures]
        for f in futures:
            f.result(timeout)
        keys = [getattr(f, "key", f) for f in futures]
        wanted = self.conn.request(pc.Replicate("", keys, n, as_list(workers)), timeout).result
        if timeout is not None:  # seconds, or as dask writes it ("30s", "2m")
            timeout = parse_interval(timeout, "timeout", zero=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        while True:
            has = self.who_has(list(wanted))
            if all(set(targets) <= set(has.get(k, ())) for k, targets in wanted.items()):
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"replicas not made within {timeout}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def restart(self, timeout: float | None = 120.0, wait_for_workers: bool = True) -> None:
        """Cancel every task and reset the workers' plugins; see ``Client.restart``."""
        n = len(self.scheduler_info()["workers"])
        self.table.cancel(list(self.table.states.values()))
        reply = self.conn.request(pc.Restart(""), timeout)
        for entry in results(reply).values():
            ok, value = outcome(entry)
            if not ok:
                raise value
        if wait_for_workers:
            self.wait_for_workers(n, timeout=timeout)

    def shutdown(self, timeout: float | None) -> None:
        """Ask the process running the scheduler to end the cluster (``Client.shutdown``)."""
        self.conn.request(pc.Shutdown(""), timeout)

    def wait_for_workers(self, n_workers: int = 1, timeout: float | str | None = None) -> None:
        """Wait until ``n_workers`` workers have joined. A client made from a cluster asks the
        cluster, as dask.distributed's ``Client.wait_for_workers`` does: a batch cluster
        raises early, naming why, when its jobs die before a worker connects."""
        if timeout is not None:  # seconds, or as dask writes it ("30s", "2m")
            timeout = parse_interval(timeout, "timeout", zero=True)
        if self.cluster is not None and hasattr(self.cluster, "wait_for_workers"):
            self.cluster.wait_for_workers(n_workers, timeout)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        while True:
            n = len(self.scheduler_info()["workers"])
            if n >= n_workers:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"only {n} of {n_workers} workers joined within {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
