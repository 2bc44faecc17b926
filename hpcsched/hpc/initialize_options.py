"""dask-mpi's ``initialize`` parameters, checked and translated to what MPI mode does.

``dask_mpi.initialize`` (https://mpi.dask.org/en/latest/generated/dask_mpi.initialize.html)
takes ``interface, nthreads, local_directory, memory_limit, nanny, dashboard,
dashboard_address, protocol, worker_class, worker_options, comm, exit``; its
command line adds ``scheduler_port``. :func:`resolve` accepts all of them so a
dask-mpi script runs after changing its import line, and returns an
:class:`InitOptions` record of what MPI mode will do with them.

What each one means here (the README's migration table quotes this):

* ``comm``: the communicator the cluster runs on (rank 0 of it is the
  scheduler and the client); ranks outside it are untouched.
* ``nthreads``, ``memory_limit`` (as everywhere,
  :func:`hpcsched.core.units.parse_memory_limit`: bytes, ``"4GB"``, a fraction of
  the machine's memory as a float, None: no limit, ``"auto"``: the job's share per rank),
  ``local_directory`` (each worker's own directory below it, for its files),
  ``worker_options`` (keyword arguments of the worker), ``worker_class``
  (a subclass of hpcsched's ``Worker``; dask's names are taken as ours).
* ``dashboard`` / ``dashboard_address``: the scheduler's dashboard; ``interface``
  picks the address it listens on (the only socket of an MPI job).
* Meaningless under MPI, accepted and logged once as ignored, with why:
  ``protocol`` and ``scheduler_port`` (the workers reach the scheduler over
  MPI itself, ``mpi://0``), ``nanny`` / a Nanny ``worker_class`` (a nanny
  restarts a dead worker process; an MPI job cannot respawn a rank, and MPI
  ends the whole job when one dies).

Pure: no MPI, no process; :func:`resolve` raises ``ValueError``/``TypeError``
with the parameter's name on bad input.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from typing import Any

from hpcsched.core.comm.base import parse_host_port
from hpcsched.core.protocol.records import Record, field
from hpcsched.core.units import DEFAULT_MEMORY_LIMIT, MemoryLimit, parse_memory_limit

logger = logging.getLogger("hpcsched.initialize")

#: worker_class names a dask-mpi script passes, and what they become here
DASK_WORKER_CLASSES = {"distributed.Worker": "worker", "distributed.worker.Worker": "worker",
                       "distributed.Nanny": "nanny", "distributed.nanny.Nanny": "nanny",
                       "hpcsched.Worker": "worker", "hpcsched.core.worker.server.Worker": "worker"}

WHY_NO_NANNY = ("a nanny restarts a dead worker process, and an MPI job cannot respawn a rank "
                "(MPI ends the whole job when one dies)")
WHY_NO_PORT = "the workers reach the scheduler over MPI itself (mpi://0), not over a socket"

#: dask Worker keyword arguments that have no meaning for a worker rank, and why
IGNORED_WORKER_OPTIONS = {
    "interface": WHY_NO_PORT, "protocol": WHY_NO_PORT, "host": WHY_NO_PORT,
    "port": WHY_NO_PORT, "worker_port": WHY_NO_PORT, "nanny_port": WHY_NO_NANNY,
    "contact_address": WHY_NO_PORT, "listen_address": WHY_NO_PORT,
    "dashboard": "workers serve no dashboard of their own; the scheduler's shows them",
    "dashboard_address": "workers serve no dashboard of their own; the scheduler's shows them",
    "preload_argv": "not supported: a preload's dask_setup takes no command-line options "
                    "here (it is called with the worker only)",
}


class InitOptions(Record):
    """What MPI mode does with :func:`~hpcsched.hpc.bootstrap.initialize`'s arguments."""

    comm: Any = None  # None: COMM_WORLD
    nthreads: int | None = None  # None: the CPUs the job gives each rank
    memory_limit: MemoryLimit = DEFAULT_MEMORY_LIMIT  # hpcsched.core.units.parse_memory_limit
    local_directory: str | None = None
    dashboard_address: str | None = ":8787"  # None: no dashboard
    worker_class: type | None = None  # None: hpcsched's Worker
    worker_kwargs: dict = field(factory=dict)
    exit: bool = True
    #: each worker rank takes one GPU of its node, by local rank (``--worker-per-gpu``)
    worker_per_gpu: bool = False
    ignored: tuple[str, ...] = ()  # "name=value: why" for each accepted but unused argument


