"""LocalCluster: a scheduler in this process and workers on this machine.

``processes=True`` (default) starts each worker as a ``python -m hpcsched
worker`` subprocess that connects back over authenticated TCP (the secret
travels in the child's environment, never on its command line);
``processes=False`` runs workers as threads of this process over ``inproc://``.

Worker processes are supervised as dask's nanny does: the cluster keeps the
number of workers it was asked for (``n_workers``, ``scale``), whatever way one
left -- killed, out of memory (``worker.memory.terminate``), or exited after the
scheduler dropped it (stopped past ``scheduler.worker-ttl``, then resumed).
Only workers the cluster itself stops (``scale`` down, ``close``) are not
replaced; no more than ``max(10, 3 x n_workers)`` replacements a minute.
Each worker process has a :class:`~hpcsched.core.worker.nanny.Nanny` here, where nanny
plugins run (``Client.register_plugin(NannyPlugin)``): its ``env`` is laid over
the worker's environment, and ``restart`` starts the worker's process again
under the same name. A replacement (a new name) gets a new nanny, which gets
the registered nanny plugins as a nanny joining later does.

Example::

    from hpcsched import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        print(client.submit(sum, [1, 2, 3]).result())
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm.base import Security
from hpcsched.core.protocol.messages import Close
from hpcsched.core.settings import WorkerSettings
from hpcsched.core.units import DEFAULT_MEMORY_LIMIT
from hpcsched.core.worker.nanny import Nanny
from hpcsched.core.worker.preload import EXIT_PRELOAD, preload_names
from hpcsched.core.worker.server import Worker
from hpcsched.launchers.cluster import Cluster
from hpcsched.launchers.resources import LAUNCHERS, machine_memory, worker_memory_limit

# what an MPI launcher puts in each rank's environment (SLURM's stay: they describe the
# job the cluster runs in): the ranks' variables, MPICH hydra's connection to its proxy
_RANK_VARIABLES = frozenset({v for launcher in LAUNCHERS[:-1] for v in launcher} |
                            {"PMI_FD", "PMI_PORT", "PMI_ID", "HYDRA_CONTROL_FD"})
_RANK_PREFIXES = ("OMPI_COMM_WORLD_", "PMIX_")

logger = logging.getLogger("hpcsched.local")


def _watch(ref: weakref.ref, name: str, p: subprocess.Popen) -> None:
    """Wait for one worker process, then tell the cluster.

    The cluster is held only weakly: a dropped cluster must still be collected, and its
    finalizer kill its workers.
    """
    code = p.wait()
    cluster = ref()
    if cluster is not None and cluster._proc_finalizer.alive:
        cluster._replace_exited(name, p, code)


def _restart(ref: weakref.ref, name: str) -> None:
    """A nanny restarts its worker, if the cluster is still there."""
    cluster = ref()
    if cluster is not None:
        cluster._restart_worker(name)


def _kill_all(procs: dict) -> None:
    """Finalizer: end worker processes still running (the cluster was never closed)."""
    procs_list = list(procs.values())
    procs.clear()  # watchers see the processes are no longer ours: no replacements
    for p in procs_list:
        if p.poll() is None:
            p.kill()
    for p in procs_list:
        try:
            p.wait(5)
        except Exception:
            pass


#: environment variables that size the thread pools of numerical libraries
BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                         "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


class LocalCluster(Cluster):
    """A scheduler and workers on this machine, as dask's ``LocalCluster``.

    Worker processes (``processes=True``, the default) are supervised as dask's nanny
    does: one that dies while wanted is replaced. ``n_workers`` and
    ``threads_per_worker`` default to one process per core, one thread each (one worker
    of ``os.cpu_count()`` threads with ``processes=False``).

    ``scheduler_journal``: the scheduler keeps a journal there (``scheduler.journal``):
    a LocalCluster made again with it, after the process that held it died (a notebook
    kernel restarted), takes up its graphs at the same address, and the worker processes
    of the old one, which look for their scheduler for
    ``worker.scheduler-reconnect-timeout``, join it with the results they hold. Without
    a journal, worker processes exit as soon as their scheduler is gone.

    ``preload``: modules, or ``.py`` files, each worker loads as it starts, calling their
    ``dask_setup(worker)`` (dask's worker preloads,
    https://docs.dask.org/en/stable/how-to/customize-initialization.html). A worker
    process whose preload fails says why and is not replaced.
    """

    def __init__(self, n_workers: int | None = None, threads_per_worker: int | None = None,
                 processes: bool = True, memory_limit: Any = DEFAULT_MEMORY_LIMIT,
                 host: str = "127.0.0.1", scheduler_port: int = 0,
                 security: Security | None = None, resources: dict | None = None,
                 timeout: float = 60.0, worker_env: dict | None = None,
                 scheduler_kwargs: dict | None = None, dashboard_address: Any = ...,
                 local_directory: str | None = None, scheduler_journal: str | None = None,
                 preload: str | list[str] | None = None, **worker_kwargs: Any):
        ncpu = os.cpu_count() or 1
        if n_workers is None and threads_per_worker is None:
            n_workers = ncpu if processes else 1
            threads_per_worker = 1 if processes else ncpu
        elif n_workers is None:
            n_workers = max(ncpu // max(threads_per_worker or 1, 1), 1)
        elif threads_per_worker is None:
            threads_per_worker = max(ncpu // max(n_workers, 1), 1)
        assert n_workers is not None and threads_per_worker is not None
        if n_workers < 0 or threads_per_worker < 1:
            raise ValueError(f"n_workers={n_workers}, threads_per_worker={threads_per_worker} "
                             "make no cluster")
        self.processes = processes
        self.threads_per_worker = threads_per_worker
        # bytes for each worker; "auto" splits the machine's memory among them (dask's
        # LocalCluster gives each the share of its threads, the same for equal workers)
        self.memory_limit = worker_memory_limit(memory_limit, workers=n_workers,
                                                total=machine_memory())
        self.resources = resources
        self.worker_kwargs = worker_kwargs
        self.preload = preload_names(preload)
        self.local_directory = local_directory
        self._target = n_workers  # worker processes to keep alive
        self.worker_env = dict(worker_env or {})
        self._procs: dict[str, subprocess.Popen] = {}
        self._nannies: dict[str, Nanny] = {}  # worker name -> its nanny (processes only)
        self._threads: dict[str, Worker] = {}
        self._watchers: list[threading.Thread] = []  # the threads waiting for processes
        self._names = itertools.count()
        self._restarts: list[float] = []
        address = f"tcp://{host}:{scheduler_port}" if processes else "inproc://"
        if dashboard_address is not ...:  # as dask's: ":8787", "127.0.0.1:0", None (none)
            scheduler_kwargs = {**(scheduler_kwargs or {}), "dashboard_address": dashboard_address}
        if scheduler_journal is not None:
            scheduler_kwargs = {**(scheduler_kwargs or {}), "journal": scheduler_journal}
        super().__init__(address, security, scheduler_kwargs)
        self._proc_finalizer = weakref.finalize(self, _kill_all, self._procs)
        try:
            if n_workers:
                self._start_workers(n_workers)
                self.wait_for_workers(n_workers, timeout)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- workers
    def _requested(self) -> int:
        alive = [n for n, p in self._procs.items() if p.poll() is None]
        return len(alive) + len(self._threads)

    def _start_workers(self, count: int, **kwargs: Any) -> None:
        for _ in range(count):
            name = f"local-{next(self._names)}"
            if self.processes:
                self._procs[name] = p = self._spawn(name)
                self._start_watch(name, p)
            else:
                w = Worker(self.scheduler_address, nthreads=self.threads_per_worker,
                           memory_limit=self.memory_limit, name=name, resources=self.resources,
                           security=self.security, local_directory=self.local_directory,
                           preload=self.preload, **self.worker_kwargs)
                w.start()
                self._threads[name] = w

    def _spawn(self, name: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "hpcsched", "worker", self.scheduler_address,
               "--name", name, "--nthreads", str(self.threads_per_worker),
               "--memory-limit", str(self.memory_limit)]
        if self.resources:
            cmd += ["--resources", ",".join(f"{k}={v}" for k, v in self.resources.items())]
        if self.local_directory:
            cmd += ["--local-directory", str(self.local_directory)]
        for name in self.preload:  # a path as the client sees it: the worker's cwd may differ
            cmd += ["--preload", os.path.abspath(name) if name.endswith(".py") else name]
        if self.scheduler.journal is None:  # no scheduler comes back: none to wait for
            cmd += ["--scheduler-reconnect-timeout", "0"]
        env = dict(os.environ)
        # workers import what the client can import (modules next to the user's script)
        paths = [p for p in sys.path if p and os.path.isdir(p) and "site-packages" not in p
                 and not p.startswith(sys.base_prefix)]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        blas = config.read(WorkerSettings).blas_threads
        if blas is not None:
            for var in BLAS_THREAD_VARIABLES:
                env.setdefault(var, str(blas))
        env.update(self.worker_env)
        nanny = self._nannies.get(name)
        if nanny is None:
            # the nanny's threads hold it: only a weak reference back, so that a dropped
            # cluster is still collected (and its finalizer kills its workers)
            nanny = self._nannies[name] = Nanny(
                name, self.scheduler_address, functools.partial(_restart, weakref.ref(self), name),
                local_directory=self.local_directory)
        env.pop("HPCSCHED_SECRET_FILE", None)
        if self.security and self.security.secret:
            env["HPCSCHED_SECRET"] = self.security.secret_hex()
        # workers must not think they are MPI ranks of a job that started us (a rank suffix
        # on their names, a share of the node's CPUs, a PMI connection of that rank's)
        for var in [v for v in env if v in _RANK_VARIABLES or v.startswith(_RANK_PREFIXES)]:
            del env[var]
        # with what nanny plugins set in nanny.env laid over
        return nanny.popen(cmd, env=env, stdin=subprocess.DEVNULL)

    def _restart_worker(self, name: str) -> None:
        """A nanny restarts its worker under the same name.

        The process is stopped and started again, not replaced by a new worker (it is out
        of ``_procs`` before it exits).
        """
        with self._lock:
            if self._closed or name not in self._procs:
                return  # closing (it stops the process), or the worker was stopped
            p = self._procs.pop(name)
            _stop_process(p)
            self._procs[name] = p = self._spawn(name)
            self._start_watch(name, p)

    def _start_watch(self, name: str, p: subprocess.Popen) -> None:
        """Start the thread that waits for the worker process ``p``."""
        t = threading.Thread(target=_watch, args=(weakref.ref(self), name, p), daemon=True,
                             name=f"watch {name}")
        self._watchers = [w for w in self._watchers if w.is_alive()] + [t]
        t.start()

    def _replace_exited(self, name: str, p: subprocess.Popen, code: int) -> None:
        """Replace a worker process that left while the cluster wants it, as dask's nanny does.

        A process killed, out of memory, or exited after the scheduler dropped it is
        replaced, so that the cluster keeps the size it was asked for. One the cluster
        stopped is no longer in ``_procs``; one retired by a scale down lowered the target
        first.
        """
        with self._lock:
            if self._closed or self._procs.get(name) is not p:
                return
            del self._procs[name]
            self._close_nanny(name)
            if code == EXIT_PRELOAD:  # it would fail the same way again (it said why)
                logger.error("worker %s: its preload failed: not replacing it", name)
                return
            if self._requested() >= self._target:
                return
            now = time.monotonic()
            self._restarts = [t for t in self._restarts if now - t < 60] + [now]
            if len(self._restarts) > max(10, 3 * self._target):
                logger.error("worker %s exited (%s); too many restarts in a minute: "
                             "not replacing it", name, code)
                return
            logger.warning("worker %s exited (%s): starting a replacement", name, code)
            self._start_workers(1)

    # the size the cluster keeps: what was last asked for
    def scale(self, n: int | None = None, jobs: int | None = None, memory: Any = None,
              cores: Any = None) -> None:
        """Keep ``n`` workers (or ``jobs`` x workers per job); a dead one is replaced."""
        with self._lock:
            if n is None and jobs is not None:
                n = jobs * self.workers_per_unit
            if n is not None and n >= 0:
                self._target = n
        super().scale(n, None, memory, cores)

    def scale_up(self, n: int, **kwargs: Any) -> None:
        """Start workers until there are ``n``."""
        with self._lock:
            self._target = max(self._target, n)
        super().scale_up(n, **kwargs)

    def scale_down(self, workers: list[str]) -> None:
        """Retire ``workers`` and keep the cluster at its new size."""
        # lowered before retiring: a retired worker exits before _stop_workers forgets it
        with self._lock:
            self._target = max(min(self._target, self._requested() - len(workers)), 0)
        super().scale_down(workers)

    def _stop_workers(self, names: list[str]) -> None:
        for name in names:
            w = self._threads.pop(name, None)
            if w is not None:
                w.close("stopped by the cluster")
            p = self._procs.pop(name, None)
            if p is not None:
                _stop_process(p)
            self._close_nanny(name)

    def _close_nanny(self, name: str) -> None:
        nanny = self._nannies.pop(name, None)
        if nanny is not None:
            nanny.close()  # its plugins' teardown

    def _worker_name_of(self, address: str) -> str | None:
        return super()._worker_name_of(address)

    def _ask_workers_to_close(self) -> None:
        for address in list(self.scheduler.state.workers):
            self.scheduler.send(address, Close(reason="cluster closing"))

    def _close_workers(self, timeout: float) -> None:
        # ask workers to close through the scheduler, then make sure
        try:
            self.scheduler.loop.call(self._ask_workers_to_close, timeout=2)
        except Exception:
            pass
        for w in list(self._threads.values()):
            w.close("cluster closing")
        self._threads.clear()
        deadline = time.monotonic() + min(timeout, 5)
        for p in list(self._procs.values()):
            try:
                p.wait(max(deadline - time.monotonic(), 0.05))
            except subprocess.TimeoutExpired:
                pass
        for p in list(self._procs.values()):
            _stop_process(p)
        self._procs.clear()
        for name in list(self._nannies):
            self._close_nanny(name)
        # each ends as its process has: once over, no thread holds the cluster
        for t in self._watchers:
            t.join(5)
        self._watchers.clear()

    @property
    def nannies(self) -> dict[str, Nanny]:
        """Worker name -> the nanny supervising its process (``processes=True``)."""
        return dict(self._nannies)

    @property
    def worker_processes(self) -> dict[str, subprocess.Popen]:
        """Worker name -> its process (``processes=True``)."""
        return dict(self._procs)


def _stop_process(p: subprocess.Popen, grace: float = 3.0) -> None:
    if p.poll() is not None:
        return
    p.terminate()
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)
