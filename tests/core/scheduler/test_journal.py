"""The scheduler's journal as a file: records survive a reopen, a torn last record is
ignored (also inside the one write of a loop's turn), compaction keeps the file bounded by
the live state, another version is refused with an error naming it, and a client hears of
its submission only once the journal holds it. (The restart of a real scheduler:
tests/launchers/test_restart.py.)
"""

from __future__ import annotations

import os
import struct
from operator import add

import pytest

from hpcsched import Client, LocalCluster
from hpcsched.core import config
from hpcsched.core.comm.base import Security
from hpcsched.core.comm.loop import Loop
from hpcsched.core.protocol import messages as pr
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.scheduler.journal import (
    HEADER,
    MAGIC,
    RECORD,
    VERSION,
    Journal,
    JournalError,
    read_records,
)
from hpcsched.core.scheduler.server import Scheduler
from tests.conftest import wait_until, worker_env


def graph(*keys: str, deps: dict | None = None, client: str = "c") -> pr.UpdateGraph:
    deps = deps or {}
    return pr.UpdateGraph(client, {k: {"run_spec": RunSpec(b"f" * 20, b"args"),
                                       "deps": deps.get(k, [])} for k in keys}, list(keys))


def release(*keys: str, client: str = "c") -> pr.ClientReleasesKeys:
    return pr.ClientReleasesKeys(client, list(keys))


@pytest.mark.timeout(30)
def test_records_survive_a_reopen_and_restore_rebuilds_what_clients_want(tmp_path):
    path = str(tmp_path / "j")
    j = Journal(path)
    j.set_meta({"address": "tcp://127.0.0.1:9999", "secret": "ab"})
    j.append("c1", graph("x", "y", deps={"y": ["x"]}, client="c1"))
    j.append("c1", release("x", client="c1"))  # y still needs x: x stays
    j.append("c2", graph("z", client="c2"))
    j.append("c2", release("z", client="c2"))  # nobody needs z: it goes
    j.sync()
    j.close()
    again = Journal(path)
    assert again.restored and again.meta["address"] == "tcp://127.0.0.1:9999"
    assert again.live_keys() == {"x", "y"}
    msgs = list(again.restore_messages())
    kinds = [(client, type(r)) for client, r in msgs]
    assert kinds[0][1] is pr.UpdateGraph and set(msgs[0][1].tasks) == {"x", "y"}
    assert ("c1", pr.ClientDesiresKeys) in kinds and all(c != "c2" for c, _ in kinds)
    desire = next(r for c, r in msgs if c == "c1")
    assert desire.keys == ["y"] and desire.client == "c1"
    assert kinds[-1][1] is pr.ClientReleasesKeys  # the restore lets go of what it held
    again.close()


@pytest.mark.timeout(30)
def test_a_bulk_map_comes_back_as_tasks_of_the_same_keys(tmp_path):
    path = str(tmp_path / "j")
    j = Journal(path)
    for offset in (0, 3):  # two blocks of one map
        j.append("c1", pr.UpdateMap("c1", prefix="f-tok-", function=b"fn",
                                    args=[b"a%d" % i for i in range(offset, offset + 3)],
                                    offset=offset, retries=2))
    j.append("c1", release("f-tok-4", client="c1"))
    j.sync()
    j.close()
    again = Journal(path)
    msgs = list(again.restore_messages())
    update = msgs[0][1]
    assert set(update.tasks) == {f"f-tok-{i}" for i in (0, 1, 2, 3, 5)}
    assert update.tasks["f-tok-5"]["run_spec"] == RunSpec(b"fn", b"a5")
    assert update.annotations["retries"]["f-tok-0"] == 2
    desire = next(r for c, r in msgs if c == "c1")
    assert "f-tok-4" not in desire.keys and "f-tok-5" in desire.keys
    again.close()


@pytest.mark.timeout(30)
def test_a_torn_last_record_is_ignored_and_cut_before_the_next_append(tmp_path):
    path = str(tmp_path / "j")
    j = Journal(path)
    j.append("c", graph("a"))
    j.append("c", graph("b"))
    j.sync()
    j.close()
    whole = os.path.getsize(path)
    records, end = read_records(path)
    assert len(records) == 2 and end == whole
    with open(path, "r+b") as f:  # the process died in the middle of the second record
        f.truncate(whole - 7)
    records, end = read_records(path)
    assert len(records) == 1 and end < whole - 7
    j = Journal(path)
    assert j.live_keys() == {"a"}
    j.append("c", graph("c"))
    j.sync()
    j.close()
    assert Journal(path).live_keys() == {"a", "c"}  # the torn bytes did not break what follows


