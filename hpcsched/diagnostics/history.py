"""Every task's run, kept in SQLite: a history that outlives the scheduler.

The dashboard's :class:`~hpcsched.diagnostics.recorder.Recorder` is a bounded ring in
memory. With a history file (``scheduler.history``; a journaled scheduler keeps one
beside its journal by default), the recorder also hands each finished or failed task,
and each report of a bulk map's elements, to :class:`History`: one tuple appended to a
list on the scheduler's thread, nothing else. The history is append-only; a scheduler
restarted with the same file goes on appending (its runs told apart by ``run``).

What is stored is what the scheduler handed, in batches, not a row per task: a SQLite
row per batch holds frames (a length and a CRC-32, then a :mod:`marshal` of
``(FORMAT, run, seq, records)``), each the records of one loop turn (with a journal)
or of one pass of the writer thread (without). A record is a task's run, ``(key, grp,
worker, start, stop, outcome, nbytes, cpu, memory)``, or a bulk map's report, ``(None,
grp, worker, keys, starts, stops, nbytes, cpu, memory)``: one tuple for hundreds of
elements, their lists as the report carried them. Making a row per task in SQLite (its
binding and insert) cost more of the scheduler's process than the rest of the history
together; a marshal of the turn's records costs a tenth of it, and the spool below
makes that marshal anyway. :func:`read` expands the records into one row per task.
A thread of its own writes the batches (one transaction every :data:`FLUSH_SECONDS`),
so the scheduler never waits on the disk::

    create table batches (run text, first integer, last integer, frames blob)
    -- frames seq first..last of scheduler run ``run``, as written to its spool
    create table hosts (worker text primary key, host text)

Raw SQL sees batches, not tasks: ``hpcsched history FILE --csv`` gives one row per task
to any other tool (SQLite's own ``.import --csv``, a spreadsheet). A history file
of an older version (a ``tasks`` table of a row per task) is read as it is, and a
scheduler appending to it adds batches beside it.

A journaled scheduler loses nothing to a ``SIGKILL``: each loop turn, before the journal
is written and the turn's messages go out, :meth:`History.sync` appends the frame of the
records the turn made to a spool file beside the history (one ``write``;
:data:`SPOOL_BYTES` per file, a full one replaced by a new one and deleted once the
writer thread has put all its frames in SQLite), and hands the same bytes to the writer
thread. So a task's record is in the operating system's hands no later than the journal
that a restart reads; a History opened on the file of a killed run puts the spooled
frames that did not reach SQLite there (those after the run's last stored ``seq``), once
each.

What a row holds of a task's use of the machine is what its worker reported: ``cpu``,
the CPU seconds of its call (the task thread's ``time.thread_time()``; a command task:
its process's user + system time); ``memory``, its peak in bytes (a command task: its
process's maximum RSS; a Python task: the worker process's peak RSS from the task's
start to its end, its own on a worker of one thread:
:class:`~hpcsched.core.worker.memory.PeakMemory`). A bulk map's element holds the mean
CPU time of its worker's report and the report's memory
(:mod:`hpcsched.core.worker.ranges`). Each row's ``job`` (from its key), ``host`` (from
the hosts table) and ``retries`` are computed when the history is read: a task that
raised and was retried has a row per attempt, numbered from 0.

Read it with ``hpcsched history`` (a table, filters, CSV), ``Client.history()`` (a
pandas DataFrame when pandas is there), or :func:`read`. The frames hold only ``str``,
``int``, ``float``, ``None``, lists and tuples, which every Python 3 since 3.4 reads
back with :func:`marshal.loads` (marshal format 4; a key that marshal cannot write is
stored as its ``str``).
"""

from __future__ import annotations

import glob
import logging
import marshal
import os
import sqlite3
import struct
import threading
import uuid
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

logger = logging.getLogger("hpcsched.diagnostics")

# a pass of the writer costs a transaction (tens of microseconds, whatever it holds); the
# spool, not SQLite, keeps a journaled run's records safe, and readers of this process
# ask for a pass first (flush()): another process's reader sees what is at most this old
FLUSH_SECONDS = 2.0
FLUSH_RECORDS = 50_000  # records to a frame the writer thread makes (no spool)
BATCH_BYTES = 4 * 2**20  # frames to one stored batch, at most about this many bytes
SPOOL_BYTES = 16 * 2**20
FORMAT = 1  # of a frame's payload, (FORMAT, run, seq, records)
_FRAME = struct.Struct("<II")  # length, crc32 of the marshalled payload
COLUMNS = ("key", "grp", "job", "worker", "host", "start", "stop", "cpu", "memory",
           "retries", "outcome", "nbytes", "run")
