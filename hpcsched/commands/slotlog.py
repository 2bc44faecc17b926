"""A worker slot's output files: an array job's logs, one pair per slot, and the capture
files of the other commands whose output is not given a path.

A file per command and stream costs an inode allocation each, and on ext4 that is the
largest part of a short command's cost: after many files were deleted the allocator
reads inode after inode to skip the recently freed ones (``recently_deleted()`` in the
kernel's ``fs/ext4/ialloc.c``), more so the more were freed. An array job of many short
commands therefore writes no file per task. A *slot* (a thread of a worker: it runs one
command at a time) appends its commands' stdout and stderr to two logs of its own in the
job's directory, opened once, ``<host>-<pid>-<thread>.out`` / ``.err``, and appends a line
to its index, ``<host>-<pid>-<thread>.index``, when a command starts (its ranges open:
length ``-1``, to the end of the log, so that a running task's output can be read) and
when it ends::

    <task id> TAB <time> TAB <out log> TAB <offset> TAB <length> TAB <err log> TAB <offset> TAB <length>

:class:`JobLogs` reads a directory's indexes back for ``hpcsched job cat``: a task's bytes
are its ranges of the logs, as its last line says (the last of its index; among indexes,
the latest: a retry's).

Processes a command left behind may write to its logs after it ended. The command's
process group still having a member when the command has been reaped says so (one
``kill(-pgid, 0)``), and the slot then leaves those logs to them: the task's ranges run to
the end of the file (length ``-1``) and the next command starts new logs
(``<host>-<pid>-<thread>.<n>.out``). A process that left the group (``setsid``) is seen
later: a log that grew between the end of one command and the start of the next. The
grown stream's range of the task before is then re-recorded to the end of the file, and
the slot moves on to new logs as well. What such a process writes while the next command
runs cannot be told apart from that command's output.

A command whose output is captured into its result (``Client.submit_command`` without
output paths) uses the same idea without a directory: :meth:`SlotLogs.scratch` gives the
slot two anonymous files (``O_TMPFILE``), appended to and read back by offset, emptied
when they grow past :data:`SCRATCH_LIMIT`, and replaced, never shared, when a command left
a process behind.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

STREAMS = ("stdout", "stderr")
#: a slot keeps the logs of this many job directories open (the most recent ones)
OPEN_DIRECTORIES = 4
#: a slot's capture file is emptied before a command once it holds this many bytes
SCRATCH_LIMIT = 64 << 20


@dataclass(frozen=True)
class Extent:
    """Where a stream of one task lies: a log's name (in the job's directory), the offset
    and the length (-1: to the end of the log)."""

    log: str
    offset: int
    length: int


@dataclass(frozen=True)
class Record:
    """One line of an index: a task's two extents, stdout's and stderr's, written ``at``
    its command's start (open extents) or end."""

    task_id: str
    at: float
    out: Extent
    err: Extent

    def line(self) -> bytes:
        cells = (self.task_id, repr(self.at), self.out.log, self.out.offset,
                 self.out.length, self.err.log, self.err.offset, self.err.length)
        return ("\t".join(map(str, cells)) + "\n").encode()

    @classmethod
    def parse(cls, line: bytes) -> Record | None:
        """The record of an index line; None for a line that is not one (the torn last
        line of a worker that died while writing it).

        >>> Record.parse(b"17\\t5.0\\ta.out\\t0\\t3\\ta.err\\t0\\t-1\\n")
        Record(task_id='17', at=5.0, out=Extent(log='a.out', offset=0, length=3), err=Extent(log='a.err', offset=0, length=-1))
        >>> Record.parse(b"17\\t5.0\\ta.out") is None
        True
        """
        cells = line.rstrip(b"\n").decode(errors="replace").split("\t")
        if len(cells) != 8 or not line.endswith(b"\n"):
            return None
        try:
            out = Extent(cells[2], int(cells[3]), int(cells[4]))
            err = Extent(cells[5], int(cells[6]), int(cells[7]))
            record = cls(cells[0], float(cells[1]), out, err)
        except ValueError:
            return None
        sane = all(os.sep not in e.log and e.log.endswith((".out", ".err")) and e.offset >= 0
                   and e.length >= -1 for e in (out, err))
        return record if sane else None


