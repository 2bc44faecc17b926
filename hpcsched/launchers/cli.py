"""Command line: ``hpcsched scheduler``, ``hpcsched worker``, ``python -m hpcsched script.py``.

* ``hpcsched scheduler [--host H] [--port P] [--interface IF] [--scheduler-file F]
  [--journal J]`` starts a scheduler over authenticated TCP. The scheduler file (JSON
  with the address and the secret, mode 0600) is how workers and clients find it.
  With a journal, the same command run again after the scheduler died takes up its
  clients' graphs and listens at the address, with the secret, it had.
* ``hpcsched worker ADDRESS | --scheduler-file F [--nthreads N] [--nworkers P] ...``
  starts worker(s). The secret comes from the scheduler file, or from
  ``HPCSCHED_SECRET_FILE`` / ``HPCSCHED_SECRET`` in the environment — never from
  the command line, where other users could read it. A worker leaves as soon as
  it is closed, whatever its task threads are doing; one past its memory's
  terminate fraction exits with ``EXIT_MEMORY``. With ``--nworkers P`` (or
  ``--nanny``) this process supervises the workers as dask's nanny does: one
  that exits with ``EXIT_MEMORY`` or is killed by a signal (the out-of-memory
  killer) is started again; one that exits otherwise (closed, lost its
  scheduler) is not, so that a batch job ends with its scheduler. Nanny plugins
  (``Client.register_plugin(NannyPlugin)``) run in this process, one
  :class:`~hpcsched.core.worker.nanny.Nanny` per worker process; a plain ``hpcsched
  worker`` has no nanny and refuses them.
* anything else is MPI mode (:mod:`hpcsched.hpc.command`): ``python -m hpcsched
  script.py [args]`` under mpiexec runs the scheduler and the script on rank 0 and
  workers elsewhere; ``python -m hpcsched --scheduler-file F`` runs no script: rank 0
  serves clients that read ``F`` until one calls ``shutdown()``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

    from hpcsched.core.worker.tasks.gpus import Gpus

logger = logging.getLogger("hpcsched.cli")


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)


def _rank_suffix() -> str | None:
    """The rank of this process under srun/mpiexec when several were started, else None."""
    from hpcsched.launchers.resources import launcher_rank

    rank = launcher_rank()
    return None if rank is None else str(rank)


def parse_resources(text: str | None) -> dict[str, float]:
    """``"GPU=2,MEM=1e9"`` -> ``{"GPU": 2.0, "MEM": 1e9}``."""
    out: dict[str, float] = {}
    if not text:
        return out
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        name, sep, value = part.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"hpcsched worker: --resources: {part!r} is not NAME=NUMBER") from None
    return out


def duration(zero: bool = False) -> Callable[[str], float]:
    """An option's type: seconds, or a duration as dask writes it (``"55m"``, ``"1h30m"``,
    ``"00:30:00"``; :func:`hpcsched.core.units.parse_interval`); 0 allowed with ``zero``."""
    from hpcsched.core.units import parse_interval

    def seconds(text: str) -> float:
        try:
            return parse_interval(text, "duration", zero=zero)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    seconds.__name__ = "duration"  # argparse names the type in its error
    return seconds


def worker_parser() -> argparse.ArgumentParser:
    """The options of ``hpcsched worker``."""
    from hpcsched.core.units import DEFAULT_MEMORY_LIMIT

    p = argparse.ArgumentParser(prog="hpcsched worker", description="Start hpcsched worker(s).")
    p.add_argument("--version", action="version", version=version_text())
    p.add_argument("address", nargs="?", help="scheduler address, e.g. tcp://10.0.0.1:8786")
    p.add_argument("--scheduler-file", help="JSON file written by the scheduler")
    p.add_argument("--name", default=None)
    p.add_argument("--nthreads", type=int, default=None)
    p.add_argument("--nworkers", type=int, default=1, help="worker processes to start")
    p.add_argument("--nanny", action="store_true",
                   help="supervise the worker in a process of its own and restart it when "
                        "memory or a signal ends it (always so with --nworkers > 1)")
    p.add_argument("--memory-limit", default=DEFAULT_MEMORY_LIMIT,
                   help="bytes, a size (4GB), a fraction of the machine's memory (0.5), none, "
                        "or auto: the share of this machine or batch job per worker (default)")
    # durations: seconds or as dask writes them ("55m", "1h30m", "00:30:00")
    p.add_argument("--death-timeout", type=duration(), default=None,
                   help="how long to try to reach the scheduler (seconds, or e.g. '2m')")
    p.add_argument("--scheduler-reconnect-timeout", type=duration(zero=True), default=None,
                   help="how long to keep tasks and results and look for a scheduler that "
                        "vanished (default: worker.scheduler-reconnect-timeout; 0: exit)")
    p.add_argument("--lifetime", type=duration(), default=None,
                   help="retire gracefully after this long (seconds, or e.g. '55m'; a job's "
                        "walltime), as dask's worker does")
    p.add_argument("--lifetime-stagger", type=duration(zero=True), default=0.0,
                   help="retire up to this much earlier or later (e.g. '4m'), so that the "
                        "workers of a job do not all leave at once")
    p.add_argument("--resources", default=None,
                   help="abstract resources, e.g. GPU=2,MEM=1e9 (the GPUs found are "
                        "advertised as GPU=<their number>, with their ids, unless given here)")
    p.add_argument("--resources-only", action="store_true",
                   help="run only tasks that ask for one of --resources (a GPU job's "
                        "workers): the scheduler places no other task here")
    p.add_argument("--worker-per-gpu", action="store_true",
                   help="one worker process per GPU found, each seeing its own alone "
                        "(CUDA_VISIBLE_DEVICES or the vendor's variable set for it)")
    p.add_argument("--local-directory", default=None,
                   help="where results spill to disk (default: worker.local-directory, "
                        "else $TMPDIR)")
    p.add_argument("--host", default=None, help="address to listen on for peers")
    p.add_argument("--interface", default=None,
                   help="network interface to listen on for peers (e.g. ib0), instead of --host")
    p.add_argument("--preload", action="append", default=None, metavar="MODULE",
                   help="a module to import, or a .py file to run, at the worker's start "
                        "(its dask_setup(worker) called); may be given several times")
    p.add_argument("--log-level", default=os.environ.get("HPCSCHED_LOG_LEVEL", "warning"))
    return p


def worker_main(argv: list[str]) -> int:
    p = worker_parser()
    args = p.parse_args(argv)
    _setup_logging(args.log_level)
    if args.nworkers < 1:
        p.error(f"--nworkers must be at least 1, not {args.nworkers}")
    from hpcsched.launchers.resources import detect_gpus

    gpus = detect_gpus()
    if args.worker_per_gpu:
        if gpus is None or not gpus.ids:
            p.error("--worker-per-gpu: no GPUs found (CUDA_VISIBLE_DEVICES, "
                    "ROCR_VISIBLE_DEVICES, ZE_AFFINITY_MASK, SLURM_STEP_GPUS, SLURM_JOB_GPUS, "
                    "nvidia-smi -L)")
        if args.nworkers > 1:
            p.error("--worker-per-gpu starts one worker per GPU: leave out --nworkers")
        args.nworkers = len(gpus.ids)
    try:
        nthreads, memory = worker_resources(args)
    except ValueError as e:
        p.error(f"--memory-limit: {e}")
    if args.nworkers > 1 or args.nanny or args.worker_per_gpu:
        shares: list[tuple[str, ...]] | None = None
        if args.worker_per_gpu:
            shares = [(i,) for i in gpus.ids] if gpus is not None else None
        else:
            try:
                shares = gpu_shares(gpus, args.nworkers, parse_resources(args.resources))
            except ValueError as e:
                p.error(f"--resources: {e}")
        return _spawn_workers(argv, args, memory, gpus, shares)

    from hpcsched.core import config
    from hpcsched.core.comm.base import Security
    from hpcsched.core.comm.scheduler_file import wait_for_scheduler_file
    from hpcsched.core.settings import WorkerSettings
    from hpcsched.core.worker.server import Worker

    security = Security.from_environment()
    if args.scheduler_file:
        # as dask-worker does: the scheduler (a batch job of its own) may write the file
        # after the worker starts; wait for it as long as the worker tries to reach it
        timeout = args.death_timeout
        if timeout is None:
            timeout = config.read(WorkerSettings).death_timeout
        try:
            address, security = wait_for_scheduler_file(args.scheduler_file, timeout, security)
        except (OSError, ValueError) as e:
            sys.exit(f"hpcsched worker: {e}")
    elif args.address:
        address = args.address if "://" in args.address else f"tcp://{args.address}"
    else:
        p.error("give the scheduler's ADDRESS or --scheduler-file")
    name = args.name
    suffix = _rank_suffix()
    if name and suffix is not None:
        name = f"{name}-{suffix}"
    host = args.host
    if args.interface and not host:
        from hpcsched.launchers.address import interface_address

        try:
            host = interface_address(args.interface)
        except ValueError as e:
            print(f"hpcsched worker: --interface: {e}", file=sys.stderr, flush=True)
            return 1
    if args.local_directory:
        os.makedirs(args.local_directory, exist_ok=True)
        os.chdir(args.local_directory)
    from hpcsched.core.worker.memory import EXIT_MEMORY
    from hpcsched.core.worker.preload import EXIT_PRELOAD, PreloadError

    worker = Worker(address, nthreads=nthreads, memory_limit=memory, name=name,
                    resources=parse_resources(args.resources), security=security,
                    resources_only=args.resources_only,
                    death_timeout=args.death_timeout, lifetime=args.lifetime,
                    lifetime_stagger=args.lifetime_stagger, host=host,
                    local_directory=args.local_directory,
                    scheduler_file=os.path.abspath(args.scheduler_file)
                    if args.scheduler_file else None,
                    scheduler_reconnect_timeout=args.scheduler_reconnect_timeout,
                    preload=args.preload, gpus=gpus, walltime_end=_walltime_end(),
                    # a process of its own: past the terminate fraction it leaves at once
                    # (its connection drops, the scheduler reschedules its tasks) for its
                    # supervisor to start it anew
                    on_memory_terminate=lambda why: exit_now(EXIT_MEMORY), restartable=True)

    def on_signal(signum: int, frame: Any) -> None:
        threading.Thread(target=worker.close, args=(f"signal {signum}",), daemon=True).start()

    import signal  # here, as subprocess below: MPI mode's every rank imports this module

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        worker.start()
    except (TimeoutError, ConnectionError, OSError) as e:
        print(f"hpcsched worker: {e}", file=sys.stderr, flush=True)
        return 1
    except PreloadError as e:
        print(f"hpcsched worker: {e}", file=sys.stderr, flush=True)
        return EXIT_PRELOAD
    worker.run()
    # closed: leave now. A task thread still running (the scheduler is gone, it will
    # never be asked for its result) must not keep the process, hence a batch job, alive
    exit_now(worker.exit_code)
    return worker.exit_code


def _walltime_end() -> float | None:
    """When this process's batch job ends (epoch seconds): what its environment says, else
    what its batch system's commands say, asked once here (SLURM before 23.02 has
    ``scontrol`` say it); a value that cannot be read is logged, and the worker starts
    without it."""
    from hpcsched.launchers.resources import batch_job, job_end

    try:
        return job_end(batch_job())
    except (ValueError, KeyError, RuntimeError) as e:
        logger.warning("hpcsched worker: the job's walltime is unknown: %s", e)
        return None


def exit_now(code: int) -> None:
    """End this process with ``code`` without waiting for other threads (logs flushed)."""
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def worker_resources(args: argparse.Namespace) -> tuple[int, int]:
    """(threads, memory limit in bytes) of each worker these options start.

    The memory limit means what it means everywhere
    (:func:`hpcsched.core.units.parse_memory_limit`); ``auto`` is this process's share of
    the machine or batch job (:func:`hpcsched.launchers.resources.detect`) split among
    ``--nworkers``.
    """
    from hpcsched.core.units import parse_memory_limit
    from hpcsched.launchers.resources import detect, worker_memory_limit

    limit = parse_memory_limit(args.memory_limit)
    res = detect() if not args.nthreads or limit == "auto" else None
    memory = worker_memory_limit(limit, workers=args.nworkers,
                                 total=res.memory_limit if res else None)
    return args.nthreads or (res.nthreads if res else 1), memory


def _without(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option VALUE`` and ``option=VALUE``."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out


def gpu_shares(gpus: Gpus | None, nworkers: int, resources: dict[str, float]
               ) -> list[tuple[str, ...]] | None:
    """Each of ``nworkers`` worker processes' own GPUs, or None (all see every device).

    The processes of one job (``--nworkers P``) would otherwise each find every device
    and offer the first ones, the same for all: the devices are split evenly among them,
    ``--resources GPU=k`` devices each when given, else as many as divide evenly.

    >>> from hpcsched.core.worker.tasks.gpus import Gpus
    >>> gpu_shares(Gpus(("0", "1", "2", "3")), 2, {})
    [('0', '1'), ('2', '3')]
    >>> gpu_shares(Gpus(("0", "1", "2", "3")), 4, {"GPU": 1})
    [('0',), ('1',), ('2',), ('3',)]
    """
    if gpus is None or not gpus.ids or nworkers < 2:
        return None
    asked = resources.get("GPU")
    if asked is None:
        per = len(gpus.ids) // nworkers
    elif asked != int(asked) or asked < 1:
        return None  # a fraction of a device each: the processes share them, as asked
    else:
        per = int(asked)
        if per * nworkers > len(gpus.ids):
            raise ValueError(f"GPU={per} for each of {nworkers} worker processes, but "
                             f"{len(gpus.ids)} GPU(s) were found "
                             f"({gpus.source or gpus.variable})")
    if per < 1:
        return None
    return [gpus.ids[k * per:(k + 1) * per] for k in range(nworkers)]


def _spawn_workers(argv: list[str], args: argparse.Namespace, memory: int,
                   gpus: Gpus | None = None,
                   shares: list[tuple[str, ...]] | None = None) -> int:
    """``--nworkers P``: P worker processes named NAME-0..NAME-(P-1); signals forwarded.

    Each gets its memory limit in bytes, resolved here (``memory``), where ``auto`` knows
    how many workers share the machine. ``shares`` (of ``gpus``; ``--worker-per-gpu``,
    or :func:`gpu_shares`): worker ``k`` is started with the vendor's variable naming its
    own devices alone, before any library in it could look.
    """
    base = list(argv)
    for option in ("--nworkers", "--name", "--memory-limit"):
        base = _without(base, option)
    base = [a for a in base if a not in ("--nanny", "--worker-per-gpu")] + [
        "--memory-limit", str(memory)]
    name = args.name or f"worker-{os.getpid()}"
    if args.nworkers == 1 and args.name:
        names = [args.name]
    else:
        names = [f"{name}-{k}" for k in range(args.nworkers)]

    import subprocess  # here, not at the top: MPI mode's every rank imports this module

    from hpcsched.core.worker.nanny import Nanny

    lock = threading.RLock()
    stopping = threading.Event()

    def start(k: int) -> subprocess.Popen:
        env = dict(os.environ)
        if gpus is not None and shares is not None:
            env.update(gpus.env(shares[k]))
        return nannies[k].popen([sys.executable, "-m", "hpcsched", "worker", *base,
                                 "--name", names[k]], env=env)

    def restart(k: int) -> None:
        """A nanny plugin's restart: the worker process stopped and started again."""
        with lock:
            if stopping.is_set():
                return
            old = procs[k]
            old.terminate()
            try:
                old.wait(10)
            except subprocess.TimeoutExpired:
                old.kill()
                old.wait()
            procs[k] = start(k)

    def restarter(k: int) -> Callable[[], None]:
        return lambda: restart(k)

    nannies = [Nanny(names[k], args.address or args.scheduler_file or "",
                     restarter(k), local_directory=args.local_directory)
               for k in range(args.nworkers)]
    procs = [start(k) for k in range(args.nworkers)]

    def forward(signum: int, frame: Any) -> None:
        stopping.set()
        for pr in procs:
            if pr.poll() is None:
                pr.send_signal(signum)

    import signal

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        return supervise(procs, start, stopping, lock=lock)
    finally:
        for nanny in nannies:
            nanny.close()  # its plugins' teardown


