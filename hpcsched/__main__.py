"""The ``hpcsched`` command and ``python -m hpcsched``: the one entry point above the layers.

``hpcsched scheduler`` / ``hpcsched worker`` start servers
(:mod:`hpcsched.launchers.cli`); ``hpcsched submit`` / ``hpcsched job`` submit and
follow jobs of command tasks (:mod:`hpcsched.commands.cli`); anything else is a script
to run in MPI mode under mpiexec (:mod:`hpcsched.hpc.command`): ``python -m hpcsched
script.py``, or ``python -m hpcsched --scheduler-file F`` to serve clients.
It lives here, not in a layer, so that the launchers never import the MPI mode.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("submit", "job", "history"):
        from hpcsched.commands import cli as commands_cli

        command = {"submit": commands_cli.submit_main, "job": commands_cli.job_main,
                   "history": commands_cli.history_main}[argv[0]]
        try:
            return command(argv[1:])
        except BrokenPipeError:
            # a reader that stopped early (`hpcsched history h.sqlite | head`): no traceback,
            # and no second error when the interpreter flushes stdout at exit, as Python's
            # note on SIGPIPE advises (docs.python.org/3/library/signal.html#note-on-sigpipe)
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    if argv and argv[0] not in ("-h", "--help", "--version", "-V", "worker", "scheduler"):
        # a script under mpiexec: every rank starts here, so it imports the MPI mode only,
        # with the garbage collector paused until the rank has started (MPIMode.started)
        import gc

        paused = gc.isenabled()
        gc.disable()
        from hpcsched.hpc.command import main as run_script

        return run_script(argv, collector_paused=paused)
    from hpcsched.launchers.cli import USAGE, scheduler_main, version_text, worker_main

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        print(version_text())
        return 0
    if argv[0] == "worker":
        return worker_main(argv[1:])
    return scheduler_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
