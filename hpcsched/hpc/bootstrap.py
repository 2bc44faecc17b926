"""MPI mode: ``mpiexec -n N python -m hpcsched script.py [args...]`` and :func:`initialize`.

Its state in this process is one :class:`MPIMode` object, :data:`MODE`, shared by
:func:`initialize` and the command line (:mod:`hpcsched.hpc.command`).

Roles: rank 0 runs the scheduler (over ``mpi://0``, plus an ``inproc://``
listener for the client in its own process) and the user's script as
``__main__``; ranks 1..N-1 are workers reached over ``mpi://<rank>``. Inside
the script ``Client()`` needs no address. With a world of one process the
script runs on a LocalCluster instead (said on stderr).

How a job ends (the failure model; the README quotes it):

* The script finishes: the scheduler closes every worker, every rank exits 0
  within a second or two.
* The script raises: rank 0 prints the traceback (once), the workers are
  closed with exit code 1 and every rank exits 1. ``sys.exit(n)`` in the
  script makes ``n`` the exit status of every rank, hence of ``mpiexec``.
  Ctrl-C gives 130.
* A task that raises on a worker does not end anything: its future errs and
  the script decides. A member of a task holding many ranks (``ranks=N``) that
  raises may leave the others blocked in a collective for good: their ranks
  take no new work, and at the end the first of them past the exit fence
  calls ``MPI_Abort`` with the job's exit code (0 if the script succeeded)
  rather than ``MPI_Finalize`` under a thread still inside MPI.
* Ranks meet at an exit fence (a nonblocking barrier polled with back-off,
  never a spinning blocking call). A rank that does not reach it within
  ``mpi.exit-timeout`` seconds (a worker stuck in a task that ignores the
  close, a script that never returns from ``Client.close``...) makes rank 0
  call ``MPI_Abort`` with the job's exit code, after saying why on stderr:
  the job ends instead of hanging.
* The job's walltime is near (``python -m hpcsched``, :mod:`hpcsched.hpc.walltime`):
  the script is stopped, the tasks running end (within ``mpi.exit-timeout``) and every
  rank exits 75.
* A rank that dies (killed, segfault, out of memory) ends the whole MPI job:
  that is MPI's own semantics (the launcher kills the other ranks and reports
  which one died). There is no recovery of a lost rank in MPI mode; rank 0,
  the scheduler and the script, is no exception. What survives is on disk:
  with ``--journal J`` the results of tasks annotated ``checkpoint=True`` are
  kept in ``J.checkpoints/`` (:mod:`hpcsched.core.scheduler.checkpoints`), and
  the job run again with the same journal reads them instead of running them.
* A rank the launcher does not report -- its node powered off or cut off the
  network (an ssh connection that goes silent rather than closed), or ``srun``
  without ``--kill-on-bad-exit`` -- is missed by the others: rank 0 watches
  the worker ranks, and they rank 0 (beats over the transport,
  :meth:`hpcsched.hpc.mpi.Endpoint.watch`); one silent for
  ``mpi.rank-timeout`` seconds (30) makes the rank that missed it call
  ``MPI_Abort`` after naming the ranks lost and their hosts on stderr. A rank
  whose own process stalls that long (a C call holding the GIL) would be taken
  for lost: raise the setting for such work, or set it to 0 to never watch.
* SIGTERM/SIGINT sent to the launcher reach every rank (mpiexec forwards
  them): SIGTERM ends them at once, SIGINT interrupts the script (exit 130).
* A worker rank that cannot join the scheduler at start-up aborts the job with
  a message naming the rank.
* Memory (``worker.memory.*``): a rank cannot be restarted, so past the
  terminate fraction it spills every result it holds and pauses (the
  scheduler sends it nothing new) -- the job goes on. Only when process memory
  stays past terminate with nothing left to spill does the rank abort the job,
  naming itself, its host and its memory: a clear error instead of the
  out-of-memory killer's.

Worker ranks leave with C ``exit()`` right after ``MPI_Finalize``: a task
thread still running cannot keep the rank alive once the scheduler said
goodbye.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, NoReturn

from hpcsched.core import config
from hpcsched.core.settings import CommSettings, MPISettings
from hpcsched.core.units import DEFAULT_MEMORY_LIMIT, MemoryLimit
from hpcsched.hpc.initialize_options import InitOptions, log_ignored, resolve
from hpcsched.launchers.resources import launcher_size

if TYPE_CHECKING:
    from hpcsched.core.worker.tasks.gpus import Gpus

logger = logging.getLogger("hpcsched.bootstrap")

EXIT_INTERRUPTED = 130
#: a job stopped at its walltime with work left (EX_TEMPFAIL; hpcsched/hpc/walltime.py)
EXIT_NOT_FINISHED = 75


class _Job:
    """This process's place in the MPI job (``MPI`` is None for a world of one)."""

    __slots__ = ("MPI", "rank", "size", "fence_comm", "comm", "endpoint", "hosts")

    def __init__(self, MPI: Any, rank: int, size: int, *, comm: Any = None) -> None:
        self.MPI, self.rank, self.size = MPI, rank, size
        self.fence_comm: Any = None
        self.comm = comm  # the communicator the cluster runs on (None: COMM_WORLD)
        self.endpoint: Any = None  # this rank's hpcsched.hpc.mpi.Endpoint
        self.hosts: list[str] = []  # every rank's host name, by rank


