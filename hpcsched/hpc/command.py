"""``python -m hpcsched`` under a launcher: run a script on the job, or serve clients.

``mpiexec -n N python -m hpcsched script.py [args...]``: rank 0 runs the scheduler
and the script as ``__main__``, the other ranks are workers (the failure model:
:mod:`hpcsched.hpc.bootstrap`).

``mpiexec -n N python -m hpcsched --scheduler-file F`` (no script), dask-mpi's
``dask-mpi --scheduler-file F``: rank 0 runs the scheduler and also listens on TCP,
with a secret it writes to ``F`` beside its address (mode 0600), and the other
ranks are workers that talk MPI among themselves and to it. A client elsewhere --
a notebook on the login node -- connects with ``Client(scheduler_file="F")`` or
``Client("F")``; the results it gathers come through the scheduler, as in
distributed, so it never needs to reach a worker rank. The job ends, every rank
exiting 0, when a client calls ``client.shutdown()``, or ``--walltime-margin``
seconds before the batch job's end (``SLURM_JOB_END_TIME``, if set), so that the
ranks leave before the batch system kills them; Ctrl-C ends it with 130. ``F`` is
removed at the end.

A script is stopped ``--walltime-margin`` seconds before its batch job's end, or on
``SIGUSR1``, and every rank exits 75 ("not finished"); with ``--requeue`` the job queues
its continuation, which resumes from ``--journal`` (:mod:`hpcsched.hpc.walltime`).
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import time
import traceback

from hpcsched.core import config
from hpcsched.core.settings import DashboardSettings, MPISettings
from hpcsched.core.units import DEFAULT_MEMORY_LIMIT, MemoryLimit
from hpcsched.hpc.bootstrap import (
    EXIT_INTERRUPTED,
    MODE,
    exit_rank,
    serve_rank,
    world_of_one_fixed_size,
)
from hpcsched.hpc.initialize_options import InitOptions
from hpcsched.hpc.walltime import (
    EXIT_NOT_FINISHED,
    Drain,
    WalltimeReached,
    checkpoints_kept,
    drain_time,
    ignore_drain_signal,
    plan_continuation,
    run_continuation,
    say,
)
from hpcsched.launchers.cli import duration

logger = logging.getLogger("hpcsched.bootstrap")

WALLTIME_MARGIN = 30.0  # seconds: a serving job ends this long before its batch job does


# ------------------------------------------------------------------ the script
def _exit_code(e: SystemExit) -> int:
    """What Python itself would exit with for ``SystemExit(e.code)`` (printing a message)."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code % 256
    print(code, file=sys.stderr, flush=True)
    return 1


def _print_traceback(e: BaseException) -> None:
    """The traceback as ``python script.py`` would show it (without our frames)."""
    tb = e.__traceback__
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    while tb is not None and (tb.tb_frame.f_code.co_filename in ours or
                              os.path.abspath(tb.tb_frame.f_code.co_filename) in ours):
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb, file=sys.stderr)
    sys.stderr.flush()