def supervise(procs: list[subprocess.Popen], start: Any, stopping: threading.Event,
              max_restarts: int = 10, poll: float = 0.5, lock: Any = None) -> int:
    """Wait for the worker processes ``procs``, restarting (``procs[k] = start(k)``) one
    that left because of memory (``EXIT_MEMORY``) or a signal we did not send (the
    out-of-memory killer), at most ``max_restarts`` times a minute; the exit status of
    the workers once they are all done (the largest in magnitude). ``lock`` is held by
    whoever else replaces ``procs[k]`` (a nanny restarting its worker): a process
    replaced meanwhile is not ours to judge."""
    from hpcsched.core.worker.memory import EXIT_MEMORY

    lock = lock if lock is not None else threading.Lock()
    codes: dict[int, int] = {}
    restarts: list[float] = []
    while len(codes) < len(procs):
        for k in range(len(procs)):
            with lock:
                _judge(procs, k, start, stopping, codes, restarts, max_restarts, EXIT_MEMORY)
        if len(codes) < len(procs):
            stopping.wait(poll)
    return max(codes.values(), key=abs) if codes else 0


def _judge(procs: list[subprocess.Popen], k: int, start: Any, stopping: threading.Event,
           codes: dict[int, int], restarts: list[float], max_restarts: int,
           exit_memory: int) -> None:
    """One look at worker process ``k``: still running, restarted, or done (in ``codes``)."""
    pr = procs[k]
    if k in codes:
        return
    code = pr.poll()
    if code is None:
        return
    now = time.monotonic()
    restarts[:] = [t for t in restarts if now - t < 60]
    if not stopping.is_set() and (code == exit_memory or code < 0) \
            and len(restarts) < max_restarts:
        restarts.append(now)
        logger.warning("worker process %d exited with %d: restarting it", pr.pid, code)
        procs[k] = start(k)
        return
    codes[k] = code