class MPIMode:
    """MPI mode's state in this process.

    The one object (:data:`MODE`) that ``python -m hpcsched`` (:func:`main`) and
    :func:`initialize` share: whichever sets MPI mode up first, the other finds it set up.
    """

    def __init__(self) -> None:
        #: this process's place in the MPI job, once MPI mode is set up
        self.job: _Job | None = None
        #: rank 0's Scheduler, until the cluster closes
        self.scheduler: Any = None
        #: what the script's ``sys.exit`` asked for (:func:`initialize`'s rank 0)
        self.exit_status: int | None = None
        # this rank starts with the garbage collector paused (started())
        self.collector_paused = False

    # ------------------------------------------------------------ starting
    def pause_collector(self) -> None:
        """Pause the cyclic garbage collector until this rank has started (:meth:`started`).

        A rank's start (the imports, the endpoint, the scheduler or the worker) makes tens
        of thousands of objects that live as long as the process, and no garbage: the
        collector ran ~40 times meanwhile, freeing nothing, for ~10 ms of each rank's start
        (more where ranks outnumber cores). Where the program paused it itself, it is left
        alone.
        """
        import gc

        if gc.isenabled():
            gc.disable()
            self.collector_paused = True

    def started(self) -> None:
        """This rank has started (or failed to): the collector runs again if paused.

        What was made meanwhile is moved to the oldest generation: the collector's next
        passes would find it all alive.
        """
        if self.collector_paused:
            self.collector_paused = False
            from hpcsched.core.graph.dsk import resume_collector

            resume_collector()

    def setup(self, options: InitOptions, security: Any = None) -> _Job:
        """Collective start-up on every rank of ``options.comm``.

        Every rank opens its endpoint and the exit fence; rank 0 starts the scheduler (with
        ``security``: what peers connecting over TCP must prove), and has started once it
        returns (or fails); a worker rank once its worker is made, before it joins.
        """
        try:
            return _set_up_world(self, options, security)
        finally:
            if self.job is None or self.job.rank == 0:
                self.started()

    # ------------------------------------------------------------ ending
    def close_cluster(self, code: int) -> None:
        """Rank 0: close the workers with ``code``, wait for every rank at the fence."""
        job = self.job
        if job is None or job.size == 1 or job.rank != 0 or job.fence_comm is None:
            return
        from hpcsched.core.client import client as client_mod

        sched, self.scheduler = self.scheduler, None
        job.endpoint.unwatch()  # worker ranks now leave, each in its own time
        if sched is not None:
            sched.close(timeout=5.0, exit_code=code)
        client_mod.default_scheduler_address = None
        _leave(job, code)
        job.fence_comm = None

    def record_exit_status(self) -> None:
        """Remember the script's exit status for the workers: sys.exit(n), or 1 on an error.

        For :func:`initialize`, whose script rank 0 does not run itself."""
        previous_hook, previous_exit = sys.excepthook, sys.exit

        def excepthook(tp: type, value: BaseException, tb: Any) -> None:
            self.exit_status = EXIT_INTERRUPTED if issubclass(tp, KeyboardInterrupt) else 1
            previous_hook(tp, value, tb)

        def recording_exit(status: Any = None) -> NoReturn:
            code = status if status is None or isinstance(status, int) else 1
            self.exit_status = 0 if code is None else code & 0xFF
            previous_exit(status)

        sys.excepthook = excepthook
        sys.exit = recording_exit

    def close_at_exit(self) -> None:
        """Rank 0 of :func:`initialize` at exit: the cluster ends with the script's status."""
        self.close_cluster(self.exit_status or 0)