def run_script(path: str, args: list[str]) -> int:
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]``; its exit status."""
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        return _exit_code(e)
    except WalltimeReached as e:
        say(f"stopped {path} before its job's end ({e}): no task is started any more; the "
            "results of the finished tasks annotated checkpoint=True are kept for a run with "
            f"the same --journal. Not finished: exit status {EXIT_NOT_FINISHED}")
        return EXIT_NOT_FINISHED
    except KeyboardInterrupt as e:
        _print_traceback(e)
        return EXIT_INTERRUPTED
    except BaseException as e:  # noqa: BLE001 - the user's error: reported, job ends with 1
        _print_traceback(e)
        return 1
    return 0


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's own, as wide as the terminal, found as :func:`shutil.get_terminal_size` does.

    argparse imports :mod:`shutil` (and with it bz2, lzma and fnmatch, ~3 ms) to ask, for
    every argument it adds, on every rank.
    """

    def __init__(self, prog: str) -> None:
        try:
            columns = int(os.environ.get("COLUMNS", 0))
        except ValueError:
            columns = 0
        if columns <= 0:
            try:
                columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
            except (AttributeError, ValueError, OSError):
                columns = 0
        super().__init__(prog, width=(columns or 80) - 2)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hpcsched", formatter_class=_HelpFormatter,
        usage="mpiexec -n N python -m hpcsched [options] (SCRIPT [ARGS...] | "
              "--scheduler-file F)",
        description="Run SCRIPT under mpiexec (or srun): rank 0 runs the scheduler and the "
                    "script, the other ranks are workers; Client() in the script connects to "
                    "them. Without a script, with --scheduler-file F: rank 0 runs the "
                    "scheduler, reachable over TCP by clients elsewhere (a notebook: "
                    "Client(scheduler_file='F')), the other ranks are workers talking MPI; "
                    "the job ends on a client's shutdown() or at the batch job's walltime.")
    p.add_argument("--nthreads", type=int, default=None,
                   help="threads per worker rank (default: the CPUs the job gives each rank)")
    p.add_argument("--memory-limit", default=DEFAULT_MEMORY_LIMIT,
                   help="memory per worker rank: bytes, a size (4GB), a fraction of the "
                        "machine's memory (0.5), none, or auto: the job's share per rank "
                        "(default)")
    p.add_argument("--log-level", default=os.environ.get("HPCSCHED_LOG_LEVEL", "warning"))
    p.add_argument("--journal", default=None,
                   help="the job's journal: results of tasks annotated checkpoint=True are "
                        "kept in JOURNAL.checkpoints/, and a job run again with the same "
                        "journal reads them instead of running those tasks (needs a file "
                        "system every rank shares)")
    p.add_argument("--requeue", action="store_true", default=None,
                   help="stopped before its job's walltime, queue the job's continuation "
                        "(scontrol requeue if SLURM may requeue it, else sbatch of the same "
                        "batch script), which resumes from --journal (default: the setting "
                        "mpi.requeue)")
    p.add_argument("--preload", action="append", default=None, metavar="MODULE",
                   help="a module to import, or a .py file to run, on each worker rank as it "
                        "starts (its dask_setup(worker) called); may be given several times")
    p.add_argument("--worker-per-gpu", action="store_true",
                   help="each worker rank takes one GPU of its node (the one of index its "
                        "local rank modulo their number) and sees it alone")
    serve = p.add_argument_group(
        "serving clients (no SCRIPT)",
        "rank 0 writes F (address and secret, mode 0600) once every worker rank has joined, "
        "and removes it when the job ends")
    serve.add_argument("--scheduler-file", default=None, metavar="F",
                       help="serve clients that read F instead of running a script")
    serve.add_argument("--scheduler-port", type=int, default=0,
                       help="TCP port of the scheduler (default: any free port; F names it)")
    serve.add_argument("--interface", default=None,
                       help="listen on, and name, this network interface's address (e.g. "
                            "ib0; default: every interface, naming the one the default "
                            "route leaves by)")
    p.add_argument("--walltime-margin", type=duration(zero=True), default=WALLTIME_MARGIN,
                   metavar="SECONDS",
                   help="end this long before the batch job does (SLURM_JOB_END_TIME, "
                        "PBS_WALLTIME), so that every rank leaves in time: a script stops "
                        f"with exit status {EXIT_NOT_FINISHED} (default {WALLTIME_MARGIN:g}; "
                        "a duration: 90s, 2m, ...)")
    p.add_argument("script", nargs="?", default=None,
                   help="the Python script to run on rank 0")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    ns = p.parse_args(argv)
    if ns.nthreads is not None and ns.nthreads < 1:
        p.error(f"--nthreads must be >= 1, got {ns.nthreads}")
    ns.memory_limit = _memory(ns.memory_limit, p)
    if ns.script is None:
        if ns.scheduler_file is None:
            p.error("give a SCRIPT to run, or --scheduler-file F to serve clients")
    elif ns.scheduler_file is not None:
        p.error("--scheduler-file serves clients instead of running a script: give one or "
                "the other")
    elif not os.path.isfile(ns.script):
        p.error(f"no such script: {ns.script}")
    return ns


