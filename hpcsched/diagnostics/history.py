"""Every task's run, kept in SQLite: a history that outlives the scheduler.

The dashboard's :class:`~hpcsched.diagnostics.recorder.Recorder` is a bounded ring in
memory. With a history file (``scheduler.history``; a journaled scheduler keeps one
beside its journal by default), the recorder also hands each finished or failed task,
and each report of a bulk map's elements, to :class:`History`: one tuple appended to a
deque on the scheduler's thread, nothing else. A thread of its own writes them to the
file in batches (one transaction every :data:`FLUSH_SECONDS` or :data:`FLUSH_ROWS`), so
the scheduler never waits on the disk. The table is append-only; a scheduler restarted
with the same file goes on appending (its runs told apart by ``run``).

Read it with ``hpcsched history`` (a table, filters, CSV), ``Client.history()`` (a
pandas DataFrame when pandas is there), or any SQLite client::

    sqlite3 -header -column journal.history.sqlite \\
        "select grp, count(*), avg(stop - start) from tasks group by grp"
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import uuid
from collections import deque
from collections.abc import Iterable
from itertools import repeat
from typing import Any

logger = logging.getLogger("hpcsched.diagnostics")

FLUSH_SECONDS = 0.5
FLUSH_ROWS = 50_000
COLUMNS = ("key", "grp", "job", "worker", "host", "start", "stop", "outcome", "nbytes",
           "run")
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
    run text not null       -- which scheduler run wrote the row (a restart: a new run)
);
create index if not exists tasks_grp on tasks (grp);
create index if not exists tasks_job on tasks (job);
"""
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
        self._rows: deque = deque()  # (key, grp, worker, start, stop, outcome, nbytes)
        self._hosts = hosts  # worker address -> host, read when a batch is written
        self._wake = threading.Event()
        self._waiters: list[threading.Event] = []  # flush() calls waiting for a pass
        self._closed = False
        self.written = 0
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with sqlite3.connect(path) as db:  # fail now, in the caller, if it cannot be made
            db.executescript(SCHEMA)
        self._thread = threading.Thread(target=self._write_loop, daemon=True,
                                        name="hpcsched-history")
        self._thread.start()

    # ------------------------------------------------------------ scheduler's thread
    def task(self, key: Any, group: str, worker: str, start: float, stop: float,
             outcome: str, nbytes: int) -> None:
        self._rows.append((key, group, worker, start, stop, outcome, nbytes))

    def elements(self, group: str, worker: str, keys: list, starts: list, stops: list,
                 nbytes: list) -> None:
        n = len(keys)
        self._rows.extend(zip(keys, repeat(group, n), repeat(worker, n), starts, stops,
                              repeat("memory", n), nbytes, strict=True))

    # ------------------------------------------------------------ its own thread
    def _write_loop(self) -> None:
        db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            db.execute("pragma journal_mode=wal")
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
            run = self.run
            with db:
                db.executemany(
                    "insert into tasks values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(str(k), g, _job_of(k), w, hosts.get(w), a, b, o, n, run)
                     for k, g, w, a, b, o, n in batch])
            self.written += len(batch)

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
    sql = f"select {', '.join(COLUMNS)} from tasks"
    if where:
        sql += " where " + " and ".join(where)
    sql += " order by rowid"
    if limit:
        sql += f" limit {int(limit)}"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
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
