"""What the HTCondor, OAR, Moab and Flux emulators share: one job started from a command.

Each of those systems' commands is a small function in its module (``htcondor_cli``,
``oar_cli``, ``moab_cli``, ``flux_cli``) over :mod:`emucore`'s store and runner: a job is
one record that really runs (its supervisor starts the command, enforces the walltime,
honours cancels). This module holds the submission of such a job and the command-line
wrapper; each system decides the environment and the output formats from its
documentation (see its module's docstring).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import emucore
from emucore import EmulatorError

KILL = {"delete": ["SIGTERM", "SIGKILL"], "walltime": ["SIGTERM", "SIGKILL"]}


def login_env(**extra: str) -> dict[str, str]:
    """A job's environment on a node that did not inherit the submitter's: a login's
    (HOME, USER, PATH, LANG), the emulator's own knobs and the system's variables."""
    keep = (
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LC_ALL",
        emucore.STATE_ENV,
        emucore.GRACE_ENV,
        emucore.TIME_SCALE_ENV,
    )
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env.update(extra)
    return env


def submit(
    system: str,
    store: emucore.Store,
    argv: list[str] | Callable[[int, int | None], list[str]],
    *,
    env: dict[str, str],
    log: Callable[[int, int | None], tuple[str, str | None]],
    cwd: str,
    walltime: float | None,
    count: int = 1,
    fields: Callable[[int, int | None], dict] | None = None,
    job_env: Callable[[int, int | None], dict[str, str]] | None = None,
) -> int:
    """Store ``count`` jobs (one, or the elements 0..count-1 of one submission) that run
    ``argv`` with stdout and stderr to the files ``log(seq, index)`` names (stderr None:
    joined to stdout); start their supervisors; return the submission's number. ``argv`` may depend on them too; ``fields(seq, index)`` adds the system's own fields to a record,
    ``job_env(seq, index)`` its own variables."""
    with store.locked():
        seq = store.next_seq()
        max_running = emucore.submit_env_settings(store)
        keys = []
        for index in [None] if count == 1 else range(count):
            out, err = log(seq, index)
            run = {
                "argv": argv(seq, index) if callable(argv) else argv,
                "cwd": cwd,
                "env": {**env, **(job_env(seq, index) if job_env else {})},
                "stdout": out,
                "stderr": err,
                "stdout_mode": "a",
                "stderr_mode": "a",
                "stderr_file": err or out,
                "walltime": walltime,
                "kill_signals": KILL,
            }
            rec = emucore.new_record(
                system,
                seq,
                index,
                run=run,
                max_running=max_running,
                **(fields(seq, index) if fields else {}),
            )
            store.save(rec)
            keys.append(rec["key"])
    for key in keys:
        emucore.spawn_supervisor(store, key)
    return seq


def cli(command: Callable[[list[str]], str]) -> None:
    """Run ``command`` on this process's arguments as the real command does: its output
    on stdout, an error's message on stderr and its exit status."""
    try:
        out = command(sys.argv[1:])
    except EmulatorError as exc:
        if exc.message:
            print(exc.message, file=sys.stderr)
        sys.exit(exc.code)
    if out:
        print(out)