#: MPI mode in this process
MODE = MPIMode()


# ------------------------------------------------------------------ the world
def _world(comm: Any = None) -> _Job:
    """Rank and size, importing mpi4py only when a launcher started us with several ranks.

    Outside any launcher MPI is not initialized at all (on some machines that
    fails outright on a login node). ``comm``: run on that communicator instead
    of ``COMM_WORLD`` (the caller made it, so MPI is there).
    """
    if comm is not None:
        from hpcsched.hpc.mpi_init import mpi_module

        return _Job(mpi_module(), comm.Get_rank(), comm.Get_size(), comm=comm)
    hint = launcher_size()
    if hint is None or hint == 1:
        return _Job(None, 0, 1)
    if importlib.util.find_spec("mpi4py") is None:
        raise RuntimeError(
            f"hpcsched: started by an MPI launcher ({hint or 'several'} processes) but mpi4py "
            "is not installed; install it with: pip install 'hpcsched[mpi]'")
    from hpcsched.hpc.mpi_init import mpi_module

    MPI = mpi_module()
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    if hint > 1 and size == 1:
        library = MPI.Get_library_version().splitlines()[0].strip()
        example = ("Open MPI's mpirun" if library.startswith("Open MPI") else
                   "`python -m pip install mpich` puts one on PATH")
        raise RuntimeError(
            f"hpcsched: the launcher started {hint} processes but MPI sees a world of 1: "
            "the mpiexec on PATH does not belong to the MPI library mpi4py was built with "
            f"({library}); use that library's mpiexec (e.g. {example})")
    return _Job(MPI, rank, size, comm=world)


def _set_up_world(mode: MPIMode, options: InitOptions, security: Any) -> _Job:
    job = _world(options.comm)
    if job.size == 1:
        mode.job = job
        return job
    from hpcsched.hpc.backoff import Backoff
    from hpcsched.hpc.mpi import init_endpoint

    timeout = float(config.read(CommSettings).connect_timeout)
    job.endpoint = init_endpoint(job.comm, timeout=timeout)
    # the fence gets a communicator of its own: the endpoint's is freed at its shutdown
    dup, req = job.comm.Idup()
    deadline = time.monotonic() + timeout
    wait = Backoff()

    def wait_for(request: Any) -> None:
        while not request.Test():
            if time.monotonic() > deadline:
                _abort(job, 1, f"rank {job.rank}: the other ranks did not start within "
                               f"{timeout}s")
            wait.sleep()

    wait_for(req)
    job.fence_comm = dup
    # every rank's host, to name those lost
    mine = bytearray(socket.gethostname().encode()[:_HOST_BYTES]).ljust(_HOST_BYTES, b"\0")
    every = bytearray(_HOST_BYTES * job.size)
    wait_for(dup.Iallgather([mine, job.MPI.BYTE], [every, job.MPI.BYTE]))
    job.hosts = [every[r * _HOST_BYTES:(r + 1) * _HOST_BYTES].rstrip(b"\0").decode(
        errors="replace") for r in range(job.size)]
    mode.job = job
    if job.rank == 0:
        # a worker rank watches rank 0 as soon as it has joined, while rank 0 may wait
        # for the others: beat to them from the start
        _watch(job, report=False)
        mode.scheduler = _start_scheduler(job, timeout, options.dashboard_address, security)
        _watch(job)
    return job


