"""The commands a worker started end with the worker, however it ends.

Each command runs in a process group of its own (so that cancelling it reaches every
process it started). A worker that exits cleanly kills its groups; one killed by
SIGKILL or the out-of-memory killer cannot. For that case each worker process that runs
commands starts one *sentinel* (``python -m hpcsched.commands.sentinel``, once, at its
first command): the worker holds the write end of a pipe to it and writes ``+PGID`` when
a command's group starts and ``-PGID`` when it ends. When the worker dies, however it
dies, the kernel closes the pipe; the sentinel reads end-of-file and sends SIGKILL to
every group still listed, then exits. Per command this costs two short writes (which
wake the sentinel at most once every :data:`NAP` seconds: :func:`watch`), where
``prctl(PR_SET_PDEATHSIG)`` would need a ``preexec_fn`` and so a full ``fork()`` of the
worker (several times slower than the ``vfork()`` CPython uses otherwise).

A command whose worker dies between its start and the write of its group id is not
seen by the sentinel: a window of microseconds, which :func:`Sentinel.started` keeps
as short as it can by writing right after ``Popen`` returns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

#: seconds the sentinel sleeps between reads (:func:`watch`)
NAP = 0.1


class Sentinel:
    """The worker's side: starts the sentinel on first use, tells it of each group."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._proc: subprocess.Popen | None = None
        self._pid = 0

    def _ensure(self) -> int | None:
        if self._fd is not None and self._pid == os.getpid():
            return self._fd
        read, write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "hpcsched.commands.sentinel"], stdin=read,
                stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except OSError:
            os.close(read)
            os.close(write)
            return None
        os.close(read)
        os.set_inheritable(write, False)
        self._fd, self._pid = write, os.getpid()
        return write

    def _say(self, line: str) -> None:
        with self._lock:
            fd = self._ensure()
            if fd is not None:
                try:
                    os.write(fd, line.encode())
                except OSError:
                    self._fd = None

    def started(self, pgid: int) -> None:
        self._say(f"+{pgid}\n")

    def ended(self, pgid: int) -> None:
        self._say(f"-{pgid}\n")


SENTINEL = Sentinel()


def apply(data: bytes, live: set[int]) -> bytes:
    """The complete ``+PGID`` / ``-PGID`` lines of ``data`` applied to ``live``; the
    incomplete last line, to be completed by the next read.

    >>> live = set()
    >>> apply(b"+12\\n+13\\n-12\\n+1", live), live
    (b'+1', {13})
    """
    *lines, rest = data.split(b"\n")
    for line in lines:
        sign, digits = line[:1], line[1:].strip()
        if digits.isdigit():
            if sign == b"+":
                live.add(int(digits))
            elif sign == b"-":
                live.discard(int(digits))
    return rest


def watch(fd: int, nap: float = NAP) -> set[int]:
    """Read ``+PGID`` / ``-PGID`` lines from ``fd`` until end-of-file; the groups still
    listed. After each read it sleeps ``nap`` seconds: what the worker writes meanwhile
    waits in the pipe and wakes no one, so the sentinel wakes at most once a nap rather
    than twice a command, and a dead worker's groups are killed at most ``nap`` seconds
    late."""
    live: set[int] = set()
    rest = b""
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            return live
        rest = apply(rest + data, live)
        time.sleep(nap)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the job is the worker's
    for pgid in watch(sys.stdin.fileno()):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    main()
