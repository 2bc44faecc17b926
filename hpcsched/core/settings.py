"""Every setting of the configuration, in one settings class per section.

The scheduler server, the worker, the client, MPI mode, the transport (``comm.*``), the
diagnostics, the processes' garbage collector (``admin.*``), adaptive scaling and the batch
systems (``jobqueue.*``; a batch system's own section, ``jobqueue.slurm.*`` and the like,
holds its cluster's keyword arguments and is read with their names instead).

Each class is a frozen record (cheap to define, see :mod:`hpcsched.core.state.settings`)
whose fields name their configuration keys, by the
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

from typing import ClassVar

from hpcsched.core.protocol.records import Record
from hpcsched.core.state.settings import SchedulerSettings, setting

__all__ = ["AdaptiveSettings", "AdminSettings", "ClientSettings", "CommSettings",
           "DashboardSettings", "JobQueueSettings", "MPISettings", "SchedulerServerSettings",
           "SchedulerSettings", "WorkerSettings"]


class SchedulerServerSettings(Record):
    """What the scheduler server does beside its state (``scheduler.*``; the state's own
    numbers are :class:`~hpcsched.core.state.settings.SchedulerSettings`)."""

    SECTION: ClassVar[str] = "scheduler"

    #: seconds between the scheduler's ticks (stealing, the TTL check, retirements)
    work_stealing_interval: float = setting(0.1, unit="seconds")
    #: seconds without heartbeat before a TCP worker is removed; the scheduler keeps its
    #: workers' heartbeat interval at most a third of it (hpcsched.core.state.liveness)
    worker_ttl: float = setting(30.0, unit="seconds")
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
    journal_client_grace: float = setting(600.0, unit="seconds")
    #: seconds a restarted scheduler waits for the workers it had to come back before it
    #: gives out work (one that came back early would otherwise recompute what another holds)
    journal_worker_grace: float = setting(10.0, unit="seconds")
    #: where results of tasks annotated checkpoint=True are kept (None: <journal>.checkpoints
    #: when there is a journal, else nowhere); see hpcsched/core/scheduler/checkpoints.py
    checkpoint_directory: str | None = None
    #: the SQLite file every task's run is appended to (None: <journal>.history.sqlite
    #: when there is a journal, else no history); see hpcsched/diagnostics/history.py
    history: str | None = None


class WorkerSettings(Record):
    """A worker's settings (``worker.*``)."""

    SECTION: ClassVar[str] = "worker"

    #: seconds between heartbeats until the scheduler says otherwise (it lengthens the
    #: interval as its cluster grows); the scheduler server gives it to its state, whose
    #: default it is
    heartbeat_interval: float = setting(SchedulerSettings().heartbeat_interval, unit="seconds")
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
    death_timeout: float = setting(60.0, unit="seconds")
    #: seconds a worker whose journaled scheduler vanished keeps its tasks and results and
    #: tries to reconnect (the scheduler restarts with its journal); then it exits. 0, or a
    #: scheduler without a journal: it exits at once
    scheduler_reconnect_timeout: float = setting(300.0, unit="seconds")
    #: retire this long before the job's walltime ends (seconds)
    walltime_margin: float = setting(60.0, unit="seconds")
    #: spread of retirements between workers of one job (seconds)
    walltime_stagger: float = setting(30.0, unit="seconds")
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
    memory_monitor_interval: float = setting(0.1, key="worker.memory.monitor-interval",
                                             unit="seconds")
    #: seconds between those samples while the worker runs a member of a gang (a task
    #: with ranks=N), whose ranks compute in step (hpcsched/hpc/gang.py)
    memory_gang_monitor_interval: float = setting(
        1.0, key="worker.memory.gang-monitor-interval", unit="seconds")
    #: where results spill: the node's local disk (None: $TMPDIR, else the system's temp dir)
    local_directory: str | None = None