SCHEMA = """
create table if not exists batches (
    run text not null,      -- which scheduler run wrote it (a restart: a new run)
    first integer not null, -- the seq of its first and last frame in that run
    last integer not null,
    frames blob not null    -- frames of records: see the module docstring
);
create table if not exists hosts (worker text primary key, host text);
"""
# the row per task of the older format, read as it is; its spools are put back there
_LEGACY_SCHEMA = """
create table if not exists tasks (
    key text not null, grp text not null, job text, worker text not null, host text,
    start real not null, stop real not null, outcome text not null, nbytes integer,
    run text not null, cpu real, memory integer
);
"""
# what a reader of the older format sees: job and host filled in where a row left them
# out, retries counted (the attempts of the same key before this one in the same run)
# over the whole table, before filters
_LEGACY_SELECT = """select {columns} from (
    select key, grp, worker, start, stop, outcome, nbytes, run, {usage}, rowid as rid,
           coalesce(job, case when substr(key, 1, 13) = 'hpcsched-job-'
                              then substr(key, 14, instr(substr(key, 14) || '-', '-') - 1)
                         end) as job,
           {host} as host,
           count(*) over (partition by run, key order by rowid) - 1 as retries
    from tasks)"""
JOB_PREFIX = "hpcsched-job-"


def default_path(journal: str | None) -> str | None:
    """Where a scheduler keeps its history when not told: beside its journal, if any."""
    return f"{journal}.history.sqlite" if journal else None


def _job_of(key: Any) -> str | None:
    if type(key) is str and key.startswith(JOB_PREFIX):
        return key[len(JOB_PREFIX):].split("-", 1)[0]
    return None