@pytest.mark.timeout(30)
def test_a_corrupt_record_ends_the_journal_there(tmp_path):
    path = str(tmp_path / "j")
    j = Journal(path)
    j.append("c", graph("a"))
    j.append("c", graph("b"))
    j.close()
    with open(path, "r+b") as f:  # flip a byte of the last record's payload
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert Journal(path).live_keys() == {"a"}


@pytest.mark.timeout(120)
def test_100000_submissions_with_compaction_keep_the_file_bounded(tmp_path):
    path = str(tmp_path / "j")
    limit = 256 * 1024
    j = Journal(path, compact_bytes=limit)
    kept = []
    largest = 0
    for i in range(100_000):
        key = f"inc-{i}"
        j.append("c", graph(key))
        if i % 1000 == 0:
            kept.append(key)  # one in a thousand stays wanted
        else:
            j.append("c", release(key))
        if i % 10 == 0:
            j.sync()  # a turn of the scheduler's loop
            largest = max(largest, os.path.getsize(path))
    j.sync()
    assert j.compactions > 10
    # bounded: the threshold, plus at most one turn's records beyond it
    assert largest < limit + 4096, largest
    assert os.path.getsize(path) < limit + 4096
    j.close()
    assert Journal(path).live_keys() == set(kept)
    assert not os.path.exists(path + ".compact")


@pytest.mark.timeout(30)
def test_another_version_is_refused_with_an_error_naming_it(tmp_path):
    path = str(tmp_path / "j")
    with open(path, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION + 1))
    with pytest.raises(JournalError, match=f"version {VERSION + 1}.*reads version {VERSION}"):
        Journal(path)
    other = str(tmp_path / "not-a-journal")
    with open(other, "wb") as f:
        f.write(struct.pack("<16sI", b"something else!!", 1))
    with pytest.raises(JournalError, match="not an hpcsched journal"):
        Journal(other)


@pytest.mark.timeout(30)
def test_the_journal_is_private_to_its_user(tmp_path):
    path = str(tmp_path / "j")
    Journal(path).close()  # it holds the cluster's secret and the users' code
    assert os.stat(path).st_mode & 0o077 == 0


@pytest.mark.timeout(30)
def test_a_section_keeps_its_latest_value_across_reopens_and_compactions(tmp_path):
    """What a component above the scheduler keeps (a batch cluster's jobs): the latest
    value of each named section, whatever was written before it; None removes it."""
    path = str(tmp_path / "j")
    j = Journal(path)
    j.set_section("jobqueue", {"jobs": ["1"], "target_jobs": 1})
    j.set_section("jobqueue", {"jobs": ["1", "2"], "target_jobs": 2})
    j.set_section("other", [1, 2, 3])
    j.sync()
    size = os.path.getsize(path)
    j.set_section("jobqueue", {"jobs": ["1", "2"], "target_jobs": 2})  # unchanged: no record
    j.sync()
    assert os.path.getsize(path) == size
    j.close()
    again = Journal(path)
    assert again.sections == {"jobqueue": {"jobs": ["1", "2"], "target_jobs": 2},
                              "other": [1, 2, 3]}
    again.set_section("other", None)
    again.compact()
    again.close()
    assert Journal(path).sections == {"jobqueue": {"jobs": ["1", "2"], "target_jobs": 2}}


def record_spans(path: str) -> list[tuple[int, int]]:
    """(start, end) of each record of the journal at ``path``, as the file holds them."""
    with open(path, "rb") as f:
        data = f.read()
    spans, pos = [], HEADER.size
    while pos + RECORD.size <= len(data):
        length, _ = RECORD.unpack_from(data, pos)
        spans.append((pos, pos + RECORD.size + length))
        pos += RECORD.size + length
    return spans


@pytest.mark.timeout(30)
def test_a_turn_is_one_write_and_a_tear_inside_it_keeps_the_records_before(tmp_path,
                                                                          monkeypatch):
    path = str(tmp_path / "j")
    j = Journal(path)
    j.append("c", graph("a"))
    j.sync()
    writes: list[int] = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(len(data)) or
                        real_write(fd, data))
    j.append("c", graph("b"))
    j.append("c", graph("c", deps={"c": ["b"]}))
    j.append("c", release("b"))
    j.sync()  # the scheduler's loop: one turn's records, one write
    monkeypatch.undo()
    j.close()
    assert len(writes) == 1
    spans = record_spans(path)
    assert len(spans) == 4 and writes[0] == spans[-1][1] - spans[1][0]
    # killed in the middle of that write: in the second record's header, at the start of its
    # payload, one byte short of its end -- what came before it stays, it and what follows
    # are gone
    second = spans[2]
    for cut in (second[0] + 3, second[0] + RECORD.size, second[0] + RECORD.size + 1,
                second[1] - 1):
        torn = str(tmp_path / f"torn-{cut}")
        with open(path, "rb") as f, open(torn, "wb") as g:
            g.write(f.read(cut))
        records, end = read_records(torn)
        assert len(records) == 2 and end == second[0], cut
        again = Journal(torn)
        assert again.live_keys() == {"a", "b"}
        again.append("c", graph("d"))
        again.close()
        assert Journal(torn).live_keys() == {"a", "b", "d"}  # appended after the cut


