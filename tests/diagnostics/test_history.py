"""The task history (hpcsched/diagnostics/history.py): every task's run in SQLite, read
by ``Client.history()`` and ``hpcsched history``, on both roads."""

from __future__ import annotations

import csv
import io
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from hpcsched import LocalCluster
from hpcsched.core import config
from hpcsched.diagnostics.history import History, read

pytestmark = pytest.mark.timeout(180)


def inc(x: int) -> int:
    return x + 1


def fail(x: int) -> int:
    raise ValueError(f"bad input {x}")


def test_a_history_lists_every_task_of_both_roads_once(tmp_path, road):
    path = tmp_path / "h.sqlite"
    with config.set({"scheduler.history": str(path)}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                         dashboard_address=None) as cluster, cluster.get_client() as client:
        n = 40
        futures = road.calls(client, inc, n)
        assert client.gather(futures) == list(range(1, n + 1))
        bad = client.submit(fail, 7)
        with pytest.raises(ValueError):
            bad.result(60)
        frame = client.history()
        keys = list(frame["key"])
        assert sorted(keys) == sorted([str(f.key) for f in futures] + [str(bad.key)])
        assert len(set(keys)) == len(keys)
        workers = set(cluster.scheduler.state.workers)
        assert set(frame["worker"]) <= workers
        assert (frame["stop"] >= frame["start"]).all()
        assert list(frame[frame["outcome"] == "erred"]["key"]) == [str(bad.key)]
        # what each used: this process's RSS (in-process workers), its thread's CPU time
        assert (frame["memory"] > 0).all() and (frame["cpu"] >= 0).all()
        assert (frame["retries"] == 0).all()
        assert set(frame["host"].dropna()) and len(set(frame["run"])) == 1
        # filters
        assert len(client.history(outcome="erred")) == 1
        assert len(client.history(limit=5)) == 5
        calls = frame[frame["key"] != str(bad.key)]
        assert len(set(calls["grp"])) == 1
        assert list(client.history(group=calls["grp"].iloc[0])["key"]) == list(calls["key"])
        worker = calls["worker"].iloc[0]
        assert list(client.history(worker=worker)["key"]) == \
            list(frame[frame["worker"] == worker]["key"])
        if road.name == "bulk":  # an element that raises: a row with its report's memory
            elements = road.map(client, fail, range(40), pure=False)
            client.gather(elements, errors="skip")
            erred = client.history(outcome="erred")
            assert len(erred) == 41 and (erred["memory"] > 0).all()


def burn(x: int) -> int:
    """About 0.1 s of CPU time on the calling thread."""
    t = time.thread_time()
    while time.thread_time() - t < 0.1:
        pass
    return x


def test_cpu_seconds_are_the_task_threads_on_both_roads(tmp_path, road):
    """A task busy 0.1 s of CPU is charged that much; on the bulk road the rows of a
    report share its CPU time, so the sum over them is what counts."""
    path = tmp_path / "h.sqlite"
    with config.set({"scheduler.history": str(path)}), \
            LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                         dashboard_address=None) as cluster, cluster.get_client() as client:
        futures = road.calls(client, burn, 40)
        client.gather(futures)
        frame = client.history()
    assert len(frame) == 40
    # two threads of one process on a loaded machine: each task's CPU time is its own
    # thread's, never the other thread's as well (process CPU time would count both)
    assert 40 * 0.1 <= frame["cpu"].sum() < 40 * 0.1 * 1.5


def test_a_retried_task_has_a_row_per_attempt_counting_its_retries(tmp_path):
    path = tmp_path / "h.sqlite"
    with config.set({"scheduler.history": str(path)}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                         dashboard_address=None) as cluster, cluster.get_client() as client:
        bad = client.submit(fail, 3, retries=2)
        with pytest.raises(ValueError):
            bad.result(60)
        frame = client.history()
        assert list(frame["key"]) == [str(bad.key)] * 3
        assert list(frame["retries"]) == [0, 1, 2]
        assert list(client.history(outcome="erred")["retries"]) == [0, 1, 2]


