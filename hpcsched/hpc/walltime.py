"""MPI mode at its walltime: stop before the batch system kills the job, and queue its
continuation.

A batch job at its walltime is killed (SIGTERM, then SIGKILL): in MPI mode every rank
dies at once and the work of the tasks then running is lost. ``python -m hpcsched
script.py`` instead ends on its own terms, ``--walltime-margin`` seconds before the job's
end (``SLURM_JOB_END_TIME``, else ``scontrol show job``'s ``EndTime``; ``PBS_WALLTIME``
from the job's start; read by the batch system's module,
:func:`hpcsched.launchers.resources.job_end`, as a batch worker reads it), or as soon as rank 0
receives ``SIGUSR1`` (SLURM's ``--signal=B:USR1@60`` sends it to the batch shell, which
passes it on to ``mpiexec``; with ``srun`` ranks, ``--signal=USR1@60``):

* rank 0 interrupts the script (:class:`WalltimeReached`, raised in its main thread
  wherever it waits); its client closes, so no task is started any more, and the
  cluster closes as after any end of the script;
* the tasks running end (within ``mpi.exit-timeout``) and the results of the tasks
  annotated ``checkpoint=True`` that finished are on disk
  (``JOURNAL.checkpoints/``, :mod:`hpcsched.core.scheduler.checkpoints`): a run with the
  same journal reads them instead of running those tasks again; a task cut off in the
  middle never wrote one and runs again;
* every rank exits with :data:`EXIT_NOT_FINISHED` (75, ``EX_TEMPFAIL`` of BSD's
  ``sysexits.h``: "a temporary failure ... the user is invited to retry"), after rank 0
  said why on stderr;
* with ``--requeue`` (or ``mpi.requeue: true``), rank 0 queues the job's continuation
  (:func:`continuation_command`): ``scontrol requeue`` of its own job when SLURM may
  requeue it, once the ranks have left (SLURM starts a requeued job no sooner than about
  two minutes later), else, before the ranks leave (an ``MPI_Abort`` at the end then
  loses nothing), ``sbatch`` of the same batch script with the same arguments, the job's
  limits and ``--begin`` at its end, so that the two never share the journal. The
  continuation is the same command: it resumes from the journal and the checkpoints. A
  run that kept no new checkpoint is not continued (it would loop).

Worker ranks ignore ``SIGUSR1``: rank 0 decides, and ends them.
"""

from __future__ import annotations

import _thread
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpcsched.hpc.bootstrap import EXIT_NOT_FINISHED

# Every rank ignores the drain signal as it starts, so this module is on every rank's way
# to its first task. CPython's ``signal`` module is ``_signal`` (imported by the
# interpreter at start-up) plus the enums it builds as it is imported
# (https://github.com/python/cpython/blob/3.11/Lib/signal.py): the calls here need
# only ``_signal``'s functions and numbers. Elsewhere, the ``signal`` module.
if TYPE_CHECKING:  # _signal has no stubs; it has signal's functions and numbers
    import signal
else:
    try:
        import _signal as signal
    except ImportError:  # pragma: no cover - an interpreter without CPython's _signal
        import signal

logger = logging.getLogger("hpcsched.bootstrap")

__all__ = ["EXIT_NOT_FINISHED", "Drain", "WalltimeReached", "continuation_command",
           "drain_time", "plan_continuation", "run_continuation"]

#: the signal that asks a job to stop now, as at its walltime
DRAIN_SIGNAL = signal.SIGUSR1


class WalltimeReached(BaseException):
    """Raised in rank 0's script when its job's walltime is near (a ``BaseException``, as
    ``KeyboardInterrupt``: an ``except Exception`` in the script does not swallow it)."""


def drain_time(margin: float, env: Mapping[str, str] | None = None) -> float | None:
    """When to stop (epoch seconds): ``margin`` seconds before the job's walltime ends;
    None when no end is known.

    >>> drain_time(30, {"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": "1700000600"})
    1700000570.0
    >>> drain_time(30, {}) is None
    True
    """
    from hpcsched.launchers.resources import batch_job, job_end

    end = job_end(batch_job(os.environ if env is None else env))
    return None if end is None else end - margin


class Drain:
    """Rank 0's watch of its job's end: at ``at`` (epoch seconds), or on ``SIGUSR1``,
    :class:`WalltimeReached` is raised in the main thread, once."""

    def __init__(self, at: float | None) -> None:
        self.at = at
        self.why = ""
        self._stop = threading.Event()
        self._previous: Any = None

    def arm(self) -> None:
        """Install the signal handler and start the timer (from the main thread)."""
        self._previous = signal.signal(DRAIN_SIGNAL, self._handler)
        if self.at is not None:
            threading.Thread(target=self._timer, name="hpcsched-walltime", daemon=True).start()

    def disarm(self) -> None:
        self._stop.set()
        if self._previous is not None:
            signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)  # a late one must not kill the rank

    def _timer(self) -> None:
        assert self.at is not None
        if not self._stop.wait(max(0.0, self.at - time.time())):
            self.why = self.why or "the job's walltime is near"
            _thread.interrupt_main(DRAIN_SIGNAL)

    def _handler(self, signum: int, frame: Any) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        import signal as named  # the enums, for the name; only when the notice comes

        self.why = self.why or f"signal {named.Signals(signum).name} (the batch system's " \
                               "notice of the job's end)"
        raise WalltimeReached(self.why)