_HOST_BYTES = 64  # of a host name, in the exchange of _set_up_world


def _watch(job: _Job, report: bool = True) -> None:
    """Watch the ranks this one depends on; a silent one ends the job (module docstring).

    Rank 0 watches the worker ranks, a worker rank watches rank 0; ``report=False``: only
    beat to them."""
    timeout = float(config.read(MPISettings).rank_timeout)
    if timeout <= 0:
        return

    def lost(silent: list[int], seconds: float) -> None:
        many = len(silent) > 1
        who = (f"worker rank{'s' if many else ''} {', '.join(map(str, silent))}"
               if job.rank == 0 else "rank 0 (the scheduler)")
        hosts = ", ".join(sorted({job.hosts[r] for r in silent}))
        _abort(job, 1, f"rank {job.rank} lost {who} on {hosts}: not a word from "
                       f"{'them' if many else 'it'} for {seconds:.0f}s (killed, or the node "
                       "failed or left the network; config mpi.rank-timeout)")

    job.endpoint.watch(range(1, job.size) if job.rank == 0 else [0], timeout,
                       lost if report else None)


#: seconds a task may wait with no worker able to run it, in a cluster of fixed size: MPI
#: mode's workers are the ranks for the job's whole life, and a world of one's LocalCluster
#: does not grow either, so a task none of them can run (``workers=7`` of four ranks) fails
#: with NoValidWorkerError instead of holding the job until its walltime.
#: ``scheduler.no-workers-timeout``, when configured, wins.
FIXED_CLUSTER_NO_WORKERS_TIMEOUT = 60.0
_NO_WORKERS_TIMEOUT_VARIABLE = "HPCSCHED_SCHEDULER__NO_WORKERS_TIMEOUT"


def _fixed_cluster_no_workers_timeout() -> dict[str, Any]:
    """The scheduler's ``no_workers_timeout`` for a cluster of fixed size, unless configured."""
    if config.get("scheduler.no-workers-timeout", default=None) is not None:
        return {}
    return {"no_workers_timeout": FIXED_CLUSTER_NO_WORKERS_TIMEOUT}


def world_of_one_fixed_size() -> None:
    """Give the LocalCluster of a world of one :data:`FIXED_CLUSTER_NO_WORKERS_TIMEOUT`.

    This process's ``Client()`` starts it, and its scheduler reads the environment.
    """
    if _fixed_cluster_no_workers_timeout():
        os.environ[_NO_WORKERS_TIMEOUT_VARIABLE] = f"{FIXED_CLUSTER_NO_WORKERS_TIMEOUT:g}"


def _start_scheduler(job: _Job, timeout: float, dashboard_address: Any = ...,
                     security: Any = None) -> Any:
    from hpcsched.core.scheduler.server import Scheduler

    sched = Scheduler("mpi://0", security, dashboard_address=dashboard_address,
                      **_fixed_cluster_no_workers_timeout()).start()
    # the workers register meanwhile: the client's modules are imported once it listens
    from hpcsched.core.client import client as client_mod

    client_mod.default_scheduler_address = sched.add_listener("inproc://")
    client_mod.default_security = security
    # waiting goes on while ranks keep joining: a wide job on few cores (or importing from
    # a slow shared file system) takes longer than `timeout` to start, but not between joins
    joined = 0
    while True:
        try:
            sched.wait_for_workers(job.size - 1, timeout=timeout)
            return sched
        except TimeoutError:
            ranks = {int(a.rsplit("/", 1)[-1]) for a in sched.workers_info()}
            if len(ranks) > joined:
                joined = len(ranks)
                continue
            missing = [r for r in range(1, job.size) if r not in ranks]
            _abort(job, 1, f"worker ranks {missing} did not join the scheduler (none joined "
                           f"within {timeout}s, config comm.timeouts.connect)")
            return sched


