"""Result checkpoints, the worker's side: keep a task's result in a file, or read the
result a run before kept.

A scheduler that keeps checkpoints (:mod:`hpcsched.core.scheduler.checkpoints`) gives
each task annotated ``checkpoint=True`` a run spec with a ``Checkpoint`` (``path``,
``key``, ``load``): :func:`~hpcsched.core.worker.execution.run_spec_call` runs the task and
:func:`save` its result at ``path``, or, with ``load``, returns what :func:`load` reads
there instead of running anything. The tasks run on workers, so the directory must be
one the workers can write and the scheduler can read: a shared file system for workers
on other nodes.

A result is written to a temporary name next to its file and renamed into place
(``os.replace``): the file of a key holds that key's whole result or is absent, whatever
killed the job in the middle of a write. The file holds the key beside the result, and
:func:`load` checks it: a file read under another key's name is an error, not a wrong
result.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from hpcsched.core.protocol.serialize import dumps_object, loads_object


class CheckpointError(RuntimeError):
    """A checkpoint file that does not hold the result of the key it was read for."""


def save(path: str, key: Any, value: Any) -> None:
    """Write ``(key, value)`` to ``path`` atomically (a temporary file renamed into place)."""
    blob = dumps_object((key, value))
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def load(path: str, key: Any) -> Any:
    """The result of ``key`` that a run before kept at ``path``."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"the checkpoint of {key!r} ({path}) was removed after the "
                              "graph was submitted: submit it again to compute it") from None
    stored, value = loads_object(blob)
    if stored != key:
        raise CheckpointError(f"{path} holds the result of {stored!r}, not of {key!r}")
    return value
