"""Every task's run, kept in SQLite: a history that outlives the scheduler.

The dashboard's :class:`~hpcsched.diagnostics.recorder.Recorder` is a bounded ring in
memory. With a history file (``scheduler.history``; a journaled scheduler keeps one
beside its journal by default), the recorder also hands each finished or failed task,
and each report of a bulk map's elements, to :class:`History`: one tuple appended to a
deque on the scheduler's thread, nothing else. A thread of its own writes them to the
file in batches (one transaction every :data:`FLUSH_SECONDS` or :data:`FLUSH_ROWS`, rows
inserted :data:`INSERT_ROWS` to a statement), so the scheduler never waits on the disk.
The table is append-only; a scheduler restarted with the same file goes on appending
(its runs told apart by ``run``).

A journaled scheduler loses nothing to a ``SIGKILL``: each loop turn, before the journal
is written and the turn's messages go out, :meth:`History.sync` appends the rows the turn
made to a spool file beside the history (one ``write`` of one record, checksummed as the
journal's; :data:`SPOOL_BYTES` per file, a full one replaced by a new one and deleted
once the writer thread has put all it holds in SQLite). So a row is in the operating
system's hands no later than the journal that a restart reads; a History opened on the
file of a killed run puts the spooled rows that did not reach SQLite there, once each.

What a row holds of a task's use of the machine is what its worker reported: ``cpu``,
the CPU seconds of its call (the task thread's ``time.thread_time()``; a command task:
its process's user + system time); ``memory``, its peak in bytes (a command task: its
process's maximum RSS; a Python task: the worker process's peak RSS from the task's
start to its end, its own on a worker of one thread:
:class:`~hpcsched.core.worker.memory.PeakMemory`). A bulk map's element holds the mean
CPU time of its worker's report and the report's memory
(:mod:`hpcsched.core.worker.ranges`). ``retries`` is counted when the history is read:
a task that raised and was retried has a row per attempt, numbered from 0.

Read it with ``hpcsched history`` (a table, filters, CSV), ``Client.history()`` (a
pandas DataFrame when pandas is there), or any SQLite client (where a row's ``job`` and
``host`` are NULL: the writer leaves them to :func:`read`, which fills them in)::

    sqlite3 -header -column journal.history.sqlite \\
        "select grp, count(*), avg(stop - start) from tasks group by grp"
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
from collections.abc import Iterable
from itertools import chain, repeat
from typing import Any

logger = logging.getLogger("hpcsched.diagnostics")

FLUSH_SECONDS = 0.5
FLUSH_ROWS = 50_000
SPOOL_BYTES = 16 * 2**20
_FRAME = struct.Struct("<II")  # length, crc32 of the marshalled (run, rows)
COLUMNS = ("key", "grp", "job", "worker", "host", "start", "stop", "cpu", "memory",
           "retries", "outcome", "nbytes", "run")
SCHEMA = """
create table if not exists tasks (
    key text not null,      -- the task's key (a bulk map's element: its own key too)
    grp text not null,      -- its task group
    job text,               -- the command job (hpcsched submit) it belongs to, if any
    worker text not null,   -- the address of the worker that ran it
    host text,              -- that worker's host
    start real not null,    -- when it started and stopped (seconds since the epoch)
    stop real not null,
    outcome text not null,  -- 'memory' (finished) or 'erred'
    nbytes integer,         -- its result's size
    run text not null,      -- which scheduler run wrote the row (a restart: a new run)
    cpu real,               -- CPU seconds (a bulk map's element: its report's mean)
    memory integer          -- peak memory in bytes (see the module docstring)
);
create table if not exists hosts (worker text primary key, host text);
"""
# Each row goes to SQLite as the scheduler made it, and no more: its job (from its key) and
# its worker's host (from the hosts table, written with each batch) are left NULL and
# computed as the history is read (_SELECT), rather than per row on a thread that shares
# the GIL with the scheduler (no index either: a filtered read scans, once, what inserts
# would pay for on every row).
_INSERT = """insert into tasks (key, grp, worker, start, stop, outcome, nbytes, cpu, memory, run)
values {values}"""
_VALUES = "(?, ?, ?, ?, ?, ?, ?, ?, ?, '{run}')"
# Rows go in INSERT_ROWS to a statement: each statement is one sqlite3_step, and Python's
# sqlite3 releases and takes back the GIL around each (Modules/_sqlite), with the
# scheduler's thread waiting for it; 100 rows of 9 parameters stay under the 999 bound
# on parameters of SQLite builds before 3.32 (SQLITE_MAX_VARIABLE_NUMBER).
INSERT_ROWS = 100
# what a reader sees: the stored columns, job and host filled in where a row left them out,
# retries counted (the attempts of the same key before this one in the same run: a task
# that raised and was retried has a row per attempt) over the whole table, before filters
_SELECT = """select {columns} from (
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


class History:
    """The writer: :meth:`task` / :meth:`elements` on the scheduler's thread (appends
    only), a thread of its own writing to ``path``."""

    def __init__(self, path: str, hosts: Any = None) -> None:
        self.path = path
        self.run = uuid.uuid4().hex[:12]
        # (key, grp, worker, start, stop, outcome, nbytes, cpu, memory)
        self._rows: deque = deque()
        self._hosts = hosts  # worker address -> host, read when a batch is written
        self._wake = threading.Event()
        self._waiters: list[threading.Event] = []  # flush() calls waiting for a pass
        self._closed = False
        self.written = 0  # rows in SQLite (the writer thread counts)
        self.appended = 0  # rows handed to it (the scheduler's thread counts)
        self._turn: list | None = None  # this loop turn's rows, when spooling
        self._spool_fd = -1
        self._spool_n = 0
        self._spool_size = 0
        self._retired: list[tuple[str, int]] = []  # full spools: (path, rows up to its end)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with sqlite3.connect(path) as db:  # fail now, in the caller, if it cannot be made
            db.executescript(SCHEMA)
            _add_usage_columns(db)
            self.recovered = _recover_spools(db, path)
        if self.recovered:
            logger.info("task history %s: %d rows of a run that ended abruptly put back from "
                        "its spool", path, self.recovered)
        self._thread = threading.Thread(target=self._write_loop, daemon=True,
                                        name="hpcsched-history")
        self._thread.start()

    # ------------------------------------------------------------ scheduler's thread
    def task(self, key: Any, group: str, worker: str, start: float, stop: float,
             outcome: str, nbytes: int, cpu: float = 0.0, memory: int = 0) -> None:
        row = (key, group, worker, start, stop, outcome, nbytes, cpu, memory)
        self._rows.append(row)
        self.appended += 1
        if self._turn is not None:
            self._turn.append(row)

    def elements(self, group: str, worker: str, keys: list, starts: list, stops: list,
                 nbytes: list, cpu: float = 0.0, memory: int = 0) -> None:
        """Elements of a bulk map from one report of ``worker``: ``cpu`` the CPU seconds
        of the whole report (each row holds their mean), ``memory`` its peak."""
        n = len(keys)
        rows = list(zip(keys, repeat(group, n), repeat(worker, n), starts, stops,
                        repeat("memory", n), nbytes, repeat(cpu / n if n else 0.0, n),
                        repeat(memory, n), strict=True))
        self._rows.extend(rows)
        self.appended += n
        if self._turn is not None:
            self._turn.extend(rows)

    def spool(self) -> None:
        """From now on, :meth:`sync` spools each loop turn's rows (a journaled scheduler)."""
        if self._turn is None:
            self._turn = []
            self._next_spool()

    def sync(self) -> None:
        """The scheduler's thread, each loop turn, before the journal: this turn's rows
        appended to the spool; spools whose rows are all in SQLite deleted."""
        rows = self._turn
        if not rows:
            return
        self._turn = []
        try:
            payload = marshal.dumps((self.run, rows))
        except ValueError:  # a key marshal cannot write: as the table stores it
            payload = marshal.dumps((self.run, [(str(r[0]), *r[1:]) for r in rows]))
        frame = _FRAME.pack(len(payload), zlib.crc32(payload)) + payload
        os.write(self._spool_fd, frame)
        self._spool_size += len(frame)
        if self._spool_size >= SPOOL_BYTES:
            self._retired.append((self._spool_path(self._spool_n), self.appended))
            os.close(self._spool_fd)
            self._next_spool()
        while self._retired and self._retired[0][1] <= self.written:
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
            # no fsync per transaction: a killed process loses no committed row (the spool
            # holds those not yet written); a crash of the machine may lose the last ones
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
        rows = self._rows
        while rows:
            batch = []
            pop = rows.popleft
            for _ in range(min(len(rows), FLUSH_ROWS)):
                batch.append(pop())
            hosts = self._hosts() if self._hosts is not None else {}
            try:
                with db:
                    db.executemany("insert or replace into hosts values (?, ?)", hosts.items())
                    self._insert(db, batch)
            except (sqlite3.ProgrammingError, sqlite3.InterfaceError):  # a key not a string
                with db:
                    self._insert(db, [(str(r[0]), *r[1:]) for r in batch])
            self.written += len(batch)

    def _insert(self, db: sqlite3.Connection, batch: list) -> None:
        """``batch`` in statements of :data:`INSERT_ROWS` rows each, the rest one by one."""
        one = _VALUES.format(run=self.run)  # a hex id of our own: no quoting needed
        full = len(batch) - len(batch) % INSERT_ROWS
        if full:
            many = _INSERT.format(values=", ".join([one] * INSERT_ROWS))
            db.executemany(many, [tuple(chain.from_iterable(batch[i:i + INSERT_ROWS]))
                                  for i in range(0, full, INSERT_ROWS)])
        if full < len(batch):
            db.executemany(_INSERT.format(values=one), batch[full:])

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until what was handed so far is in the file (a reader is about to look)."""
        if not self._thread.is_alive():
            return not self._rows
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
            if not self._thread.is_alive() and self.written >= self.appended:
                for path, _ in self._retired:
                    _unlink(path)
                _unlink(self._spool_path(self._spool_n))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _spooled(path: str) -> list[tuple]:
    """The rows of one spool file, up to a torn or damaged last record."""
    with open(path, "rb") as f:
        data = f.read()
    rows: list[tuple] = []
    at = 0
    while at + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, at)
        payload = data[at + _FRAME.size:at + _FRAME.size + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            break
        run, batch = marshal.loads(payload)
        rows.extend((run, *r) for r in batch)
        at += _FRAME.size + length
    return rows


def _recover_spools(db: sqlite3.Connection, path: str) -> int:
    """Put the spooled rows of earlier runs that SQLite lacks in it, then delete the
    spools; returns how many rows were added."""
    spools = sorted(glob.glob(glob.escape(path) + ".spool.*"),
                    key=lambda p: (p.rsplit(".", 2)[-2], int(p.rsplit(".", 1)[-1])
                                   if p.rsplit(".", 1)[-1].isdigit() else 0))
    if not spools:
        return 0
    rows = [r for p in spools for r in _spooled(p)]
    have: dict[str, set] = {}
    added = []
    hosts: dict[str, Any] = {}
    for run, k, g, w, a, b, o, n, *usage in rows:  # no usage: a spool of an older version
        cpu, memory = usage if usage else (None, None)
        if run not in have:
            have[run] = {(key, start) for key, start in
                         db.execute("select key, start from tasks where run = ?", (run,))}
            hosts.update(db.execute("select worker, host from tasks where run = ? and "
                                    "host is not null group by worker", (run,)).fetchall())
        ident = (str(k), a)
        if ident in have[run]:
            continue
        have[run].add(ident)
        added.append((str(k), g, _job_of(k), w, hosts.get(w), a, b, o, n, run, cpu, memory))
    with db:
        db.executemany("insert into tasks (key, grp, job, worker, host, start, stop, outcome, "
                       "nbytes, run, cpu, memory) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       added)
    for p in spools:
        _unlink(p)
    return len(added)


def _add_usage_columns(db: sqlite3.Connection) -> None:
    """A history file made before tasks had CPU and memory columns gets them (its old
    rows hold NULL there)."""
    have = {row[1] for row in db.execute("pragma table_info(tasks)")}
    for column, kind in (("cpu", "real"), ("memory", "integer")):
        if column not in have:
            db.execute(f"alter table tasks add column {column} {kind}")


def read(path: str, *, job: str | None = None, group: str | None = None,
         outcome: str | None = None, worker: str | None = None,
         limit: int | None = None) -> tuple[list[str], list[tuple]]:
    """(columns, rows) of the history at ``path``, oldest first, filtered."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no task history at {path}")
    where, args = [], []
    for column, value in (("job", job), ("grp", group), ("outcome", outcome),
                          ("worker", worker)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        have = {row[1] for row in db.execute("pragma table_info(tasks)")}
        usage = ", ".join(c if c in have else f"null as {c}" for c in ("cpu", "memory"))
        hosts = db.execute("select 1 from sqlite_master where name = 'hosts'").fetchone()
        host = ("coalesce(host, (select h.host from hosts h where h.worker = tasks.worker))"
                if hosts else "host")
        sql = _SELECT.format(columns=", ".join(COLUMNS), usage=usage, host=host)
        if where:
            sql += " where " + " and ".join(where)
        sql += " order by rid"
        if limit:
            sql += f" limit {int(limit)}"
        return list(COLUMNS), db.execute(sql, args).fetchall()
    finally:
        db.close()


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