def ignore_drain_signal() -> None:
    """Worker ranks: the notice is rank 0's to act on (SIGUSR1 would kill a rank)."""
    signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)


# ------------------------------------------------------------------ the continuation
def continuation_command(job_id: str, fields: Mapping[str, str],
                         batch_args: Sequence[str] | None) -> list[str] | None:
    """The command that queues the continuation of SLURM job ``job_id`` (``fields``: what
    ``scontrol -o show job`` says of it; ``batch_args``: the arguments its batch script was
    given, None if unknown); None when there is no way.

    >>> continuation_command("7", {"Requeue": "1"}, None)
    ['scontrol', 'requeue', '7']
    >>> continuation_command("7", {"Requeue": "0", "Command": "/h/job.sh", "TimeLimit":
    ...     "00:01:00", "NumNodes": "1", "NumTasks": "3", "Partition": "debug", "JobName":
    ...     "run", "WorkDir": "/h", "StdOut": "/h/run.out"}, ["a b"])  # doctest: +NORMALIZE_WHITESPACE
    ['sbatch', '--time=00:01:00', '--nodes=1', '--ntasks=3', '--partition=debug',
     '--job-name=run', '--chdir=/h', '--output=/h/run.out', '--open-mode=append',
     '--no-requeue', '/h/job.sh', 'a b']
    """
    if fields.get("Requeue") == "1":
        return ["scontrol", "requeue", job_id]
    script = fields.get("Command", "")
    if not script or script == "(null)" or batch_args is None:
        return None
    options = {"time": "TimeLimit", "nodes": "NumNodes", "ntasks": "NumTasks",
               "partition": "Partition", "job-name": "JobName", "chdir": "WorkDir",
               "output": "StdOut", "error": "StdErr", "account": "Account", "qos": "QOS"}
    cmd = ["sbatch"]
    for option, name in options.items():
        value = fields.get(name, "")
        if value and value not in ("(null)", "N/A", "UNLIMITED") and not (
                option == "error" and value == fields.get("StdOut")):
            cmd.append(f"--{option}={value}")
    # as this job: SLURM may not requeue it, so its continuation goes on by sbatch too
    return [*cmd, "--open-mode=append", "--no-requeue", script, *batch_args]


def _slurm_job(job_id: str) -> dict[str, str]:
    import subprocess  # here, not at the top: every rank imports this module at its start

    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def _batch_args(job_id: str) -> list[str] | None:
    """The arguments of the batch shell of SLURM job ``job_id`` on this node (``slurmd``
    runs a copy of the script, ``.../job<id>/slurm_script``, with them); None when it is
    not here. It is no ancestor of the ranks: ``mpiexec`` starts them through ``srun``."""
    import re

    import psutil

    spool = re.compile(rf"/job0*{re.escape(job_id)}/slurm_script$")
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        for i, arg in enumerate(cmdline[:2]):
            if spool.search(arg):
                return list(cmdline[i + 1:])
    return None


def plan_continuation(begin_in: float,
                      env: Mapping[str, str] | None = None) -> tuple[list[str] | None, str]:
    """The command that queues this job's continuation, and what it does or why there is
    none, in a line. An ``sbatch`` asks for a start ``begin_in`` seconds from now at the
    earliest (when this job is over: the two never share the journal).
    """
    import shlex
    import subprocess

    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        return None, "no continuation: --requeue needs a SLURM job (no SLURM_JOB_ID)"
    try:
        fields = _slurm_job(job_id)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"no continuation: {e}"
    script = fields.get("Command", "")
    args = _batch_args(job_id) if os.path.isfile(script) else None
    cmd = continuation_command(job_id, fields, args)
    if cmd is None:
        return None, (f"no continuation: job {job_id} is not requeueable and its batch "
                      "script or its arguments are unknown (sbatch --requeue makes it "
                      "requeueable)")
    if cmd[0] == "sbatch":
        cmd.insert(1, f"--begin=now+{max(0, math.ceil(begin_in))}")
    return cmd, shlex.join(cmd)


def run_continuation(cmd: list[str]) -> str:
    """Run a command of :func:`plan_continuation`; what happened, in a line."""
    import shlex
    import subprocess

    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"no continuation: {e}"
    if out.returncode != 0:
        return f"no continuation: {shlex.join(cmd)} failed: {out.stderr.strip()[-500:]}"
    return f"continuation queued: {shlex.join(cmd)} {out.stdout.strip()}".rstrip()


def checkpoints_kept(directory: str | None) -> int:
    """Whole checkpoint files in ``directory`` (a run that adds none made no progress)."""
    try:
        return sum(name.endswith(".pkl") for name in os.listdir(directory or ""))
    except OSError:
        return 0


def say(line: str) -> None:
    print(f"hpcsched: {line}", file=sys.stderr, flush=True)
