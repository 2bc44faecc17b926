"""In-allocation launchers: how ``processes`` workers start inside one batch job.

A launcher is a pure string transform (Parsl's idea): the worker command in, the
shell line the job script runs out. It knows nothing of batch systems::

    >>> launch_command(["python", "-m", "hpcsched", "worker", "tcp://10.0.0.1:8786"], 4, "srun")
    'srun -n 4 --cpu-bind=none python -m hpcsched worker tcp://10.0.0.1:8786'

* ``fork``: one ``hpcsched worker --nworkers P`` that forks P worker processes
  (works everywhere, one node);
* ``srun``: SLURM starts P tasks, each one worker (may span nodes; the job must
  ask for ``-n P`` tasks);
* ``mpiexec``: the MPI launcher starts P workers.

Arguments are quoted with :func:`shlex.quote`, except :class:`Expand` arguments,
which the shell must expand (a job-array index in a worker name) and are
double-quoted with only ``$`` active.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

LAUNCHERS = ("fork", "srun", "mpiexec")


class Expand(str):
    """A command argument holding shell variables (``"w-${SLURM_ARRAY_TASK_ID}"``).

    Only ``$NAME`` / ``${NAME}`` references are allowed, so that expansion cannot run
    commands (no backticks, no ``$(...)``).
    """

    _ok = re.compile(r"^(?:[^$`\\\"]|\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\})*$")

    def __new__(cls, value: str) -> Expand:
        if not cls._ok.match(value):
            raise ValueError(f"Expand({value!r}): only $VAR / ${{VAR}} references are allowed")
        return super().__new__(cls, value)


def quote_arg(arg: str) -> str:
    if isinstance(arg, Expand):
        return f'"{arg}"'
    return shlex.quote(str(arg))


def join_command(cmd: Sequence[str]) -> str:
    return " ".join(quote_arg(a) for a in cmd)


def launch_command(worker_cmd: Sequence[str], processes: int, launcher: str = "fork") -> str:
    """The shell line that starts ``processes`` workers running ``worker_cmd``.

    ``worker_cmd`` is one worker's command (``python -m hpcsched worker ADDRESS ...``).
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a positive integer, got {processes!r}")
    if isinstance(worker_cmd, str) or not worker_cmd:
        raise TypeError("worker_cmd must be a non-empty list of arguments, not a string")
    cmd = list(worker_cmd)
    if launcher == "fork":
        return join_command([*cmd, "--nworkers", str(processes)])
    if launcher == "srun":
        return join_command(["srun", "-n", str(processes), "--cpu-bind=none", *cmd])
    if launcher == "mpiexec":
        return join_command(["mpiexec", "-n", str(processes), *cmd])
    raise ValueError(f"launcher={launcher!r} is not one of {', '.join(LAUNCHERS)}")