@pytest.mark.timeout(120)
def test_a_client_hears_of_its_submission_only_once_the_journal_holds_it(tmp_path):
    """Each message the scheduler sends a client about a key finds the graph in which that
    client submitted the key in the file already (written to the operating system, and with
    ``scheduler.journal-fsync`` synced to the disk, before the send) -- also when the answer
    leaves in the very turn that handled the graph (a second client submitting keys that are
    in memory already)."""
    path = str(tmp_path / "journal")
    synced: list[int] = []
    seen: list[tuple[str, str, bool, bool]] = []  # (client, key, in the file, synced) at sends
    with config.set({"scheduler.extensions": [], "scheduler.journal-fsync": True}), \
            LocalCluster(n_workers=1, threads_per_worker=1, scheduler_journal=path,
                         worker_env=worker_env()) as cluster, \
            Client(cluster, set_as_default=False) as first, \
            Client(cluster, set_as_default=False) as second:
        scheduler = cluster.scheduler
        fsync = os.fsync
        comms = scheduler.loop.call(lambda: {c: scheduler.connections.comms[c]
                                             for c in (first.id, second.id)})
        sends = {c: comm.send for c, comm in comms.items()}

        def observer(client_id):
            def observe(msgs):
                for m in msgs if isinstance(msgs, list) else [msgs]:
                    key = m.get("key") if isinstance(m, dict) else getattr(m, "key", None)
                    if isinstance(key, str) and key.startswith("sum-"):
                        journaled = {k for rec in read_records(path)[0]
                                     if rec[0] == "msg" and rec[1] == client_id
                                     for k in (rec[2].get("tasks") or {})}
                        seen.append((client_id, key, key in journaled,
                                     os.path.getsize(path) in synced))
                return sends[client_id](msgs)
            return observe

        def counted_fsync(fd):
            fsync(fd)
            synced.append(os.fstat(fd).st_size)

        for client_id, comm in comms.items():
            comm.send = observer(client_id)
        os.fsync = counted_fsync
        try:
            for client in (first, second):  # the second's keys are in memory already
                futures = [client.submit(add, i, 1, key=f"sum-{i}") for i in range(20)]
                assert client.gather(futures) == [i + 1 for i in range(20)]
            wait_until(lambda: len({(c, k) for c, k, _, _ in seen}) == 40, timeout=30,
                       what="a message about each key to each client")
        finally:
            os.fsync = fsync
            for client_id, comm in comms.items():
                comm.send = sends[client_id]
    assert all(in_file and was_synced for _, _, in_file, was_synced in seen), seen


@pytest.mark.timeout(300)
@pytest.mark.parametrize("road,n", [("bulk", 100_000), ("tasks", 20_000)])
def test_a_restore_longer_than_the_bound_of_brief_calls_still_starts_the_scheduler(
        tmp_path, monkeypatch, road, n):
    """A restore lasts as long as its journal is large (and the node busy): the scheduler's
    start waits for it without the bound that brief calls on its loop have. That bound is
    set far below the restore's duration here, as a large journal on a loaded node makes
    it; the restore of a bulk map (made tasks again) and of single tasks both succeed."""
    path = str(tmp_path / "j")
    j = Journal(path)
    if road == "bulk":
        block = 10_000
        for offset in range(0, n, block):
            j.append("c1", pr.UpdateMap("c1", prefix="f-tok-", function=b"fn",
                                        args=[b"a%d" % i for i in range(offset, offset + block)],
                                        offset=offset))
    else:
        j.append("c1", graph(*(f"inc-{i}" for i in range(n)), client="c1"))
    j.sync()
    j.close()
    brief = 0.01  # seconds: far below what restoring n tasks takes
    monkeypatch.setattr(Loop.call, "__defaults__", (brief,))
    with config.set({"scheduler.extensions": []}):
        scheduler = Scheduler("tcp://127.0.0.1:0", Security.generate(), journal=path,
                              dashboard_address=None)
        try:
            scheduler.start()
            monkeypatch.undo()
            assert scheduler.call(lambda s: len(s.state.tasks), timeout=60) == n
        finally:
            monkeypatch.undo()
            scheduler.close()