def resolve(*, interface: str | None = None, nthreads: int | None = None,
            local_directory: str | os.PathLike | None = None,
            memory_limit: MemoryLimit | str | None = DEFAULT_MEMORY_LIMIT, nanny: bool = False,
            dashboard: bool = True, dashboard_address: str | None = ":8787",
            protocol: str | None = None, worker_class: str | type | None = None,
            worker_options: dict | None = None, comm: Any = None,
            scheduler_port: int | None = None, exit: bool = True  # noqa: A002 - dask-mpi's
            ) -> InitOptions:
    """Check dask-mpi's ``initialize`` arguments; the record of what MPI mode does.

    >>> o = resolve(nthreads=2, memory_limit="1GB", protocol="tcp")
    >>> o.nthreads, o.memory_limit, o.ignored[0].split(":")[0]
    (2, 1000000000, "protocol='tcp'")
    """
    ignored: list[str] = []
    if nthreads is not None and (isinstance(nthreads, bool) or not isinstance(nthreads, int)
                                 or nthreads < 1):
        raise ValueError(f"initialize: nthreads must be a positive int or None, got {nthreads!r}")
    if protocol is not None:
        ignored.append(f"protocol={protocol!r}: {WHY_NO_PORT}")
    if scheduler_port is not None:
        ignored.append(f"scheduler_port={scheduler_port!r}: {WHY_NO_PORT}")
    if nanny:
        ignored.append(f"nanny=True: {WHY_NO_NANNY}")
    cls, why = _worker_class(worker_class)
    if why:
        ignored.append(why)
    kwargs, notes = _worker_options(worker_options, cls)
    ignored += notes
    address = _dashboard_address(dashboard, dashboard_address, interface, ignored)
    if local_directory is not None:
        local_directory = os.fspath(local_directory)
    try:
        limit = parse_memory_limit(memory_limit)
    except ValueError as e:
        raise ValueError(f"initialize: {e}") from None
    return InitOptions(comm=comm, nthreads=nthreads, memory_limit=limit,
                       local_directory=local_directory, dashboard_address=address,
                       worker_class=cls, worker_kwargs=kwargs, exit=bool(exit),
                       ignored=tuple(ignored))


def _worker_class(spec: str | type | None) -> tuple[type | None, str]:
    from hpcsched.core.worker.server import Worker

    if spec is None or isinstance(spec, type) and spec is Worker:
        return None, ""
    if isinstance(spec, str):
        kind = DASK_WORKER_CLASSES.get(spec)
        if kind == "worker":
            return None, ""
        if kind == "nanny":
            return None, f"worker_class={spec!r}: {WHY_NO_NANNY}; plain workers run instead"
        module, _, attr = spec.rpartition(".")
        try:
            spec = getattr(importlib.import_module(module), attr) if module else None
        except (ImportError, AttributeError) as e:
            raise ValueError(f"initialize: worker_class={spec!r} cannot be imported: {e}") \
                from None
        if spec is None:
            raise ValueError("initialize: worker_class must be 'module.Class' or a class")
    if not (isinstance(spec, type) and issubclass(spec, Worker)):
        raise TypeError(f"initialize: worker_class={spec!r} is not a subclass of "
                        "hpcsched.core.worker.server.Worker: a worker rank must speak hpcsched's "
                        "protocol (distributed's and dask-cuda's workers do not)")
    return spec, ""


def _worker_options(options: dict | None, cls: type | None) -> tuple[dict, list[str]]:
    from hpcsched.core.worker.server import Worker

    if options is None:
        return {}, []
    if not isinstance(options, dict):
        raise TypeError(f"initialize: worker_options must be a dict, got "
                        f"{type(options).__name__}")
    params = inspect.signature(cls or Worker).parameters  # the __init__ options, no self
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    reserved = {"self", "scheduler_address", "on_close"}
    kwargs, notes = {}, []
    for key, value in options.items():
        if key in IGNORED_WORKER_OPTIONS:
            notes.append(f"worker_options[{key!r}]: {IGNORED_WORKER_OPTIONS[key]}")
        elif key in reserved or (key not in params and not has_var_kw):
            allowed = sorted(set(params) - reserved - {"kwargs"})
            raise ValueError(f"initialize: worker_options[{key!r}] is not an option of a "
                             f"worker; the options are {allowed}")
        else:
            kwargs[key] = value
    return kwargs, notes


def _dashboard_address(dashboard: bool, address: str | None, interface: str | None,
                       ignored: list[str]) -> str | None:
    if not dashboard or address is None:
        if interface is not None:
            ignored.append(f"interface={interface!r}: it only picks the dashboard's address "
                           f"under MPI ({WHY_NO_PORT}), and the dashboard is off")
        return None
    address = str(address)
    if interface is None:
        return address
    host, port = parse_host_port(address, default_port=0)
    if host:
        ignored.append(f"interface={interface!r}: dashboard_address {address!r} names its host")
        return address
    from hpcsched.launchers.address import interface_address  # here: its network modules

    try:
        return f"{interface_address(interface)}:{port}"
    except ValueError as e:
        raise ValueError(f"initialize: {e}") from None


_logged: set[str] = set()


def log_ignored(options: InitOptions) -> None:
    """Say once per process which arguments are ignored, and why (rank 0 calls it)."""
    for note in options.ignored:
        if note not in _logged:
            _logged.add(note)
            logger.warning("hpcsched.initialize: ignored %s", note)