class ClientSettings(Record):
    """A client's settings (``client.*``, and the fusion of the graphs it submits)."""

    SECTION: ClassVar[str] = "client"

    #: seconds of silence from the scheduler before a ping
    heartbeat_interval: float = setting(5.0, unit="seconds")
    #: seconds without any answer: the scheduler is lost
    scheduler_timeout: float = setting(60.0, unit="seconds")
    #: seconds a client whose journaled scheduler vanished keeps its futures pending and
    #: tries to reconnect; then they err. 0, or a scheduler without a journal: at once
    scheduler_reconnect_timeout: float = setting(300.0, unit="seconds")
    #: linear-chain fusion of graphs given to get/compute
    fuse: bool = setting(True, key="scheduler.fuse")
    #: ``Future.result()`` brings along the small finished results the client is about to
    #: ask for (the rest of a map or of single submits, an ``as_completed``, a ``wait``,
    #: done callbacks):
    #: at most this many bytes of them per request ...
    prefetch_bytes: int = setting(16 * 2**20, unit="bytes")
    #: ... none larger than this (larger ones stay on the workers until asked for) ...
    prefetch_result_bytes: int = setting(2**20, unit="bytes")
    #: ... and at most this many bytes held here, fetched and not yet asked for
    prefetch_held_bytes: int = setting(64 * 2**20, unit="bytes")


class MPISettings(Record):
    """MPI mode's settings (``mpi.*``): the ranks' polling and their failure model."""

    SECTION: ClassVar[str] = "mpi"

    #: seconds: first back-off step after traffic
    poll_min: float = setting(1e-5, unit="seconds")
    #: seconds: cap of the back-off when idle for long
    poll_max: float = setting(0.05, unit="seconds")
    #: cap during the first second of idleness
    poll_fast_max: float = setting(1e-3, unit="seconds")
    #: seconds of polling at poll-min after any traffic
    poll_hold: float = setting(0.002, unit="seconds")
    #: same-node ranks wake each other (hpcsched/hpc/doorbell.py)
    doorbell: bool = True
    #: seconds: first fallback poll when every peer rings (to poll-max)
    doorbell_poll: float = setting(0.002, unit="seconds")
    #: seconds: the fallback poll when every peer rings and the rank has been idle for a
    #: second (messages wake it at once; hpcsched/hpc/pace.py)
    doorbell_poll_max: float = setting(1.0, unit="seconds")
    #: seconds: the poll while a gang's member computes on the rank (each takes Python's
    #: lock from it; hpcsched/hpc/gang.py): a message from another node is seen this late
    gang_poll: float = setting(1.0, unit="seconds")
    #: frames of this many bytes or more travel as separate MPI messages
    data_threshold: int = 65536
    #: seconds rank 0 waits for the others at exit before MPI_Abort
    exit_timeout: float = setting(5.0, unit="seconds")
    #: seconds without a word from a rank before the job is ended as having lost it (rank 0
    #: watches the worker ranks, they watch rank 0; beats every quarter of it, so a rank is
    #: lost after four beats missed); 0: never. As long as ``scheduler.worker-ttl`` bounds a
    #: worker's silence: a live rank on an oversubscribed node may get no CPU for seconds,
    #: and a rank taken for lost ends the whole job (dask's ``distributed.scheduler.
    #: worker-ttl`` is 5 minutes for the same reason)
    rank_timeout: float = setting(30.0, unit="seconds")
    #: a script stopped at its job's walltime queues its own continuation (``python -m
    #: hpcsched --requeue``; hpcsched/hpc/walltime.py)
    requeue: bool = False