# ------------------------------------------------------------------ worker ranks
def rank_resources(options: InitOptions) -> tuple[int | None, int, str | None]:
    """(threads, memory limit in bytes, host) of this rank's worker.

    What the options leave open (threads, an ``"auto"`` memory limit) is what the job
    gives this rank (:func:`hpcsched.launchers.resources.detect`).
    """
    from hpcsched.launchers.resources import detect, worker_memory_limit

    nthreads, limit = options.nthreads, options.memory_limit
    res = detect() if nthreads is None or limit == "auto" else None
    memory = worker_memory_limit(limit, total=res.memory_limit if res else None)
    if res is None:
        return nthreads, memory, None
    return nthreads or res.nthreads, memory, res.hostname


def rank_gpus(one_per_rank: bool, rank: int) -> Gpus | None:
    """The GPUs of this rank's worker.

    Those its node shows it, or with ``one_per_rank`` the one of index local rank modulo
    their number, made the only one this process sees (the vendor's variable set before
    the worker starts, so that every library in it sees that device alone). A launcher
    that does not tell the local rank: ``rank`` instead.
    """
    from hpcsched.launchers.resources import detect_gpus, launcher_local_rank

    gpus = detect_gpus()
    if not one_per_rank or gpus is None or not gpus.ids:
        if one_per_rank:
            logger.warning("--worker-per-gpu: no GPUs found on %s", os.uname().nodename)
        return gpus
    local = launcher_local_rank()
    if local is None:
        logger.warning("--worker-per-gpu: the MPI launcher does not say the local rank "
                       "(MPI_LOCALRANKID, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID): the GPU "
                       "is chosen by rank %d", rank)
        local = rank
    mine = gpus.one(local)
    os.environ.update(mine.env(mine.ids))
    return mine


def serve_rank(job: _Job, options: InitOptions, name: Any = None) -> int:
    """Run a worker until the scheduler closes it; its exit code."""
    from hpcsched.core.worker.server import Worker

    nthreads, memory_limit, host = rank_resources(options)
    gpus = rank_gpus(options.worker_per_gpu, job.rank)
    # wait_closed() returns when the close starts; the endpoint may only be shut down
    # once the close is over (its last messages sent), which on_close tells
    closed = threading.Event()

    def out_of_memory(why: str) -> None:
        # a rank cannot be restarted: spilling and pausing did not hold, so the job ends
        _abort(job, 1, f"worker rank {job.rank} (on {host or os.uname().nodename}) is out of "
                       f"memory: {why}")

    kwargs: dict[str, Any] = {
        "nthreads": nthreads,
        "memory_limit": memory_limit,
        "name": f"rank-{job.rank}" if name is None else name,
        "host": host,
        "on_memory_terminate": out_of_memory,
        "restartable": False,
        "gpus": gpus,
        **options.worker_kwargs,
    }
    if options.local_directory is not None:
        kwargs.setdefault("local_directory",
                          os.path.join(options.local_directory, f"hpcsched-worker-{job.rank}"))
    try:
        worker = (options.worker_class or Worker)("mpi://0", on_close=lambda _: closed.set(),
                                                  **kwargs)
        # started before it joins: once it has, a task may run on its threads at once, and
        # must find the collector as the program left it (the join makes little garbage)
        MODE.started()
        worker.start()
    except Exception as e:  # noqa: BLE001 - every reason ends the job the same way
        _abort(job, 1, f"worker rank {job.rank} could not join the scheduler on rank 0: {e}")
    _watch(job)
    try:
        while not worker.wait_closed(1.0):
            pass
        code = worker.exit_code
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
        worker.close("interrupted")
    if not closed.wait(10.0):
        logger.warning("worker rank %d: closing took over 10s; leaving anyway", job.rank)
    if code == EXIT_NOT_FINISHED:
        _let_tasks_end(worker)
    _leave(job, code)
    return code


