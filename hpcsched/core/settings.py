"""The settings of the scheduler server, the worker, the client and MPI mode.

Each class is a frozen dataclass whose fields name their configuration keys, by the
rule of :mod:`hpcsched.core.state.settings` (the field ``death_timeout`` of
:class:`WorkerSettings` is ``worker.death-timeout``; :func:`~.state.settings.setting`
names the others). Their defaults are those of :data:`hpcsched.core.config.DEFAULTS`,
and :func:`hpcsched.core.config.read` builds one from the configuration: a component
reads its settings as one object, never a key by its text.

    >>> from hpcsched.core.state.settings import config_keys
    >>> config_keys(WorkerSettings)["memory_target"], WorkerSettings().memory_target
    ('worker.memory.target', 0.6)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hpcsched.core.state.settings import SchedulerSettings, setting

__all__ = ["ClientSettings", "MPISettings", "SchedulerServerSettings", "SchedulerSettings",
           "WorkerSettings"]


@dataclass(frozen=True, slots=True)
class SchedulerServerSettings:
    """What the scheduler server does beside its state (``scheduler.*``; the state's own
    numbers are :class:`~hpcsched.core.state.settings.SchedulerSettings`)."""

    SECTION: ClassVar[str] = "scheduler"

    #: seconds between the scheduler's ticks (stealing, the TTL check, retirements)
    work_stealing_interval: float = 0.1
    #: seconds without heartbeat before a TCP worker is removed; the scheduler keeps its
    #: workers' heartbeat interval at most a third of it (hpcsched.core.state.liveness)
    worker_ttl: float = 30.0
    #: higher layers attached to every scheduler: seam names (hpcsched.core.seams) or
    #: module:factory entries, each called with the scheduler
    extensions: list = setting(default_factory=lambda: ["dashboard"])
    #: the journal that lets a scheduler restart where it was (None: no journal); see
    #: hpcsched/core/scheduler/journal.py
    journal: str | None = None
    #: fsync each loop turn's records (machine crashes)
    journal_fsync: bool = False
    #: compact the journal past this and twice the live size (bytes, or "64 MiB")
    journal_compact_bytes: int = setting(64 * 2**20, unit="bytes")
    #: seconds a client the journal names has, after a restart, to come back for its keys
    journal_client_grace: float = 600.0
    #: seconds a restarted scheduler waits for the workers it had to come back before it
    #: gives out work (one that came back early would otherwise recompute what another holds)
    journal_worker_grace: float = 10.0
    #: where results of tasks annotated checkpoint=True are kept (None: <journal>.checkpoints
    #: when there is a journal, else nowhere); see hpcsched/core/scheduler/checkpoints.py
    checkpoint_directory: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """A worker's settings (``worker.*``)."""

    SECTION: ClassVar[str] = "worker"

    #: seconds between heartbeats until the scheduler says otherwise (it lengthens the
    #: interval as its cluster grows): the scheduler state's key and default
    heartbeat_interval: float = setting(SchedulerSettings().heartbeat_interval,
                                        key="worker.heartbeat-interval")
    #: threads of numerical libraries (OpenMP, OpenBLAS, MKL) per worker process that
    #: LocalCluster starts, unless the environment sets them: a worker already runs one
    #: task per thread, and each library otherwise starts one thread per core (dask's nanny
    #: does the same through distributed.nanny.pre-spawn-environ). None leaves them alone.
    blas_threads: int | None = 1
    #: threads that fetch dependencies from peers
    transfer_incoming_count_limit: int = 4
    #: comms a worker keeps open to the peers it fetched from (the least recently used
    #: beyond are closed): reused by the next fetch from the same peer
    peer_connections: int = 256
    #: seconds a worker tries to reach its scheduler
    death_timeout: float = 60.0
    #: seconds a worker whose journaled scheduler vanished keeps its tasks and results and
    #: tries to reconnect (the scheduler restarts with its journal); then it exits. 0, or a
    #: scheduler without a journal: it exits at once
    scheduler_reconnect_timeout: float = 300.0
    #: retire this long before the job's walltime ends (seconds)
    walltime_margin: float = 60.0
    #: spread of retirements between workers of one job (seconds)
    walltime_stagger: float = 30.0
    # memory management, with dask.distributed's names and defaults ("Worker Memory
    # Management" in its documentation). Fractions of the worker's memory_limit; false
    # turns a step off.
    #: results measured by sizeof above it spill to disk, least recently used first
    memory_target: float | bool | None = setting(0.6, key="worker.memory.target")
    #: process memory (RSS) above it spills until below target
    memory_spill: float | bool | None = setting(0.7, key="worker.memory.spill")
    #: process memory above it stops new tasks (and fetches) until it drops
    memory_pause: float | bool | None = setting(0.8, key="worker.memory.pause")
    #: process memory above it makes a worker with a nanny restart (TCP); under MPI, where
    #: a rank cannot be restarted, it ends the job with an error naming the rank once
    #: nothing is left to spill
    memory_terminate: float | bool | None = setting(0.95, key="worker.memory.terminate")
    #: seconds between samples of process memory
    memory_monitor_interval: float = setting(0.1, key="worker.memory.monitor-interval")
    #: where results spill: the node's local disk (None: $TMPDIR, else the system's temp dir)
    local_directory: str | None = None


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """A client's settings (``client.*``, and the fusion of the graphs it submits)."""

    SECTION: ClassVar[str] = "client"

    #: seconds of silence from the scheduler before a ping
    heartbeat_interval: float = 5.0
    #: seconds without any answer: the scheduler is lost
    scheduler_timeout: float = 60.0
    #: seconds a client whose journaled scheduler vanished keeps its futures pending and
    #: tries to reconnect; then they err. 0, or a scheduler without a journal: at once
    scheduler_reconnect_timeout: float = 300.0
    #: linear-chain fusion of graphs given to get/compute
    fuse: bool = setting(True, key="scheduler.fuse")
    #: ``Future.result()`` brings along the small finished results the client is about to
    #: ask for (the rest of a map, an ``as_completed``, a ``wait``, done callbacks):
    #: at most this many bytes of them per request ...
    prefetch_bytes: int = setting(16 * 2**20, unit="bytes")
    #: ... none larger than this (larger ones stay on the workers until asked for) ...
    prefetch_result_bytes: int = setting(2**20, unit="bytes")
    #: ... and at most this many bytes held here, fetched and not yet asked for
    prefetch_held_bytes: int = setting(64 * 2**20, unit="bytes")