class CommSettings(Record):
    """The transport's settings (``comm.*``): timeouts, limits, TLS files."""

    SECTION: ClassVar[str] = "comm"

    #: seconds to connect to a peer
    connect_timeout: float = setting(30.0, key="comm.timeouts.connect", unit="seconds")
    #: seconds an accepted peer has to authenticate
    handshake_timeout: float = setting(5.0, key="comm.timeouts.handshake", unit="seconds")
    #: seconds a message that started arriving has to finish
    message_timeout: float = setting(300.0, key="comm.timeouts.message", unit="seconds")
    #: unauthenticated peers held; the oldest go first
    max_pending_handshakes: int = 256
    #: connections the kernel queues before they are accepted (capped by the system's
    #: net.core.somaxconn): thousands of workers may connect at once
    socket_backlog: int = 4096
    #: larger frames are refused, sending and receiving (4 GiB)
    max_frame_bytes: int = setting(2**32, unit="bytes")
    #: frames of one message at most
    max_frames: int = 100_000
    #: bytes queued for a peer that does not read, past which its comm is closed
    max_send_queue_bytes: int = setting(2**31, unit="bytes")
    #: TLS certificate file (PEM) of this process, for tls:// addresses
    tls_cert: str | None = setting(None, key="comm.tls.cert")
    #: TLS private key file (PEM) of that certificate
    tls_key: str | None = setting(None, key="comm.tls.key")
    #: TLS certificate authority file (PEM) that peers' certificates are checked against
    tls_ca: str | None = setting(None, key="comm.tls.ca")


class DashboardSettings(Record):
    """The dashboard and its /metrics (``diagnostics.dashboard.*``)."""

    SECTION: ClassVar[str] = "diagnostics.dashboard"

    #: host:port it serves on (":8787": every interface; None: no dashboard)
    address: str | None = ":8787"
    #: seconds: pages see snapshots at most this fresh
    refresh: float = setting(0.5, unit="seconds")


class AdminSettings(Record):
    """The processes that run a scheduler or a worker (``admin.*``)."""

    SECTION: ClassVar[str] = "admin"

    #: CPython's cyclic garbage collector: the young generation's threshold (allocations
    #: between collections; CPython's own is 700) is raised to at least this. None leaves
    #: the collector as it is
    gc_threshold: int | None = 20_000


class AdaptiveSettings(Record):
    """Adaptive scaling (``adaptive.*``; hpcsched/launchers/adaptive.py)."""

    SECTION: ClassVar[str] = "adaptive"

    #: seconds between decisions (or text: "1s")
    interval: float = setting(1.0, unit="seconds")
    #: decisions in a row that must agree to retire a worker
    wait_count: int = 3
    #: seconds the work waiting should take on the cluster asked for (or text: "5s")
    target_duration: float = setting(5.0, unit="seconds")
    #: growth at most per decision
    scale_factor: float = 2.0
    #: a worker's share of its memory limit above which the cluster grows
    memory_high: float = 0.8
    #: decisions remembered (Adaptive.log)
    history: int = 100


class JobQueueSettings(Record):
    """What batch clusters share (``jobqueue.*``; hpcsched/jobqueue/)."""

    SECTION: ClassVar[str] = "jobqueue"

    #: seconds a batch command (sbatch, squeue, ...) may take
    command_timeout: float = setting(30.0, unit="seconds")
    #: seconds between polls of the jobs' states
    poll_interval: float = setting(2.0, unit="seconds")
    #: seconds jobs may run with no worker connected before the cluster says why
    connect_timeout: float = setting(20.0, unit="seconds")
    #: after the n-th failed submission (or job dead before a worker connected) in a row,
    #: wait the n-th delay (the last repeats; jobqueue/submissions.py) ...
    submit_retry_delays: list = setting(default_factory=lambda: ["60s", "15m", "30m"])
    #: ... and pause after so many failed submissions ...
    submit_pause_after: int = 10
    #: ... or so many jobs dead before a worker connected
    dead_jobs_pause_after: int = 3
    #: a job's replacement is submitted ahead of its workers' retirement by the queue's
    #: measured wait, at most this long ahead; 0: only once the job has ended
    #: (hpcsched/jobqueue/succession.py)
    replace_ahead_max: float = setting(3600.0, unit="seconds")


#: every settings class, whose fields are the keys of their sections in the configuration
SETTINGS: tuple[type, ...] = (SchedulerSettings, SchedulerServerSettings, WorkerSettings,
                              ClientSettings, MPISettings, CommSettings, DashboardSettings,
                              AdminSettings, AdaptiveSettings, JobQueueSettings)
