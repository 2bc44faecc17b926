"""``python -m hpcsched script.py [args...]`` under a launcher: the command line of MPI mode.

Rank 0 runs the scheduler and the script as ``__main__``, the other ranks are
workers; the job's set-up, its end and its failure model are
:mod:`hpcsched.hpc.bootstrap`'s.
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import traceback

from hpcsched.core import config
from hpcsched.core.units import DEFAULT_MEMORY_LIMIT, MemoryLimit
from hpcsched.hpc.bootstrap import EXIT_INTERRUPTED, MODE, exit_rank, serve_rank
from hpcsched.hpc.initialize_options import InitOptions


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
        description="Run SCRIPT under mpiexec: rank 0 runs the scheduler and the script, "
                    "the other ranks are workers; Client() in the script connects to them.")
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
    p.add_argument("--preload", action="append", default=None, metavar="MODULE",
                   help="a module to import, or a .py file to run, on each worker rank as it "
                        "starts (its dask_setup(worker) called); may be given several times")
    p.add_argument("script", help="the Python script to run on rank 0")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    ns = p.parse_args(argv)
    if ns.nthreads is not None and ns.nthreads < 1:
        p.error(f"--nthreads must be >= 1, got {ns.nthreads}")
    ns.memory_limit = _memory(ns.memory_limit, p)
    if not os.path.isfile(ns.script):
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
    """``python -m hpcsched [--nthreads N] [--memory-limit M] script.py [args...]``.

    ``collector_paused``: the caller paused the garbage collector for this rank's start
    (:meth:`~hpcsched.hpc.bootstrap.MPIMode.pause_collector`), as ``python -m hpcsched``
    does before importing this module.
    """
    MODE.collector_paused = collector_paused
    ns = _parse(argv)
    logging.basicConfig(level=getattr(logging, ns.log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    script = os.path.abspath(ns.script)
    # as `python script.py` does, and on the workers too: modules next to the script import
    sys.path[0] = os.path.dirname(script)
    if ns.journal is None:
        return _run(ns)
    # rank 0's scheduler (or a world of one's LocalCluster) keeps the checkpoints
    from hpcsched.core.scheduler.checkpoints import next_to_journal

    with config.set({"scheduler.checkpoint-directory":
                     next_to_journal(os.path.abspath(os.path.expanduser(ns.journal)))}):
        return _run(ns)


def _run(ns: argparse.Namespace) -> int:
    """Set MPI mode up and run the script on rank 0 (serve on the others)."""
    try:
        job = MODE.setup(InitOptions(nthreads=ns.nthreads, memory_limit=ns.memory_limit,
                                     dashboard_address=config.get(
                                         "diagnostics.dashboard.address")))
    except RuntimeError as e:
        print(e, file=sys.stderr, flush=True)
        return 1
    if job.size == 1:
        print(f"hpcsched: world size 1: running {ns.script} on a LocalCluster",
              file=sys.stderr, flush=True)
        return run_script(ns.script, ns.args)
    if job.rank != 0:
        exit_rank(serve_rank(job, InitOptions(nthreads=ns.nthreads,
                                              memory_limit=ns.memory_limit,
                                              worker_kwargs={"preload": ns.preload})))
    code = EXIT_INTERRUPTED
    try:
        code = run_script(ns.script, ns.args)
    finally:
        MODE.close_cluster(code)
    return code