def _let_tasks_end(worker: Any) -> None:
    """Let the tasks running on this rank end before it leaves (within the exit timeout).

    The job stopped at its walltime (:mod:`hpcsched.hpc.walltime`): a checkpointed task
    that ends keeps its result rather than run again in the job's continuation.
    """
    pool = worker.tasks.executor  # shut down with the worker: only running calls remain
    deadline = time.monotonic() + max(1.0, float(config.read(MPISettings).exit_timeout) - 1)
    while pool.nthreads and time.monotonic() < deadline:
        time.sleep(0.02)


def exit_rank(code: int) -> None:
    """Finalize MPI and leave now, whatever threads remain (a worker rank's end).

    C ``exit()``, not ``os._exit``: the MPI library's own exit handlers must run
    (hydra reports a rank that skips them as killed, measured), but Python's
    shutdown must not wait for a task thread that ignores the close.
    """
    job = MODE.job
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        if job is not None and job.MPI is not None and not job.MPI.Is_finalized():
            if _gang_member_in_mpi():
                # MPI_Finalize would free what the blocked thread uses (measured: heap
                # corruption), and leaving without it has hydra kill the ranks waiting in
                # theirs: every rank has passed the fence, so the job ends here, with its
                # own exit code
                print(f"hpcsched: worker rank {job.rank} has a task still blocked in a "
                      "failed gang's MPI call; ending the job with MPI_Abort"
                      f"({code})", file=sys.stderr, flush=True)
                time.sleep(_ABORT_GRACE)  # for the launcher to pass the line on (_abort)
                job.MPI.COMM_WORLD.Abort(code)
            _free_gang_comms()
            job.MPI.Finalize()
        import ctypes

        ctypes.CDLL(None).exit(code)
    finally:
        os._exit(code)


def _free_gang_comms() -> None:
    """Free the communicators the rank kept for gangs (:mod:`hpcsched.hpc.gang`)."""
    gang = sys.modules.get("hpcsched.hpc.gang")
    if gang is not None:
        gang.free_all()


def _gang_member_in_mpi() -> bool:
    """Whether a task thread is still inside a gang's MPI call.

    Its gang failed and left it blocked in a collective, which MPI cannot interrupt.
    """
    gang = sys.modules.get("hpcsched.hpc.gang")
    return gang is not None and gang.members_in_mpi() > 0


# ------------------------------------------------------------------ ending
def _abort(job: _Job, code: int, why: str) -> None:
    print(f"hpcsched: {why}; aborting the MPI job", file=sys.stderr, flush=True)
    # the launcher forwards our stderr and kills the job on MPI_Abort: give it a moment
    # to pass the message on first, or the user may never see why the job ended
    time.sleep(_ABORT_GRACE)
    (job.comm or job.MPI.COMM_WORLD).Abort(code or 1)


_ABORT_GRACE = 0.5  # seconds between saying why and MPI_Abort


def _fence(job: _Job, timeout: float) -> bool:
    """Nonblocking barrier of all ranks polled with back-off; False on timeout."""
    from hpcsched.hpc.backoff import Backoff

    req = job.fence_comm.Ibarrier()
    deadline = time.monotonic() + timeout
    wait = Backoff(min=1e-4, fast_max=5e-3, max=2e-2)
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        wait.sleep()
    return True