def _frame(run: str, seq: int, records: list) -> bytes:
    """One frame of ``records`` (see the module docstring)."""
    try:
        payload = marshal.dumps((FORMAT, run, seq, records))
    except ValueError:  # a key marshal cannot write: stored as its str
        payload = marshal.dumps((FORMAT, run, seq, [
            (str(r[0]), *r[1:]) if r[0] is not None
            else (None, r[1], r[2], [k if type(k) is str else str(k) for k in r[3]], *r[4:])
            for r in records]))
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _payloads(data: bytes) -> Iterator[bytes]:
    """The payloads of the frames in ``data``, up to a torn or damaged last one."""
    at = 0
    while at + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, at)
        payload = data[at + _FRAME.size:at + _FRAME.size + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            return
        yield payload
        at += _FRAME.size + length


def _tasks(records: list) -> Iterator[tuple]:
    """``(key, grp, worker, start, stop, outcome, nbytes, cpu, memory)`` of each task in
    ``records``, a bulk map's report expanded to its elements (each the report's mean
    CPU time and its memory)."""
    for r in records:
        if r[0] is not None:
            yield r
            continue
        _, grp, worker, keys, starts, stops, nbytes, cpu, memory = r
        share = cpu / len(keys) if keys and cpu is not None else cpu
        for key, start, stop, size in zip(keys, starts, stops, nbytes, strict=True):
            yield key, grp, worker, start, stop, "memory", size, share, memory


class History:
    """The writer: :meth:`task` / :meth:`elements` on the scheduler's thread (appends
    only), a thread of its own writing to ``path``."""

    def __init__(self, path: str, hosts: Any = None) -> None:
        self.path = path
        self.run = uuid.uuid4().hex[:12]
        # records handed and not framed yet (without a spool: the writer frames them)
        self._rows: deque = deque()
        self._out: Any = self._rows  # where task() and elements() append: or this turn's
        self._turn: list | None = None  # this loop turn's records, when spooling
        self._frames: deque[tuple[int, bytes]] = deque()  # (seq, frame) for the writer
        self._seq = 0  # the last frame's seq (one thread makes them: see spool())
        self.stored = 0  # the seq of the last frame in SQLite (the writer thread's)
        self._hosts = hosts  # worker address -> host, read when a batch is written
        self._hosts_stored: dict[str, Any] = {}  # what the hosts table holds (writer's)
        self._wake = threading.Event()
        self._waiters: list[threading.Event] = []  # flush() calls waiting for a pass
        self._closed = False
        self._spool_fd = -1
        self._spool_n = 0
        self._spool_size = 0
        self._retired: list[tuple[str, int]] = []  # full spools: (path, seq of their last)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with sqlite3.connect(path) as db:  # fail now, in the caller, if it cannot be made
            db.executescript(SCHEMA)
            if _has_table(db, "tasks"):
                _add_usage_columns(db)
            self.recovered = _recover_spools(db, path)
        if self.recovered:
            logger.info("task history %s: %d tasks of a run that ended abruptly put back from "
                        "its spool", path, self.recovered)
        self._thread = threading.Thread(target=self._write_loop, daemon=True,
                                        name="hpcsched-history")
        self._thread.start()

    # ------------------------------------------------------------ scheduler's thread
    def task(self, key: Any, group: str, worker: str, start: float, stop: float,
             outcome: str, nbytes: int, cpu: float = 0.0, memory: int = 0) -> None:
        self._out.append((key, group, worker, start, stop, outcome, nbytes, cpu, memory))

    def elements(self, group: str, worker: str, keys: list, starts: list, stops: list,
                 nbytes: list, cpu: float = 0.0, memory: int = 0) -> None:
        """Elements of a bulk map from one report of ``worker``: ``cpu`` the CPU seconds
        of the whole report (each element's row holds their mean), ``memory`` its peak.
        One record for them all; the lists are kept as they are (not to be changed)."""
        if not len(keys) == len(starts) == len(stops) == len(nbytes):
            raise ValueError("elements: keys, starts, stops and nbytes differ in length")
        if keys:
            self._out.append((None, group, worker, keys, starts, stops, nbytes, cpu, memory))

    def spool(self) -> None:
        """From now on, :meth:`sync` spools each loop turn's records (a journaled
        scheduler); called before the first record is handed."""
        if self._turn is not None:
            return
        if self._seq or self._rows:
            raise RuntimeError("History.spool() after records were handed to the writer")
        self._turn = self._out = []
        self._next_spool()

    def sync(self) -> None:
        """The scheduler's thread, each loop turn, before the journal: this turn's records
        appended to the spool as one frame, and handed to the writer thread; spools whose
        frames are all in SQLite deleted."""
        records = self._turn
        if not records:
            return
        self._turn = self._out = []
        self._seq += 1
        frame = _frame(self.run, self._seq, records)
        os.write(self._spool_fd, frame)
        self._frames.append((self._seq, frame))
        self._spool_size += len(frame)
        if self._spool_size >= SPOOL_BYTES:
            self._retired.append((self._spool_path(self._spool_n), self._seq))
            os.close(self._spool_fd)
            self._next_spool()
        while self._retired and self._retired[0][1] <= self.stored:
            _unlink(self._retired.pop(0)[0])

    def _spool_path(self, n: int) -> str:
        return f"{self.path}.spool.{self.run}.{n}"

    def _next_spool(self) -> None:
        self._spool_n += 1
        self._spool_fd = os.open(self._spool_path(self._spool_n),
                                 os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._spool_size = 0

    # ------------------------------------------------------------ its own thread
    def _write_loop(self) -> None:
        db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            db.execute("pragma journal_mode=wal")
            # no fsync per transaction: a killed process loses no committed frame (the
            # spool holds those not yet written); a crash of the machine may lose the last
            db.execute("pragma synchronous=normal")
            while True:
                self._wake.wait(FLUSH_SECONDS)
                self._wake.clear()
                waiters, self._waiters = self._waiters, []
                self._flush(db)
                for w in waiters:  # what was handed before they asked is written
                    w.set()
                if self._closed:
                    self._flush(db)
                    return
        except sqlite3.Error as e:
            logger.warning("the task history %s cannot be written (%s): it stops here",
                           self.path, e)
        finally:
            db.close()

    def _flush(self, db: sqlite3.Connection) -> None:
        rows, frames = self._rows, self._frames
        while rows:  # no spool: the records handed so far, framed here
            pop = rows.popleft
            records = [pop() for _ in range(min(len(rows), FLUSH_RECORDS))]
            self._seq += 1
            frames.append((self._seq, _frame(self.run, self._seq, records)))
        while frames:
            first = last = frames[0][0]
            batch: list[bytes] = []
            size = 0
            while frames and size < BATCH_BYTES:
                last, frame = frames.popleft()
                batch.append(frame)
                size += len(frame)
            hosts = self._hosts() if self._hosts is not None else {}
            known = self._hosts_stored
            changed = [(w, h) for w, h in hosts.items() if known.get(w, known) != h]
            with db:
                if changed:
                    db.executemany("insert or replace into hosts values (?, ?)", changed)
                db.execute("insert into batches values (?, ?, ?, ?)",
                           (self.run, first, last, b"".join(batch)))
            known.update(changed)
            self.stored = last

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until what was handed so far is in the file (a reader is about to look)."""
        if not self._thread.is_alive():
            return not self._rows and not self._frames
        done = threading.Event()
        self._waiters.append(done)
        self._wake.set()
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)
        if self._spool_fd >= 0:
            os.close(self._spool_fd)
            self._spool_fd = -1
            if not self._thread.is_alive() and self.stored >= self._seq:
                for path, _ in self._retired:
                    _unlink(path)
                _unlink(self._spool_path(self._spool_n))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("select 1 from sqlite_master where type = 'table' and name = ?",
                      (name,)).fetchone() is not None


def _recover_spools(db: sqlite3.Connection, path: str) -> int:
    """Put the spooled frames of earlier runs that SQLite lacks in it, then delete the
    spools; returns how many tasks they held."""
    spools = sorted(glob.glob(glob.escape(path) + ".spool.*"),
                    key=lambda p: (p.rsplit(".", 2)[-2], int(p.rsplit(".", 1)[-1])
                                   if p.rsplit(".", 1)[-1].isdigit() else 0))
    if not spools:
        return 0
    stored: dict[str, int] = {}
    missing: dict[str, list[tuple[int, bytes]]] = {}
    legacy: list[tuple] = []
    added = 0
    for p in spools:
        with open(p, "rb") as f:
            data = f.read()
        for payload in _payloads(data):
            got = marshal.loads(payload)
            if len(got) == 2:  # (run, rows): a spool of the older format
                run, rows = got
                legacy.extend((run, *r) for r in rows)
                continue
            _, run, seq, records = got
            if run not in stored:
                stored[run] = db.execute("select coalesce(max(last), 0) from batches "
                                         "where run = ?", (run,)).fetchone()[0]
            if seq > stored[run]:
                stored[run] = seq
                missing.setdefault(run, []).append(
                    (seq, _FRAME.pack(len(payload), zlib.crc32(payload)) + payload))
                added += sum(1 for _ in _tasks(records))
    with db:
        for run, frames in missing.items():
            db.execute("insert into batches values (?, ?, ?, ?)",
                       (run, frames[0][0], frames[-1][0], b"".join(f for _, f in frames)))
    if legacy:
        added += _recover_legacy(db, legacy)
    for p in spools:
        _unlink(p)
    return added


def _recover_legacy(db: sqlite3.Connection, rows: list[tuple]) -> int:
    """Rows ``(run, key, grp, worker, start, stop, outcome, nbytes[, cpu, memory])`` of an
    older version's spools that its ``tasks`` table lacks put there; how many."""
    db.executescript(_LEGACY_SCHEMA)
    _add_usage_columns(db)
    have: dict[str, set] = {}
    added = []
    for run, k, g, w, a, b, o, n, *usage in rows:  # no usage: a spool older still
        cpu, memory = usage if usage else (None, None)
        if run not in have:
            have[run] = {(key, start) for key, start in
                         db.execute("select key, start from tasks where run = ?", (run,))}
        ident = (str(k), a)
        if ident in have[run]:
            continue
        have[run].add(ident)
        added.append((str(k), g, _job_of(k), w, a, b, o, n, run, cpu, memory))
    with db:
        db.executemany("insert into tasks (key, grp, job, worker, start, stop, outcome, "
                       "nbytes, run, cpu, memory) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       added)
    return len(added)


def _add_usage_columns(db: sqlite3.Connection) -> None:
    """A ``tasks`` table made before tasks had CPU and memory columns gets them (its old
    rows hold NULL there)."""
    have = {row[1] for row in db.execute("pragma table_info(tasks)")}
    for column, kind in (("cpu", "real"), ("memory", "integer")):
        if column not in have:
            db.execute(f"alter table tasks add column {column} {kind}")


def read(path: str, *, job: str | None = None, group: str | None = None,
         outcome: str | None = None, worker: str | None = None,
         limit: int | None = None) -> tuple[list[str], list[tuple]]:
    """(columns, rows) of the history at ``path``: a row per task run, oldest first,
    filtered (``limit``: the first so many that pass the filters)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no task history at {path}")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        try:
            legacy, batches = _has_table(db, "tasks"), _has_table(db, "batches")
        except sqlite3.DatabaseError as e:
            raise ValueError(f"{path} is not a task history: {e}") from e
        if not legacy and not batches:
            raise ValueError(f"{path} is not a task history: it has neither a batches "
                             "table (this format) nor a tasks table (the older one)")
        rows = _read_legacy(db, job, group, outcome, worker, limit) if legacy else []
        if batches and not (limit and len(rows) >= limit):
            rows += _read_batches(db, job, group, outcome, worker,
                                  limit - len(rows) if limit else None)
        return list(COLUMNS), rows
    finally:
        db.close()


def _read_legacy(db: sqlite3.Connection, job: str | None, group: str | None,
                 outcome: str | None, worker: str | None, limit: int | None) -> list[tuple]:
    """The rows of an older version's ``tasks`` table."""
    where, args = [], []
    for column, value in (("job", job), ("grp", group), ("outcome", outcome),
                          ("worker", worker)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    have = {row[1] for row in db.execute("pragma table_info(tasks)")}
    usage = ", ".join(c if c in have else f"null as {c}" for c in ("cpu", "memory"))
    host = ("coalesce(host, (select h.host from hosts h where h.worker = tasks.worker))"
            if _has_table(db, "hosts") else "host")
    sql = _LEGACY_SELECT.format(columns=", ".join(COLUMNS), usage=usage, host=host)
    if where:
        sql += " where " + " and ".join(where)
    sql += " order by rid"
    if limit:
        sql += f" limit {int(limit)}"
    return db.execute(sql, args).fetchall()


def _read_batches(db: sqlite3.Connection, job: str | None, group: str | None,
                  outcome: str | None, worker: str | None, limit: int | None) -> list[tuple]:
    """The batches' records expanded to a row per task, filtered."""
    hosts = dict(db.execute("select worker, host from hosts")) if _has_table(db, "hosts") \
        else {}
    attempts: dict[tuple[str, str], int] = {}  # (run, key) -> rows of it so far
    out: list[tuple] = []
    for (data,) in db.execute("select frames from batches order by rowid"):
        for payload in _payloads(data):
            _, run, _, records = marshal.loads(payload)
            for key, grp, w, start, stop, how, nbytes, cpu, memory in _tasks(records):
                if type(key) is not str:
                    key = str(key)
                retries = attempts.get((run, key), 0)
                attempts[run, key] = retries + 1
                if (group is not None and grp != group or outcome is not None and how != outcome
                        or worker is not None and w != worker):
                    continue
                of_job = _job_of(key)
                if job is not None and of_job != job:
                    continue
                out.append((key, grp, of_job, w, hosts.get(w), start, stop, cpu, memory,
                            retries, how, nbytes, run))
                if limit and len(out) >= limit:
                    return out
    return out


def as_frame(columns: list[str], rows: Iterable[tuple]) -> Any:
    """A pandas DataFrame when pandas is installed, else a list of dicts."""
    try:
        import pandas as pd  # type: ignore[import-untyped]
    except ImportError:
        return [dict(zip(columns, r, strict=True)) for r in rows]
    return pd.DataFrame(list(rows), columns=columns)


def client_history(client: Any, **filters: Any) -> Any:
    """``Client.history()``: the history of the client's scheduler, read from its file
    (on a file system the client sees, as a login node sees the cluster's)."""
    from hpcsched.diagnostics.report import request

    path = request(client, "history")["path"]
    return as_frame(*read(path, **filters))
