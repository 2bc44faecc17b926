"""A task that counts its runs in files, so a test can tell which tasks ran and how often
(a restarted scheduler, a checkpoint, an adopted job must not run one again)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def counted(i: int, directory: str) -> int:
    """``i * 2``, after a short piece of work; appends one byte to ``directory/i`` per run."""
    t = time.perf_counter() + 0.004
    while time.perf_counter() < t:
        pass
    fd = os.open(os.path.join(directory, str(i)), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
    return i * 2


def runs(directory: Path) -> dict[int, int]:
    """``{i: how many times counted(i, directory) ran}``."""
    return {int(p.name): p.stat().st_size for p in directory.iterdir()}
