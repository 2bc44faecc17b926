"""The base every cluster shares: a scheduler in this process, workers from somewhere.

A subclass says how workers start and stop (:meth:`Cluster._start_workers`,
:meth:`Cluster._stop_workers`); the base implements ``scale``,
``scale_up(n)`` / ``scale_down(addresses)`` (the interface dask's adaptive deployments
drive, https://docs.dask.org/en/stable/adaptive.html, here through
:class:`~hpcsched.launchers.adaptive.Adaptive`), ``adapt``, ``close`` and the context
manager.
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from typing import TYPE_CHECKING, Any

from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Security
from hpcsched.core.scheduler.server import Scheduler

if TYPE_CHECKING:
    from hpcsched.core.client.client import Client
    from hpcsched.launchers.adaptive import Adaptive

logger = logging.getLogger("hpcsched.cluster")


class Cluster:
    """A scheduler in this process and workers started by a subclass.

    As dask's ``distributed.deploy.Cluster``: the batch clusters (:class:`~hpcsched.SLURMCluster` and the others) build on it; it
    owns the scheduler, scaling (:meth:`scale`, :meth:`adapt`) and shutdown. Pass a cluster
    to :class:`~hpcsched.Client` to compute on it.

    Args:
        scheduler_address: where the scheduler listens (``tcp://host:port``, port 0 for
            any free port).
        security: the cluster's shared secret and optional TLS; generated for TCP when None.
        scheduler_kwargs: further options of the scheduler.
    """

    #: workers started per unit the subclass manages (a batch job runs ``processes`` workers)
    workers_per_unit = 1

    def __init__(self, scheduler_address: str = "tcp://127.0.0.1:0",
                 security: Security | None = None, scheduler_kwargs: dict | None = None):
        if security is None and registry.backend_for(scheduler_address).needs_secret:
            security = Security.generate()
        self.security = security
        self.scheduler = Scheduler(scheduler_address, security, **(scheduler_kwargs or {}))
        self.scheduler.start()
        self.security = self.scheduler.security  # a journal's, when it restored one
        self.scheduler_address = self.scheduler.address
        self.adaptive: Adaptive | None = None
        self._lock = threading.RLock()
        self._closed = False
        # a cluster dropped without close(): its scheduler (thread, socket) closes too
        self._finalizer = weakref.finalize(self, self.scheduler.close)

    # ---------------------------------------------------------------- for subclasses
    def _start_workers(self, count: int, **kwargs: Any) -> None:
        raise NotImplementedError

    def _stop_workers(self, names: list[str]) -> None:
        raise NotImplementedError

    def _requested(self) -> int:
        """Workers asked for (started or still starting)."""
        raise NotImplementedError

    def _worker_name_of(self, address: str) -> str | None:
        info = self.scheduler_info_workers().get(address)
        return info["name"] if info else None

    # ---------------------------------------------------------------- public
    def scheduler_info_workers(self) -> dict[str, dict]:
        """The connected workers as the scheduler sees them: address -> information."""
        return self.scheduler.workers_info()

    @property
    def workers(self) -> dict[str, dict]:
        """The connected workers: address -> information (name, threads, memory, load)."""
        return self.scheduler_info_workers()

    def scale(self, n: int | None = None, jobs: int | None = None, memory: Any = None,
              cores: Any = None) -> None:
        """Ask for ``n`` workers (or ``jobs`` units); starts or retires to match."""
        if jobs is not None:
            n = jobs * self.workers_per_unit
        if n is None:
            raise TypeError("scale needs n= (workers) or jobs=")
        if n < 0:
            raise ValueError(f"cannot scale to {n} workers")
        with self._lock:
            have = self._requested()
            if n > have:
                self.scale_up(n)
            elif n < have:
                self._scale_to(n)

    def scale_up(self, n: int, **kwargs: Any) -> None:
        """Bring the total number of workers up to ``n``."""
        with self._lock:
            have = self._requested()
            if n > have:
                units = math.ceil((n - have) / self.workers_per_unit)
                self._start_workers(units, **kwargs)

    def scale_down(self, workers: list[str]) -> None:
        """Remove these worker addresses: retire them gracefully, then stop what ran them."""
        if not workers:
            return
        names = {a: self._worker_name_of(a) or a for a in workers}
        try:
            retired = self.scheduler.retire_workers(workers=list(workers), close=True,
                                                    timeout=60)
        except Exception as e:
            logger.warning("graceful retirement of %s failed: %s", workers, e)
            return
        kept = set(workers) - set(retired)
        if kept:
            # the scheduler keeps a worker whose results have nowhere else to go
            logger.info("not stopping %s: it holds the only copy of results", sorted(kept))
        self._stop_workers([names[a] for a in retired if a in names])

    def _scale_to(self, n: int) -> None:
        """Shrink to ``n``: subclasses with pending units override to drop those first."""
        info = self.scheduler_info_workers()
        extra = len(info) - n
        if extra <= 0:
            return
        victims = sorted(info.values(), key=lambda w: (w["processing"], w["nbytes"]))[:extra]
        self.scale_down([w["address"] for w in victims])

    def adapt(self, minimum: int = 0, maximum: float = math.inf, minimum_jobs: int | None = None,
              maximum_jobs: int | None = None, **kwargs: Any) -> Adaptive:
        """Scale with the load from now on, between ``minimum`` and ``maximum`` workers.

        As dask's ``Cluster.adapt``: the cluster grows while tasks wait and shrinks when
        workers sit idle. A second call replaces the first.

        Args:
            minimum: fewest workers to keep.
            maximum: most workers to run.
            minimum_jobs: the minimum in units (batch jobs) instead of workers.
            maximum_jobs: the maximum in units (batch jobs) instead of workers.
            **kwargs: options of :class:`~hpcsched.Adaptive` (``interval``,
                ``target_duration``, ``wait_count``, ...).

        Returns:
            The running :class:`~hpcsched.Adaptive`; its ``stop()`` ends adaptivity.
        """
        from hpcsched.launchers.adaptive import Adaptive

        return self._replace_adaptive(
            lambda lo, hi: Adaptive(self.scheduler, self, minimum=lo, maximum=hi, **kwargs),
            minimum, maximum, minimum_jobs, maximum_jobs)

    def _replace_adaptive(self, make: Any, minimum: int, maximum: float,
                          minimum_jobs: int | None, maximum_jobs: int | None) -> Any:
        """Stop the running adaptive scaling and start ``make(minimum, maximum)``.

        Its bounds are in workers; ``minimum_jobs`` / ``maximum_jobs``, when given, in jobs."""
        if minimum_jobs is not None:
            minimum = minimum_jobs * self.workers_per_unit
        if maximum_jobs is not None:
            maximum = maximum_jobs * self.workers_per_unit
        if self.adaptive is not None:
            self.adaptive.stop()
        self.adaptive = make(minimum, maximum)
        return self.adaptive

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's address with its access token (None when it is disabled)."""
        return self.scheduler.dashboard_link

    def wait_for_workers(self, n: int, timeout: float | None = None) -> None:
        """Block until ``n`` workers are connected (``TimeoutError`` after ``timeout`` s)."""
        self.scheduler.wait_for_workers(n, timeout)

    def get_client(self) -> Client:
        """A new :class:`~hpcsched.Client` connected to this cluster."""
        from hpcsched.core.client.client import Client

        return Client(self)

    def close(self, timeout: float = 10.0) -> None:
        """Stop adaptivity, the workers and the scheduler; a second call does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.adaptive is not None:
            self.adaptive.stop()
        try:
            self._close_workers(timeout)
        finally:
            self.scheduler.close(timeout)
            # the finalizer holds the scheduler (its close): nothing is left for it to do
            self._finalizer.detach()

    def _close_workers(self, timeout: float) -> None:
        raise NotImplementedError

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.scheduler_address} workers={self._requested()}>"

    def _repr_html_(self) -> str:
        from hpcsched.diagnostics import reprs  # presentation lives in the diagnostics layer

        return reprs.cluster_html(self)
