"""In-allocation launchers: how ``processes`` workers start inside one batch job.

A launcher is a pure string transform (Parsl's idea): the worker command in, the
shell line the job script runs out. It knows nothing of batch systems::

    >>> launch_command(["python", "-m", "hpcsched", "worker", "tcp://10.0.0.1:8786"], 4, "srun")
    'srun -n 4 --cpu-bind=none python -m hpcsched worker tcp://10.0.0.1:8786'

* ``fork``: one ``hpcsched worker --nworkers P`` that forks P worker processes
  (works everywhere, one node);
* ``srun``: SLURM starts P tasks, each one worker (may span nodes; the job must
  ask for ``-n P`` tasks);
* ``mpiexec``: the MPI launcher starts P workers;
* ``flux``: ``flux run`` starts P tasks, each one worker, in a Flux job's own instance
  (may span its nodes).

Quoting. Users write settings such as ``local_directory="$TMPDIR"`` or
``python="$HOME/venv/bin/python"`` expecting the job's shell to expand them, as it
does in dask-jobqueue's unquoted scripts. :func:`shell_word` renders a value so that
``$NAME`` and ``${NAME}`` (and a leading ``~/``) expand inside the job and nothing
else is interpreted: the value sits in double quotes (no word splitting, no
globbing of a path with spaces or ``*``), and backquotes, backslashes, double quotes
and every other ``$`` (``$(...)``, ``$1``, ``${X:-y}``) are escaped -- so a value
can never run a command. Paths that hpcsched itself computed go through
:func:`shell_literal` (no expansion at all).

    >>> shell_word("$TMPDIR")
    '"$TMPDIR"'
    >>> shell_word("~/my venv/bin/python")
    '~/"my venv/bin/python"'
    >>> shell_word("/scratch/my data/$(id)")
    '"/scratch/my data/\\\\$(id)"'
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

LAUNCHERS = ("fork", "srun", "mpiexec", "flux")

_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_VARIABLE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")


def _escape_in_double_quotes(text: str) -> str:
    return re.sub(r'([\\"`$])', r"\\\1", text)


def shell_word(value: object) -> str:
    """``value`` as one shell word in which only ``$VAR`` / ``${VAR}`` (and a leading
    ``~/``) expand (see the module docstring)."""
    text = str(value)
    prefix = ""
    if text == "~" or text.startswith("~/"):
        # the tilde prefix ends at the first unquoted slash: keep "~/" outside the quotes
        prefix, text = text[:2], text[2:]
        if not text:
            return prefix
    if _SAFE.match(text):
        return prefix + text
    out: list[str] = []
    pos = 0
    for m in _VARIABLE.finditer(text):
        out.append(_escape_in_double_quotes(text[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_escape_in_double_quotes(text[pos:]))
    return f'{prefix}"{"".join(out)}"'


def shell_literal(value: object) -> str:
    """``value`` as one shell word, taken literally (nothing expands)."""
    return shlex.quote(str(value))


def join_command(cmd: Sequence[object]) -> str:
    return " ".join(shell_word(a) for a in cmd)


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
    if launcher == "flux":
        return join_command(["flux", "run", "-n", str(processes), *cmd])
    raise ValueError(f"launcher={launcher!r} is not one of {', '.join(LAUNCHERS)}")