@dataclass(frozen=True, slots=True)
class MPISettings:
    """MPI mode's settings (``mpi.*``): the ranks' polling and their failure model."""

    SECTION: ClassVar[str] = "mpi"

    #: seconds: first back-off step after traffic
    poll_min: float = 1e-5
    #: seconds: cap of the back-off when idle for long
    poll_max: float = 0.05
    #: cap during the first second of idleness
    poll_fast_max: float = 1e-3
    #: seconds of polling at poll-min after any traffic
    poll_hold: float = 0.002
    #: same-node ranks wake each other (hpcsched/hpc/doorbell.py)
    doorbell: bool = True
    #: seconds: first fallback poll when every peer rings (to poll-max)
    doorbell_poll: float = 0.002
    #: frames of this many bytes or more travel as separate MPI messages
    data_threshold: int = 65536
    #: seconds rank 0 waits for the others at exit before MPI_Abort
    exit_timeout: float = 5.0
    #: seconds without a word from a rank before the job is ended as having lost it (rank 0
    #: watches the worker ranks, they watch rank 0; beats every quarter of it); 0: never
    rank_timeout: float = 6.0


#: every settings class, whose fields are the keys of their sections in the configuration
SETTINGS: tuple[type, ...] = (SchedulerSettings, SchedulerServerSettings, WorkerSettings,
                              ClientSettings, MPISettings)