class _Logs:
    """One slot's pair of logs in one directory, and its index there."""

    def __init__(self, directory: str, base: str) -> None:
        self.directory = directory
        self.base = base
        self.generation = 0
        self.index: Any = None
        self.files: list = []
        self.names: list[str] = []
        self.ends: list[int] = []
        self.last: Record | None = None
        self._open_index()
        self._open()

    def _open_index(self) -> None:
        if self.index is not None:
            self.index.close()
        os.makedirs(self.directory, exist_ok=True)
        self.index = open(os.path.join(self.directory, self.base + ".index"), "ab",  # noqa: SIM115
                          buffering=0)

    def _open(self) -> None:
        for f in self.files:
            f.close()
        stem = self.base if self.generation == 0 else f"{self.base}.{self.generation}"
        self.names = [f"{stem}.out", f"{stem}.err"]
        self.files = [open(os.path.join(self.directory, n), "ab", buffering=0)  # noqa: SIM115
                      for n in self.names]
        self.ends = [os.fstat(f.fileno()).st_size for f in self.files]

    def rotate(self) -> None:
        """New logs: the present ones are left to processes that still write to them."""
        self.generation += 1
        self._open()

    def begin(self, task_id: str) -> tuple[int, int]:
        """The descriptors the command of ``task_id`` writes to, its logs checked first
        (module docstring: a log that grew since the last command ended), its start
        indexed."""
        stats = [os.fstat(f.fileno()) for f in (*self.files, self.index)]
        if any(st.st_nlink == 0 for st in stats):  # removed (the job's directory with them)
            self.last = None
            self._open_index()
            self._open()
            stats = [os.fstat(f.fileno()) for f in self.files]
        sizes = [st.st_size for st in stats[:2]]
        if sizes != self.ends:
            if self.last is not None:  # what grew belongs to the command before, as far as known
                last = self.last
                out, err = (Extent(e.log, e.offset, -1 if size != end else e.length)
                            for e, size, end in zip((last.out, last.err), sizes, self.ends,
                                                    strict=True))
                self._write(Record(last.task_id, last.at, out, err))
            self.last = None
            self.rotate()
        self._write(Record(task_id, time.time(), *(Extent(name, start, -1) for name, start
                                                  in zip(self.names, self.ends, strict=True))))
        return self.files[0].fileno(), self.files[1].fileno()

    def end(self, task_id: str, left_behind: bool) -> Record:
        """Index the command that just ended; ``left_behind``: its group still has members."""
        sizes = [os.fstat(f.fileno()).st_size for f in self.files]
        out, err = (Extent(name, start, -1 if left_behind else size - start)
                    for name, start, size in zip(self.names, self.ends, sizes, strict=True))
        record = Record(task_id, time.time(), out, err)
        self._write(record)
        if left_behind:
            self.last = None
            self.rotate()
        else:
            self.ends, self.last = sizes, record
        return record

    def _write(self, record: Record) -> None:
        self.index.write(record.line())

    def tail(self, record: Record, limit: int) -> bytes:
        """The last ``limit`` bytes of the record's stderr, from this slot's log."""
        e = record.err
        with open(os.path.join(self.directory, e.log), "rb") as f:
            stop = os.fstat(f.fileno()).st_size if e.length < 0 else e.offset + e.length
            start = max(e.offset, stop - limit)
            return os.pread(f.fileno(), stop - start, start)

    def close(self) -> None:
        for f in (*self.files, self.index):
            f.close()