def _leave(job: _Job, code: int) -> None:
    """This rank's server is closed: meet the others at the fence, stop the endpoint."""
    from hpcsched.hpc.mpi import shutdown_endpoint

    timeout = float(config.read(MPISettings).exit_timeout)
    if job.rank != 0:
        timeout *= 2  # rank 0 is the one to abort, with the better message
    # the endpoint first: pending sends (the close messages) finish while peers still poll
    endpoint = shutdown_endpoint(timeout=1.0, free=False)
    if not _fence(job, timeout):
        who = "the worker ranks" if job.rank == 0 else "rank 0"
        _abort(job, code, f"{who} did not finish within {timeout:g}s after "
                          f"{'the script ended' if job.rank == 0 else 'the scheduler closed'}"
                          " (config mpi.exit-timeout)")
    if endpoint is not None:
        # every rank has stopped sending: receive what arrived after our endpoint stopped,
        # which MPI_Finalize would otherwise find unmatched
        endpoint.drain(timeout)
    # fence_comm is not freed: MPI_Finalize follows, and a free could wait on peers


# ------------------------------------------------------------------ initialize()
def initialize(interface: str | None = None, nthreads: int | None = None,
               local_directory: str | None = None,
               memory_limit: MemoryLimit | str | None = DEFAULT_MEMORY_LIMIT,
               nanny: bool = False, dashboard: bool = True, dashboard_address: str | None = ":8787",
               protocol: str | None = None, worker_class: Any = None,
               worker_options: dict | None = None, comm: Any = None,
               exit: bool = True, scheduler_port: int | None = None) -> bool:  # noqa: A002
    """Set up MPI mode from inside a script started with ``mpiexec -n N python script.py``.

    Takes ``dask_mpi.initialize``'s parameters (see
    :mod:`hpcsched.hpc.initialize_options` for what each means here; those
    meaningless under MPI are logged once as ignored, with why), so a dask-mpi
    script runs after changing its import line.

    Unlike dask-mpi, rank 0 of ``comm`` runs both the scheduler and the script
    (the client), so every other rank is a worker: ``mpiexec -n 4`` gives three
    workers, named by their rank as dask-mpi names them (``submit(...,
    workers=2)``). Rank 0 returns True. At exit the workers are closed with the
    script's status (``sys.exit(n)`` -> n, an uncaught exception -> 1) and the
    job ends on every rank. The other ranks serve as workers until then and exit
    with that status; the rest of the script never runs on them. With
    ``exit=False`` they return False instead once the cluster is closed, which
    rank 0 does with :func:`send_close_signal` (or at its exit). With a single
    process nothing is set up and ``Client()`` starts a LocalCluster (dask-mpi
    raises instead). Example::

        import hpcsched
        hpcsched.initialize()
        from hpcsched import Client
        client = Client()
    """
    options = resolve(interface=interface, nthreads=nthreads, local_directory=local_directory,
                      memory_limit=memory_limit, nanny=nanny, dashboard=dashboard,
                      dashboard_address=dashboard_address, protocol=protocol,
                      worker_class=worker_class, worker_options=worker_options, comm=comm,
                      scheduler_port=scheduler_port, exit=exit)
    if MODE.job is not None:  # python -m hpcsched already did it, or a second call
        return MODE.job.rank == 0
    MODE.pause_collector()
    job = MODE.setup(options)
    if job.size == 1:
        print("hpcsched.initialize: world size 1: Client() will start a LocalCluster",
              file=sys.stderr, flush=True)
        world_of_one_fixed_size()
        return True
    if job.rank == 0:
        log_ignored(options)
        MODE.record_exit_status()
        atexit.register(MODE.close_at_exit)
        return True
    code = serve_rank(job, options, name=job.rank)
    if options.exit:
        exit_rank(code)
    return False


