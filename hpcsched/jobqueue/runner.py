"""The one function that runs batch-system commands (sbatch, qstat, bkill, ...).

Every shell call of :mod:`hpcsched.jobqueue` goes through :func:`run_command`, so
that

* every call has a timeout, and a command that hangs (an overloaded ``slurmctld``,
  a dead NFS mount under ``qstat``) has its whole process group killed instead of
  blocking the client;
* a failure raises :class:`BatchCommandError` whose message names the command, its
  exit status and the tail of its stderr -- the part users paste into tickets;
* a command missing from ``PATH`` says which batch system is missing;
* tests can replace it: batch systems call ``self.run_command`` (see
  :class:`hpcsched.jobqueue.base.BatchSystem`), which defaults to this function.

Example::

    >>> run_command(["echo", "42"], timeout=5)
    '42\\n'
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence

#: which batch system a command belongs to, for the "not found" message
_SYSTEM_OF = {
    **dict.fromkeys(["sbatch", "squeue", "scancel", "sacct", "scontrol", "srun", "sinfo"], "SLURM"),
    **dict.fromkeys(["qsub", "qstat", "qdel", "qacct"], "the batch system (SGE/PBS)"),
    **dict.fromkeys(["bsub", "bjobs", "bkill"], "LSF"),
}

STDERR_TAIL_LINES = 20


class BatchCommandError(RuntimeError):
    """A batch-system command failed (non-zero exit status)."""

    def __init__(self, message: str, cmd: Sequence[str] = (), returncode: int | None = None,
                 stdout: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


class BatchCommandTimeout(BatchCommandError, TimeoutError):
    """A batch-system command did not finish in time; its process group was killed."""


class BatchCommandNotFound(BatchCommandError, FileNotFoundError):
    """The executable of a batch-system command is not on PATH."""


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    """The last ``lines`` non-empty-trailing lines of ``text``."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def command_not_found(executable: str) -> BatchCommandNotFound:
    system = _SYSTEM_OF.get(os.path.basename(executable), "the batch system")
    return BatchCommandNotFound(
        f"{executable} not found on PATH: is {system} installed / module loaded?",
        cmd=[executable],
    )


def require_executable(executable: str) -> str:
    """Full path of ``executable``; :class:`BatchCommandNotFound` if it is not on PATH."""
    path = shutil.which(executable)
    if path is None:
        raise command_not_found(executable)
    return path


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_command(cmd: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
                input: str | None = None) -> str:  # noqa: A002 - subprocess's own name
    """Run ``cmd`` (no shell), return its stdout; raise on failure or timeout.

    ``env`` entries are added to the current environment. ``input`` is written to
    stdin (``bsub < script``). The command runs in its own session so that on
    timeout the whole process group (a wrapper script and its children) is killed.
    """
    cmd = [str(c) for c in cmd]
    if not cmd:
        raise ValueError("run_command: empty command")
    if timeout is None or timeout <= 0:
        raise ValueError(f"run_command: timeout must be a positive number of seconds, got {timeout!r}")
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update({str(k): str(v) for k, v in env.items()})
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            text=True,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise command_not_found(cmd[0]) from None
    except PermissionError as e:
        raise BatchCommandError(f"cannot execute {cmd[0]}: {e}", cmd=cmd) from e
    shown = shlex.join(cmd)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # unkillable (D state): do not wait for it
            out, err = "", ""
        raise BatchCommandTimeout(
            f"{shown} did not finish within {timeout:g} s (killed)"
            + (f"; stderr:\n{tail(err)}" if err and err.strip() else ""),
            cmd=cmd, returncode=proc.returncode, stdout=out or "", stderr=err or "",
        ) from None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    if proc.returncode != 0:
        detail = tail(err) if err.strip() else (tail(out) if out.strip() else "(no output)")
        raise BatchCommandError(
            f"{shown} failed with exit status {proc.returncode}:\n{detail}",
            cmd=cmd, returncode=proc.returncode, stdout=out, stderr=err,
        )
    return out