class _Scratch:
    """One slot's two capture files: stdout's and stderr's, anonymous, in append mode."""

    def __init__(self) -> None:
        self.files: list = []
        self.starts = [0, 0]
        self.ends = [0, 0]
        self._new()

    def _new(self) -> None:
        for f in self.files:
            f.close()
        self.files = [tempfile.TemporaryFile() for _ in STREAMS]  # noqa: SIM115 - closed here
        for f in self.files:  # appended to by the command whatever the offset of a read
            fd = f.fileno()
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        self.ends = [0, 0]

    def begin(self) -> tuple[int, int]:
        """The descriptors the next command writes to: new files if a process left behind
        wrote to these since, the present ones emptied if they grew large."""
        sizes = [os.fstat(f.fileno()).st_size for f in self.files]
        if sizes != self.ends:
            self._new()
        elif max(sizes) > SCRATCH_LIMIT:
            for f in self.files:
                os.ftruncate(f.fileno(), 0)
            self.ends = [0, 0]
        self.starts = list(self.ends)
        return self.files[0].fileno(), self.files[1].fileno()

    def end(self, left_behind: bool, keep: int) -> tuple[bytes, bytes]:
        """The last ``keep`` bytes the command wrote to each stream."""
        self.ends = [os.fstat(f.fileno()).st_size for f in self.files]
        out = []
        for f, start, stop in zip(self.files, self.starts, self.ends, strict=True):
            first = max(start, stop - keep)
            out.append(os.pread(f.fileno(), stop - first, first))
        if left_behind:  # the files are the left process's now
            self._new()
        return out[0], out[1]


class SlotLogs:
    """The logs of the slot (the thread) that calls it, per job directory, and its
    capture files."""

    def __init__(self) -> None:
        self._local = threading.local()

    def logs(self, directory: str) -> _Logs:
        """This thread's logs in ``directory``, opened (the directory made) at first use."""
        open_logs: OrderedDict[str, _Logs] | None = getattr(self._local, "logs", None)
        if open_logs is None:
            open_logs = self._local.logs = OrderedDict()
        logs = open_logs.get(directory)
        if logs is not None:
            open_logs.move_to_end(directory)
            return logs
        os.makedirs(directory, exist_ok=True)
        base = f"{socket.gethostname()}-{os.getpid()}-{threading.get_native_id()}"
        logs = open_logs[directory] = _Logs(directory, base)
        while len(open_logs) > OPEN_DIRECTORIES:
            open_logs.popitem(last=False)[1].close()
        return logs

    def scratch(self) -> _Scratch:
        """This thread's capture files, made at first use."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = _Scratch()
        return scratch


SLOTS = SlotLogs()


def group_alive(pgid: int) -> bool:
    """Whether the process group ``pgid`` still has a member (kill(2) with signal 0)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed its user: alive all the same
        return True
    return True


class JobLogs:
    """A job directory's indexes, read once: each task's output."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.records: dict[str, Record] = {}
        for index in self._indexes():
            for record in index.values():
                known = self.records.get(record.task_id)
                if known is None or record.at >= known.at:
                    self.records[record.task_id] = record

    def _indexes(self) -> Iterator[dict[str, Record]]:
        """Each index of the directory: the last line of each of its tasks."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".index"))
        except FileNotFoundError:
            return
        for name in names:
            last: dict[str, Record] = {}
            with open(os.path.join(self.directory, name), "rb") as f:
                for line in f:
                    record = Record.parse(line)
                    if record is not None:
                        last[record.task_id] = record
            yield last

    def output(self, task_id: object, stream: str) -> bytes | None:
        """The bytes ``task_id`` wrote to ``stream`` (so far, if it runs); None if it has
        not started."""
        if stream not in STREAMS:
            raise ValueError(f"no stream {stream!r}: stdout or stderr")
        record = self.records.get(str(task_id))
        if record is None:
            return None
        e = record.out if stream == "stdout" else record.err
        try:
            with open(os.path.join(self.directory, e.log), "rb") as f:
                if e.length < 0:
                    f.seek(e.offset)
                    return f.read()
                return os.pread(f.fileno(), e.length, e.offset)
        except FileNotFoundError:  # indexed, its log removed since
            return None