def test_a_command_task_reports_its_process_cpu_and_peak_memory(tmp_path, road):
    """A command's CPU seconds and peak memory are its process's (os.wait4), not the
    worker's: each allocates and touches 300 MiB and burns CPU; on the bulk road a row
    holds its report's largest peak and its share of the report's CPU time."""
    path = tmp_path / "h.sqlite"
    program = ("import time; b = bytearray(300 << 20); t = time.process_time()\n"
               "while time.process_time() - t < 0.05: pass")
    n = 40 if road.name == "bulk" else 4
    with config.set({"scheduler.history": str(path)}), \
            LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                         dashboard_address=None) as cluster, cluster.get_client() as client:
        futures = client.map_command([sys.executable, "-c", program], range(n))
        client.gather(futures)
        frame = client.history()
    assert len(frame) == n
    assert (frame["memory"] >= 300 << 20).all()
    # the worker's threads only wait for the processes: what is counted is theirs
    assert frame["cpu"].sum() >= n * 0.05


def touch_200mb_at_0(x: int) -> int:
    """Element 0 holds 200 MiB of touched memory for its run (freed as it returns)."""
    return len(b"\1" * (200 << 20)) if x == 0 else x


def test_a_python_tasks_memory_is_its_own_peak_not_the_workers_last_one(tmp_path, road):
    """One task thread: a task's peak memory is the worker's peak from the task's start
    to its end (the worker's own memory included). A task that touched 200 MiB shows
    them; the tasks that run after it on the same worker, long after that memory went
    back, show much less (on the bulk road: the peak of the element's report)."""
    path = tmp_path / "h.sqlite"
    n = 40
    with config.set({"scheduler.history": str(path)}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster, cluster.get_client() as client:
        big = road.calls(client, touch_200mb_at_0, n)
        assert client.gather(big)[0] == 200 << 20
        small = road.calls(client, inc, n)
        assert client.gather(small) == list(range(1, n + 1))
        frame = client.history()
    memory = dict(zip(frame["key"], frame["memory"], strict=True))
    peak = memory[str(big[0].key)]
    assert peak >= 200 << 20
    after = [memory[str(f.key)] for f in small]
    assert 0 < max(after) < peak - (150 << 20), (peak, max(after))


def test_no_history_unless_asked_and_a_clear_error(tmp_path):
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, cluster.get_client() as client:
        with pytest.raises(RuntimeError, match="keeps no task history"):
            client.history()


def test_without_a_history_no_result_carries_cpu_or_memory_on_both_roads(road, monkeypatch):
    """Each task's CPU seconds and peak memory cost every task-finished a little: a
    scheduler that keeps no history does not ask its workers for them, and what reaches
    its state (decoded from worker processes' messages) carries neither, for tasks,
    failures, commands and a bulk map's reports."""
    seen: list = []
    with LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as cluster, \
            cluster.get_client() as client:
        scheduler = cluster.scheduler
        assert scheduler.usage_wanted is False
        recorder = scheduler.state.recorder
        task_finished, task_erred = recorder.task_finished, recorder.task_erred
        elements_finished = recorder.elements_finished

        def finished(e, *args, **kwargs):
            seen.append((e.cpu, e.memory))
            return task_finished(e, *args, **kwargs)

        def erred(e, *args, **kwargs):
            seen.append((e.cpu, e.memory))
            return task_erred(e, *args, **kwargs)

        def elements(group, ws, keys, starts, stops, nbytes, cpu=0.0, memory=0):
            seen.append((cpu, memory))
            return elements_finished(group, ws, keys, starts, stops, nbytes, cpu, memory)

        # before any task ran: nothing is read half-patched
        monkeypatch.setattr(recorder, "task_finished", finished)
        monkeypatch.setattr(recorder, "task_erred", erred)
        monkeypatch.setattr(recorder, "elements_finished", elements)
        assert client.gather(road.calls(client, burn, 40)) == list(range(40))
        with pytest.raises(ValueError):
            client.submit(fail, 7).result(60)
        client.gather(client.map_command([sys.executable, "-c", "pass"], range(2)))
        assert all(client.run(lambda dask_worker: dask_worker.tasks.usage_wanted is False)
                   .values())
    assert len(seen) >= 4 and set(seen) == {(0.0, 0)}


def test_the_writer_appends_across_runs_and_reads_filter(tmp_path):
    path = str(tmp_path / "h.sqlite")
    for run in range(2):
        h = History(path, lambda: {"tcp://a:1": "node1"})
        h.task(f"t-{run}", "t", "tcp://a:1", 1.0, 2.0, "memory", 8)
        h.elements("m", "tcp://a:1", [f"m-{run}-0", f"m-{run}-1"], [1.0, 2.0], [3.0, 4.0],
                   [8, 8])
        h.task(f"hpcsched-job-3-abc-{run}", "hpcsched-job-3", "tcp://a:1", 1.0, 2.0, "erred", 0)
        h.close()
    columns, rows = read(path)
    assert len(rows) == 8 and len({r[columns.index("run")] for r in rows}) == 2
    assert {r[columns.index("host")] for r in rows} == {"node1"}
    _, jobs = read(path, job="3")
    assert [r[0] for r in jobs] == ["hpcsched-job-3-abc-0", "hpcsched-job-3-abc-1"]
    with pytest.raises(FileNotFoundError):
        read(str(tmp_path / "missing.sqlite"))
    with sqlite3.connect(path) as db:  # an ordinary SQLite file: a batch per run here
        assert db.execute("select count(*), count(distinct run) from batches").fetchone() \
            == (2, 2)
    db.close()


def test_records_of_both_kinds_keep_their_order_and_values_across_frames(tmp_path,
                                                                        monkeypatch):
    """Tasks and bulk reports interleaved, over several frames (the writer frames at most
    FLUSH_RECORDS records each) and one stored batch, one with a key that is not a string:
    every task once, in the order handed, as handed."""
    from hpcsched.diagnostics import history

    monkeypatch.setattr(history, "FLUSH_RECORDS", 3)
    path = str(tmp_path / "h.sqlite")
    h = History(path)
    expected = []
    for r in range(4):
        n = 50 + r
        keys = [f"m-{r}-{i}" for i in range(n)]
        h.elements("m", "tcp://a:1", keys, [float(i) for i in range(n)],
                   [i + 0.5 for i in range(n)], list(range(n)), cpu=n * 0.25, memory=7 << 20)
        expected += [(k, "m", float(i), i + 0.5, i, 0.25, 7 << 20, "memory")
                     for i, k in enumerate(keys)]
        h.task(("x", r), "x", "tcp://a:2", 1.0, 2.0, "erred", 0, 0.5, 1 << 20)
        expected.append((str(("x", r)), "x", 1.0, 2.0, 0, 0.5, 1 << 20, "erred"))
    assert h.flush()
    h.close()
    columns, rows = read(path)
    got = [dict(zip(columns, r, strict=True)) for r in rows]
    assert [(g["key"], g["grp"], g["start"], g["stop"], g["nbytes"], g["cpu"], g["memory"],
             g["outcome"]) for g in got] == expected
    with sqlite3.connect(path) as db:
        assert db.execute("select count(*), min(first), max(last) from batches").fetchone() \
            == (1, 1, 3)
    db.close()
    _, rows = read(path, worker="tcp://a:2")
    assert [r[0] for r in rows] == [str(("x", r)) for r in range(4)]
    _, rows = read(path, group="m", limit=60)
    assert [r[0] for r in rows] == [f"m-0-{i}" for i in range(50)] + \
        [f"m-1-{i}" for i in range(10)]


def test_many_tasks_are_stored_in_few_batches(tmp_path):
    """What makes writing cheap: the writer stores a pass's tasks as one SQLite row (a
    spooled history: a frame per loop turn, a batch per pass), not a row per task."""
    path = str(tmp_path / "h.sqlite")
    h = History(path)
    h.spool()
    for turn in range(100):
        for i in range(100):
            h.task(f"t-{turn}-{i}", "t", "tcp://a:1", 1.0, 2.0, "memory", 8)
        h.sync()
    assert h.flush()
    h.close()
    with sqlite3.connect(path) as db:
        batches, frames = db.execute("select count(*), sum(last - first + 1) from batches") \
            .fetchone()
    db.close()
    assert frames == 100 and batches <= 10
    _, rows = read(path)
    assert len(rows) == 10_000 and rows[-1][0] == "t-99-99"
    assert not list(tmp_path.glob("h.sqlite.spool.*"))


def test_the_hosts_table_follows_workers_that_come_and_change(tmp_path):
    """Each pass of the writer stores the hosts that are new or changed since its last
    (also a pass holding a key that is not a string)."""
    path = str(tmp_path / "h.sqlite")
    hosts = {"tcp://a:1": "n1"}
    h = History(path, lambda: dict(hosts))
    h.task(("t", 0), "t", "tcp://a:1", 1.0, 2.0, "memory", 8)
    assert h.flush()
    hosts.update({"tcp://a:1": "n1b", "tcp://b:1": "n2"})
    h.task("t-1", "t", "tcp://b:1", 1.0, 2.0, "memory", 8)
    h.close()
    with sqlite3.connect(path) as db:
        assert sorted(db.execute("select worker, host from hosts")) == \
            [("tcp://a:1", "n1b"), ("tcp://b:1", "n2")]
    db.close()
    _, rows = read(path)
    assert [(r[0], r[4]) for r in rows] == [("('t', 0)", "n1b"), ("t-1", "n2")]


def test_retries_are_counted_per_run_and_key_before_filters(tmp_path):
    path = str(tmp_path / "h.sqlite")
    for _ in range(2):
        h = History(path)
        h.task("a", "a", "tcp://w:1", 1.0, 2.0, "erred", 0)
        h.task("b", "b", "tcp://w:1", 1.0, 2.0, "memory", 8)
        h.elements("m", "tcp://w:1", ["a"], [3.0], [4.0], [8])  # its third attempt
        h.close()
    _, rows = read(path, group="m")
    assert [r[9] for r in rows] == [1, 1]  # in each run, after the erred "a"
    _, rows = read(path)
    assert [(r[0], r[9]) for r in rows] == [("a", 0), ("b", 0), ("a", 1)] * 2


def test_a_file_that_is_not_a_history_is_named(tmp_path):
    empty = tmp_path / "other.sqlite"
    with sqlite3.connect(empty) as db:
        db.execute("create table other (x)")
    db.close()
    with pytest.raises(ValueError, match="not a task history: it has neither a batches"):
        read(str(empty))
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(ValueError, match="garbage.sqlite is not a task history"):
        read(str(garbage))
    r = subprocess.run([sys.executable, "-m", "hpcsched", "history", str(garbage)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is not a task history" in r.stderr


def test_the_command_line_prints_filters_and_writes_csv(tmp_path):
    path = str(tmp_path / "h.sqlite")
    h = History(path)
    h.task("a-1", "a", "tcp://w:1", 1.0, 2.5, "memory", 1, 0.25, 3 << 20)
    h.task("b-1", "b", "tcp://w:2", 1.0, 2.0, "erred", 0)
    h.close()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hpcsched", "history", *args],
                              capture_output=True, text=True, timeout=60)

    table = run(path)
    assert table.returncode == 0 and "a-1" in table.stdout and "b-1" in table.stdout
    header, a_row = table.stdout.splitlines()[:2]
    assert header.split()[4:] == ["CPU", "PEAK", "MiB", "RETRIES", "OUTCOME"]
    assert a_row.split()[-5:] == ["1.500", "0.250", "3.0", "0", "memory"]
    assert "2 tasks" in table.stderr
    erred = run(path, "--outcome", "erred", "--csv")
    lines = erred.stdout.splitlines()
    assert lines[0].startswith("key,grp,job,worker") and len(lines) == 2
    assert lines[1].startswith("b-1,b,")
    missing = run(str(tmp_path / "nope.sqlite"))
    assert missing.returncode == 2 and "no task history" in missing.stderr


def test_a_file_of_an_older_version_gains_the_usage_columns(tmp_path):
    """A history written before rows had CPU and memory: read as it is (NULL there), and
    a scheduler appending to it adds the columns."""
    path = str(tmp_path / "h.sqlite")
    with sqlite3.connect(path) as db:
        db.execute("create table tasks (key text not null, grp text not null, job text, "
                   "worker text not null, host text, start real not null, stop real not null, "
                   "outcome text not null, nbytes integer, run text not null)")
        db.execute("insert into tasks values ('old-1', 'old', null, 'tcp://a:1', 'n1', 1.0, "
                   "2.0, 'memory', 8, 'r0')")
    db.close()
    columns, rows = read(path)
    assert rows == [("old-1", "old", None, "tcp://a:1", "n1", 1.0, 2.0, None, None, 0,
                     "memory", 8, "r0")] and columns[7:9] == ["cpu", "memory"]
    h = History(path, lambda: {"tcp://a:1": "n1"})
    h.task("new-1", "new", "tcp://a:1", 3.0, 4.0, "memory", 8, 0.5, 1 << 20)
    h.close()
    _, rows = read(path)
    assert [(r[0], r[4], r[7], r[8]) for r in rows] == [("old-1", "n1", None, None),
                                                        ("new-1", "n1", 0.5, 1 << 20)]


def test_a_file_and_a_spool_of_the_previous_format_are_read(tmp_path):
    """A history of the format with a row per task (its ``tasks`` and ``hosts`` tables, job
    and host left NULL), and the spool of its run killed before its writer wrote the last
    rows: the spooled rows it lacks are put in its table, once; a scheduler appends
    batches beside it; filters and retries see both."""
    import marshal
    import zlib

    from hpcsched.diagnostics.history import _FRAME

    path = str(tmp_path / "h.sqlite")
    with sqlite3.connect(path) as db:
        db.executescript("""
            create table tasks (key text not null, grp text not null, job text,
                worker text not null, host text, start real not null, stop real not null,
                outcome text not null, nbytes integer, run text not null, cpu real,
                memory integer);
            create table hosts (worker text primary key, host text);
            insert into hosts values ('tcp://a:1', 'n1');
            insert into tasks values ('hpcsched-job-4-x-0', 'hpcsched-job-4', null,
                'tcp://a:1', null, 1.0, 2.0, 'erred', 0, 'old', 0.5, 1048576);""")
    db.close()
    rows = [("hpcsched-job-4-x-0", "hpcsched-job-4", "tcp://a:1", 1.0, 2.0, "erred", 0, 0.5,
             1 << 20),  # in SQLite already
            ("hpcsched-job-4-x-0", "hpcsched-job-4", "tcp://a:1", 3.0, 4.0, "memory", 8, 0.5,
             1 << 20)]  # its retry: in the spool alone
    payload = marshal.dumps(("old", rows))
    with open(f"{path}.spool.old.1", "wb") as f:
        f.write(_FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
    h = History(path, lambda: {"tcp://a:1": "n1"})
    assert h.recovered == 1
    h.task("hpcsched-job-4-y-0", "hpcsched-job-4", "tcp://a:1", 5.0, 6.0, "memory", 8)
    h.close()
    columns, got = read(path, job="4")
    got = [dict(zip(columns, r, strict=True)) for r in got]
    assert [(g["key"], g["start"], g["retries"], g["outcome"], g["host"], g["job"])
            for g in got] == [("hpcsched-job-4-x-0", 1.0, 0, "erred", "n1", "4"),
                              ("hpcsched-job-4-x-0", 3.0, 1, "memory", "n1", "4"),
                              ("hpcsched-job-4-y-0", 5.0, 0, "memory", "n1", "4")]
    _, erred = read(path, outcome="erred")
    assert [r[5] for r in erred] == [1.0]
    _, first = read(path, limit=2)
    assert [r[5] for r in first] == [1.0, 3.0]
    assert not list(tmp_path.glob("h.sqlite.spool.*"))


def test_spooled_rows_reach_sqlite_once_after_the_writer_died(tmp_path, monkeypatch):
    """A scheduler killed between the spool and the writer's next flush: the next History
    on the file puts the rows that SQLite lacks there, once each, and drops a torn record."""
    from hpcsched.diagnostics import history

    path = str(tmp_path / "h.sqlite")
    monkeypatch.setattr(history, "FLUSH_SECONDS", 3600.0)  # the writer never gets to them
    dead = History(path, lambda: {})
    dead.spool()
    dead.task("t-0", "t", "tcp://a:1", 1.0, 2.0, "memory", 8)
    dead.elements("m", "tcp://a:1", ["m-0", "m-1"], [1.0, 2.0], [3.0, 4.0], [8, 8])
    dead.sync()
    assert dead.flush(10)  # these three reach SQLite as well as the spool
    dead.task("t-1", "t", "tcp://a:1", 5.0, 6.0, "erred", 0)
    dead.sync()  # spooled, never written by the writer
    (spool,) = (tmp_path).glob("h.sqlite.spool.*")
    with open(spool, "ab") as f:
        f.write(b"\x40\x00\x00\x00torn")  # a record cut short by the kill
    dead._frames.clear()  # the process is gone: its writer thread never writes them
    dead._spool_fd, fd = -1, dead._spool_fd
    os.close(fd)

    monkeypatch.setattr(history, "FLUSH_SECONDS", 0.5)
    again = History(path, lambda: {})
    assert again.recovered == 1
    again.close()
    dead.close()
    _, rows = read(path)
    assert sorted(r[0] for r in rows) == ["m-0", "m-1", "t-0", "t-1"]
    assert not list(tmp_path.glob("h.sqlite.spool.*"))


def test_a_killed_journaled_scheduler_loses_no_history_row(procs, tmp_path):
    """100,000 elements of a map and 200 single tasks, the scheduler SIGKILLed as soon as
    the client hears of the last ones, restarted on its journal: every task once."""
    from hpcsched import Client, wait
    from tests.conftest import wait_until
    from tests.launchers.procs import WORKER_OPTS, hpcsched_cmd, start_scheduler

    sfile, journal = tmp_path / "scheduler.json", tmp_path / "journal"
    sched = start_scheduler(procs, sfile, "--journal", str(journal))
    procs.start([*hpcsched_cmd(), "worker", "--scheduler-file", str(sfile), *WORKER_OPTS,
                 "--nworkers", "2"], "workers")
    with Client(scheduler_file=str(sfile), set_as_default=False, timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
        futures = [client.submit(inc, i, pure=False) for i in range(100)]
        futures += client.map(inc, range(100_000), pure=False)
        wait(futures, timeout=600)
        assert {f.status for f in futures} == {"finished"}
        keys = {str(f.key) for f in futures}
    with Client(scheduler_file=str(sfile), set_as_default=False, timeout=60) as client:
        last = [client.submit(inc, i, pure=False, key=f"last-{i}") for i in range(100)]
        # their rows are made as the client hears of them: killed right after, well within
        # the history writer's flush period, they are in the spool alone
        wait(last, timeout=120)
        os.kill(sched.pid, signal.SIGKILL)
        assert {f.status for f in last} == {"finished"}
        keys |= {str(f.key) for f in last}
    sched.wait(30)
    sfile.unlink()
    procs.start([*hpcsched_cmd(), "scheduler", "--host", "127.0.0.1", "--port", "0",
                 "--scheduler-file", str(sfile), "--journal", str(journal)], "scheduler2")
    wait_until(sfile.exists, timeout=60, what="the restarted scheduler")
    r = subprocess.run([*hpcsched_cmd(), "history", "--journal", str(journal), "--csv"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    listed = [row["key"] for row in rows]
    assert len(listed) == len(set(listed)), "a task listed twice"
    assert set(listed) == keys, f"{len(keys - set(listed))} tasks missing"
    assert all(row["worker"].startswith("tcp://") and float(row["stop"]) >= float(row["start"])
               for row in rows)
    # peak memory: the worker's RSS as sampled (Python tasks); CPU seconds and retries
    assert all(int(row["memory"]) > 0 and float(row["cpu"]) >= 0.0 and row["retries"] == "0"
               for row in rows)