def _memory(text: str, p: argparse.ArgumentParser) -> MemoryLimit:
    from hpcsched.core.units import parse_memory_limit

    try:
        return parse_memory_limit(text)
    except ValueError as e:
        p.error(f"--memory-limit: {e}")
        raise  # unreachable: p.error exits


def main(argv: list[str], collector_paused: bool = False) -> int:
    """``python -m hpcsched [options] (script.py [args...] | --scheduler-file F)``.

    ``collector_paused``: the caller paused the garbage collector for this rank's start
    (:meth:`~hpcsched.hpc.bootstrap.MPIMode.pause_collector`), as ``python -m hpcsched``
    does before importing this module.
    """
    MODE.collector_paused = collector_paused
    ns = _parse(argv)
    logging.basicConfig(level=getattr(logging, ns.log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    if ns.script is not None:
        script = os.path.abspath(ns.script)
        # as `python script.py` does, and on the workers too: modules next to the script
        # import
        sys.path[0] = os.path.dirname(script)
    if ns.journal is None:
        return _run(ns)
    # rank 0's scheduler (or a world of one's LocalCluster) keeps the checkpoints
    from hpcsched.core.scheduler.checkpoints import next_to_journal

    with config.set({"scheduler.checkpoint-directory":
                     next_to_journal(os.path.abspath(os.path.expanduser(ns.journal)))}):
        return _run(ns)


def _run(ns: argparse.Namespace) -> int:
    """Set MPI mode up; rank 0 runs the script or serves clients, the others are workers."""
    security = None
    if ns.script is not None:
        ignore_drain_signal()  # until rank 0 watches for it: the others never act on it
    if ns.script is None:
        from hpcsched.core.comm.base import Security

        security = Security.from_environment() or Security.generate()
    try:
        job = MODE.setup(InitOptions(nthreads=ns.nthreads, memory_limit=ns.memory_limit,
                                     dashboard_address=config.read(DashboardSettings).address),
                         security)
    except RuntimeError as e:
        print(e, file=sys.stderr, flush=True)
        return 1
    if job.size == 1:
        if ns.script is None:
            print("hpcsched: serving clients needs an MPI job of at least 2 ranks (rank 0 "
                  "the scheduler, the others workers): start it with mpiexec -n N or srun",
                  file=sys.stderr, flush=True)
            return 1
        print(f"hpcsched: world size 1: running {ns.script} on a LocalCluster",
              file=sys.stderr, flush=True)
        world_of_one_fixed_size()
        kept = checkpoints_kept(_checkpoints(ns))
        stop_at = drain_time(ns.walltime_margin)
        code = _run_until_walltime(ns, stop_at)
        requeue = _continue(ns, kept, code, stop_at)
        if requeue:
            say(run_continuation(requeue))
        return code
    if job.rank != 0:
        exit_rank(serve_rank(job, InitOptions(nthreads=ns.nthreads,
                                              memory_limit=ns.memory_limit,
                                              worker_kwargs={"preload": ns.preload},
                                              worker_per_gpu=ns.worker_per_gpu)))
    code = EXIT_INTERRUPTED
    kept = checkpoints_kept(_checkpoints(ns))
    stop_at = drain_time(ns.walltime_margin) if ns.script is not None else None
    try:
        code = _run_until_walltime(ns, stop_at) if ns.script is not None else \
            serve_clients(ns.scheduler_file, ns.scheduler_port, ns.interface,
                          end_time(ns.walltime_margin))
    finally:
        try:
            requeue = _continue(ns, kept, code, stop_at)
        except Exception as e:  # noqa: BLE001 - never in the way of the cluster's close
            requeue = None
            say(f"no continuation: {type(e).__name__}: {e}")
        exit_timeout = float(config.read(MPISettings).exit_timeout)
        if code == EXIT_NOT_FINISHED and stop_at is not None:
            # stopped for the walltime: the ranks may take what is left of the margin to
            # leave (a loaded node is slow), rather than end in MPI_Abort
            exit_timeout = max(exit_timeout, stop_at + ns.walltime_margin - time.time() - 2)
        with config.set({"mpi.exit-timeout": exit_timeout}):
            MODE.close_cluster(code)
    if requeue:
        say(run_continuation(requeue))
    return code


# ------------------------------------------------------------------ the walltime
def _checkpoints(ns: argparse.Namespace) -> str | None:
    from hpcsched.core.scheduler.checkpoints import next_to_journal

    return None if ns.journal is None else \
        next_to_journal(os.path.abspath(os.path.expanduser(ns.journal)))


def _run_until_walltime(ns: argparse.Namespace, stop_at: float | None) -> int:
    """Rank 0: the script, stopped at ``stop_at`` (``--walltime-margin`` before the
    job's end) or on SIGUSR1 (:mod:`hpcsched.hpc.walltime`)."""
    drain = Drain(stop_at)
    drain.arm()
    try:
        return run_script(ns.script, ns.args)
    finally:
        drain.disarm()


def _continue(ns: argparse.Namespace, kept_before: int, code: int,
              stop_at: float | None) -> list[str] | None:
    """Rank 0, its script stopped at the walltime (``code``): the continuation, if asked
    for and if the run made progress. An ``sbatch`` is submitted now, to start once this
    job is over; a ``scontrol requeue`` (which ends this job) is returned, for after the
    ranks have left."""
    requeue = ns.requeue if ns.requeue is not None else config.read(MPISettings).requeue
    if code != EXIT_NOT_FINISHED or not requeue:
        return None
    kept = checkpoints_kept(_checkpoints(ns))
    if ns.journal is None:
        say("no continuation: --requeue resumes from --journal, and none was given")
        return None
    if kept <= kept_before:
        say(f"no continuation: this run kept no new checkpoint ({kept} in all), a "
            "continuation would not get further")
        return None
    end = None if stop_at is None else stop_at + ns.walltime_margin
    cmd, what = plan_continuation(0.0 if end is None else end - time.time())
    say(f"{kept - kept_before} more task results kept ({kept} in all); "
        f"{what if cmd is None or cmd[0] != 'sbatch' else run_continuation(cmd)}")
    return cmd if cmd is not None and cmd[0] != "sbatch" else None


# ------------------------------------------------------------------ serving clients
def end_time(margin: float, environ: dict | None = None) -> float | None:
    """When a serving job ends by itself (``time.time()``), ``margin`` seconds before its
    batch job does; None: no end is known.

    >>> end_time(30, {"SLURM_JOB_END_TIME": "1700000600"})
    1700000570.0
    >>> end_time(30, {}) is None
    True
    """
    text = (os.environ if environ is None else environ).get("SLURM_JOB_END_TIME", "")
    try:
        return float(text) - margin if text else None
    except ValueError:
        logger.warning("SLURM_JOB_END_TIME=%r is not a time: no walltime is watched", text)
        return None


def serve_clients(scheduler_file: str, port: int, interface: str | None,
                  end: float | None) -> int:
    """Rank 0: serve the clients that read ``scheduler_file`` until one asks for the
    cluster to end (``Client.shutdown``), or until ``end``; the job's exit status."""
    from hpcsched.core.comm.scheduler_file import write_scheduler_file
    from hpcsched.core.comm.tcp_comm import format_hostport

    sched = MODE.scheduler
    host = "0.0.0.0"  # every interface: the listener names the routable address
    if interface:
        from hpcsched.launchers.address import interface_address

        host = interface_address(interface)
    address = sched.add_listener(f"tcp://{format_hostport(host, port)}")
    path = os.path.abspath(os.path.expanduser(scheduler_file))
    write_scheduler_file(path, address, sched.security)
    print(f"hpcsched: serving clients at {address} with {len(sched.state.workers)} worker "
          f"ranks; scheduler file {path}", file=sys.stderr, flush=True)
    code, why = 0, "a client asked for shutdown"
    try:
        while not sched.control.shutdown_requested.wait(1.0):
            if end is not None and time.time() >= end:
                why = "the job's walltime is near (SLURM_JOB_END_TIME)"
                break
    except KeyboardInterrupt:
        code, why = EXIT_INTERRUPTED, "interrupted"
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    print(f"hpcsched: ending the job: {why}", file=sys.stderr, flush=True)
    return code