def send_close_signal() -> None:
    """Rank 0: close the workers now and end the cluster (dask-mpi's ``send_close_signal``).

    For ``initialize(exit=False)``: the worker ranks then return False from
    ``initialize`` and the script goes on on every rank. Idempotent; without it
    the cluster closes when rank 0's script ends.
    """
    MODE.close_cluster(MODE.exit_status or 0)


def execute(client_function: Any = None, client_args: Any = (), client_kwargs: Any = None,
            client_rank: int = 1, scheduler: bool = True, scheduler_rank: int = 0,
            scheduler_address: str | None = None, scheduler_port: int | None = None,
            scheduler_file: str | None = None, interface: str | None = None,
            nthreads: int | None = None, local_directory: str | None = None,
            memory_limit: MemoryLimit | str | None = DEFAULT_MEMORY_LIMIT, nanny: bool = False,
            dashboard: bool = True, dashboard_address: str | None = ":8787",
            protocol: str | None = None, exclusive_workers: bool = True,
            worker_class: Any = None, worker_options: dict | None = None,
            worker_name: str | None = None, comm: Any = None) -> None:
    """Run ``client_function`` on a cluster of ``comm``'s ranks (dask-mpi's ``execute``).

    ``client_function(*client_args, **client_kwargs)`` runs, then ``execute`` returns
    on every rank. As :func:`initialize`, rank 0 runs the scheduler and the function, every other rank
    is a worker named by its rank; once the function returns the workers are closed and
    every rank goes on after ``execute``. If it raises, the job ends (``MPI_Abort``, after
    the traceback), since the other ranks have gone on without rank 0.
    dask-mpi's defaults ``client_rank=1``, ``scheduler_rank=0`` mean this layout; other
    ranks, ``scheduler=False`` (workers joining a scheduler started elsewhere),
    ``scheduler_file`` and ``worker_name`` are refused with what to use instead. The
    other parameters are :func:`initialize`'s. Example::

        from hpcsched import Client, execute

        def main():
            with Client() as client:
                print(client.submit(sum, [1, 2]).result())

        execute(main)
    """
    refused = {
        "client_rank": (client_rank, 1), "scheduler_rank": (scheduler_rank, 0),
        "scheduler": (scheduler, True), "scheduler_address": (scheduler_address, None),
        "scheduler_file": (scheduler_file, None), "worker_name": (worker_name, None)}
    bad = [f"{k}={v!r}" for k, (v, default) in refused.items() if v != default]
    if bad:
        raise ValueError(
            f"execute({', '.join(bad)}): hpcsched runs the scheduler and the client function "
            "on rank 0 of comm and a worker, named by its rank, on every other rank. For a "
            "scheduler that serves clients started elsewhere use mpiexec -n N python -m "
            "hpcsched --scheduler-file F")
    if client_function is not None and not callable(client_function):
        raise TypeError(f"execute(client_function={client_function!r}): not callable")
    if not exclusive_workers:
        logger.info("execute(exclusive_workers=False) is ignored: rank 0 runs the scheduler "
                    "and the client function, every other rank a worker")
    is_client = initialize(interface=interface, nthreads=nthreads,
                           local_directory=local_directory, memory_limit=memory_limit,
                           nanny=nanny, dashboard=dashboard,
                           dashboard_address=dashboard_address, protocol=protocol,
                           worker_class=worker_class, worker_options=worker_options,
                           comm=comm, exit=False, scheduler_port=scheduler_port)
    if not is_client:
        return
    try:
        if client_function is not None:
            client_function(*client_args, **(client_kwargs or {}))
    except BaseException as exc:
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        MODE.close_cluster(code)  # the workers end with the failure's status
        job = MODE.job
        if code and job is not None and job.size > 1:
            # the other ranks went on past execute(): a rank 0 that ends with this error
            # would leave them waiting for it in their next collective, for good
            traceback.print_exc()
            _abort(job, code, "execute()'s client function failed (above)")
        raise
    send_close_signal()