def scheduler_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="hpcsched scheduler", description="Start a scheduler.",
        epilog="Without --host or --interface it listens on every interface and names, in "
               "the scheduler file, the source address of this host's default route (else the "
               "first address of an interface that is up): the address other nodes reach it "
               "at, as dask's `dask scheduler` does. On a login node whose compute nodes reach "
               "another network, name it: --interface ib0.")
    p.add_argument("--version", action="version", version=version_text())
    p.add_argument("--host", default=None, help="listen on, and name, this address only")
    p.add_argument("--port", type=int, default=8786)
    p.add_argument("--interface", default=None,
                   help="listen on, and name, this network interface's address (e.g. ib0)")
    p.add_argument("--scheduler-file", default=None)
    p.add_argument("--history", default=None,
                   help="SQLite file every task's run is appended to (default: "
                        "JOURNAL.history.sqlite with --journal, else none); read it with "
                        "`hpcsched history`")
    p.add_argument("--journal", default=None,
                   help="journal file: restarted with it, the scheduler takes up its graphs, "
                        "clients and address again (default: scheduler.journal)")
    p.add_argument("--log-level", default=os.environ.get("HPCSCHED_LOG_LEVEL", "info"))
    args = p.parse_args(argv)
    _setup_logging(args.log_level)
    from hpcsched.core.client.client import write_scheduler_file
    from hpcsched.core.comm.base import Security
    from hpcsched.core.comm.tcp_comm import format_hostport
    from hpcsched.core.scheduler.server import Scheduler

    host = args.host
    if args.interface:
        from hpcsched.launchers.address import interface_address

        try:
            host = interface_address(args.interface)
        except ValueError as e:
            p.error(f"--interface: {e}")
    # every interface: the listener names the routable address (core/comm/hosts.py)
    host = host or "0.0.0.0"
    security = Security.from_environment() or Security.generate()
    sched = Scheduler(f"tcp://{format_hostport(host, args.port)}", security,
                      journal=args.journal, history=args.history).start()
    if args.scheduler_file:  # the journal's secret, when it had one
        write_scheduler_file(args.scheduler_file, sched.address, sched.security)
    print(f"hpcsched scheduler at {sched.address}", file=sys.stderr, flush=True)
    if sched.dashboard_link:
        print(f"dashboard at {sched.dashboard_link}", file=sys.stderr, flush=True)
    if not args.scheduler_file:
        print("(no --scheduler-file: workers need HPCSCHED_SECRET to join)", file=sys.stderr)
    stop = threading.Event()
    import signal

    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    # until Ctrl-C, SIGTERM, or a client's shutdown()
    while not (stop.wait(1.0) or sched.control.shutdown_requested.is_set()):
        pass
    sched.close()
    if args.scheduler_file:
        try:
            os.unlink(args.scheduler_file)
        except OSError:
            pass
    return 0


USAGE = """usage: hpcsched scheduler [options]
       hpcsched worker ADDRESS|--scheduler-file F [options]
       hpcsched submit --scheduler-file F [--array 1-100|--each-line FILE|--from-json FILE] -- COMMAND...
       hpcsched job list|info J|wait J|cancel J|cat J [--task I] [stdout|stderr] --scheduler-file F
       python -m hpcsched [--nthreads N] [--memory-limit M] script.py [args...]   (under mpiexec)
       python -m hpcsched [--nthreads N] [--memory-limit M] --scheduler-file F    (under mpiexec:
           rank 0 serves clients that read F, until client.shutdown() or the walltime)
       hpcsched --version
"""


def version_text() -> str:
    import platform

    from hpcsched._version import __version__

    return f"hpcsched {__version__} (Python {platform.python_version()})"
