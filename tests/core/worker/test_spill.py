"""The spill buffer's own contract, beyond the worker's use in test_memory.py: what moves
between memory and disk, its figures, and results written or read while other threads
store, read and delete (task threads, peer readers and the loop share it)."""

from __future__ import annotations

import os
import threading

import pytest

from hpcsched.core.worker.spill import SpillBuffer


@pytest.fixture
def buffer(tmp_path):
    buf = SpillBuffer(str(tmp_path), target=250)
    yield buf
    buf.close()


def files(buf: SpillBuffer) -> list[str]:
    return os.listdir(buf.directory)


def test_lowering_target_spills_at_once_and_counts(buffer):
    for k in "abc":
        buffer.store(k, k.encode() * 80, 80)
    assert buffer.spilled == set() and buffer.memory_bytes == 240
    buffer.target = 100  # a, then b (least recently used first) go now
    assert buffer.spilled == {"a", "b"} and buffer.memory_bytes == 80
    assert buffer.disk_bytes == 160 and len(files(buffer)) == 2
    assert (buffer.spill_count, buffer.spilled_bytes_total, buffer.unspill_count) == (2, 160, 0)
    buffer.target = 1000
    assert buffer["a"] == b"a" * 80 and buffer.unspill_count == 1
    assert buffer.spilled == {"b"} and buffer.memory_bytes == 160 and len(files(buffer)) == 1


def test_reading_makes_a_result_most_recently_used(buffer):
    buffer.store("a", b"a", 100)
    buffer.store("b", b"b", 100)
    assert buffer["a"] == b"a"  # now b is the least recently used
    buffer.store("c", b"c", 100)
    assert buffer.spilled == {"b"}


def test_a_result_heavier_than_target_goes_alone(buffer):
    buffer.store("a", b"a", 100)
    buffer.store("big", b"x" * 10, 300)
    assert buffer.spilled == {"big"} and buffer.memory_bytes == 100
    assert buffer["big"] == b"x" * 10  # read from disk, not loaded back: it would not fit
    assert buffer.spilled == {"big"} and buffer.unspill_count == 1


def test_pop_reads_a_spilled_result_without_loading_it_back(buffer):
    for k in "abc":
        buffer.store(k, k.encode(), 100)
    assert buffer.spilled == {"a"}
    assert buffer.pop("a") == b"a" and "a" not in buffer and files(buffer) == []
    assert buffer.spilled == set() and buffer.unspill_count == 0
    assert buffer.pop("a", None) is None and buffer.pop("b") == b"b"
    with pytest.raises(KeyError):
        buffer.pop("a")
    assert buffer.memory_bytes == 100 and len(buffer) == 1 and list(buffer) == ["c"]


@pytest.mark.timeout(30)
def test_many_results_are_served_and_dropped_at_once_wherever_they_are(buffer):
    """peek_many and discard_many (a bulk map's results: many keys, one lock) do what peek
    and del do key by key: a spilled result is read without being loaded back, and
    dropped with its file; an absent key is missing, or ignored. store_many stores as
    store does key by key, also a key stored already or twice."""
    buffer.store_many(["a", "b", "c"], [b"a", b"b", b"c"], [100, 100, 100])
    assert buffer.spilled == {"a"} and buffer.memory_bytes == 200
    out: dict = {}
    missing: list = []
    buffer.peek_many(["c", "a", "zz", "b"], out, missing)
    assert out == {"c": b"c", "a": b"a", "b": b"b"} and missing == ["zz"]
    assert buffer.spilled == {"a"} and buffer.unspill_count == 0
    buffer.discard_many(["a", "b", "zz"])
    assert list(buffer) == ["c"] and files(buffer) == [] and buffer.spilled == set()
    assert buffer.memory_bytes == 100 and buffer.disk_bytes == 0
    buffer.store_many(["c", "d", "d"], [b"C", b"x", b"d"], [50, 0, 60])
    assert buffer["c"] == b"C" and buffer["d"] == b"d" and buffer.memory_bytes == 110


def test_mapping_interface_measures_what_it_is_given(buffer):
    buffer["a"] = b"x" * 1000  # sizeof > target: on disk at once
    assert buffer.spilled == {"a"} and buffer.disk_bytes >= 1000
    buffer["a"] = 1  # replaced: the file goes
    assert buffer.spilled == set() and files(buffer) == [] and buffer["a"] == 1
    del buffer["a"]
    assert len(buffer) == 0 and buffer.memory_bytes == 0
    with pytest.raises(KeyError):
        del buffer["a"]
    with pytest.raises(KeyError):
        buffer.peek("a")


def test_a_failed_write_keeps_the_result_and_the_next_spill_tries_another(buffer):
    buffer.store("a", b"a" * 100, 100)
    buffer.store("b", b"b" * 100, 100)
    os.rmdir(buffer.directory)  # as a full disk: no file can be created there (even by root)
    with open(buffer.directory, "w"):
        pass
    buffer.store("c", b"c" * 100, 100)
    assert buffer.spilled == set() and buffer.memory_bytes == 300
    os.remove(buffer.directory)
    os.mkdir(buffer.directory)
    buffer.store("d", b"d" * 100, 100)  # a went back as most recently used: b goes first
    assert buffer.spilled == {"b", "c"} and buffer.memory_bytes == 200
    assert [buffer[k] for k in "abcd"] == [k.encode() * 100 for k in "abcd"]


class Gate:
    """A value whose pickling waits: its file is being written until ``release``."""

    def __init__(self):
        self.writing = threading.Event()
        self.release = threading.Event()
        self.thread: threading.Thread | None = None

    def __reduce__(self):
        self.writing.set()
        assert self.release.wait(10)
        return (bytes, (b"gate",))

    def finish(self):
        self.release.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def writing(buffer):
    """A result heavier than target being written to disk by another thread."""
    gate = Gate()
    t = gate.thread = threading.Thread(target=buffer.store, args=("g", gate, 300))
    t.start()
    assert gate.writing.wait(10)
    yield gate
    gate.finish()


def test_a_result_being_written_is_readable_meanwhile(buffer, writing):
    assert buffer["g"] is writing and buffer.peek("g") is writing and "g" in buffer
    assert buffer.memory_bytes == 300 and buffer.spilled == set()
    buffer.store("a", b"a", 10)  # the loop stores meanwhile: no wait on the disk
    assert buffer["a"] == b"a"


def test_a_result_deleted_while_written_leaves_no_file(buffer, writing):
    del buffer["g"]
    writing.finish()
    assert buffer.spill_count == 0 and files(buffer) == []
    assert "g" not in buffer and buffer.memory_bytes == 0 and buffer.spilled == set()


def test_a_result_replaced_while_written_keeps_the_new_value(buffer, writing):
    buffer.store("g", b"new", 10)
    writing.finish()
    assert files(buffer) == []
    assert buffer["g"] == b"new" and buffer.spilled == set() and buffer.memory_bytes == 10


def test_readers_and_writers_in_threads_lose_nothing(tmp_path):
    """A task thread and a peer reader read (loading back, peeking) while the loop stores
    and deletes: every result stays readable with its value, the figures add up, and no
    file is left for a key in memory or deleted."""
    buf = SpillBuffer(str(tmp_path), target=2000)
    n = 400
    errors: list[BaseException] = []
    stored = [0]  # how many the loop stored
    progress = threading.Condition()

    def value(i: int) -> bytes:
        return i.to_bytes(4, "little") * 25

    def loop():
        for i in range(n):
            buf.store(str(i), value(i), 100)
            if i % 7 == 6:
                del buf[str(i - 3)]
            with progress:
                stored[0] = i + 1
                progress.notify_all()

    def reader(get):
        try:
            for i in range(n):
                with progress:
                    assert progress.wait_for(lambda i=i: stored[0] > i, timeout=10)
                for j in (i, i // 2, i // 3):
                    try:
                        v = get(str(j))
                    except KeyError:
                        assert j % 7 == 3  # deleted ones only
                        continue
                    assert v == value(j)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    threads = [threading.Thread(target=loop),
               threading.Thread(target=reader, args=(buf.__getitem__,)),
               threading.Thread(target=reader, args=(buf.peek,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not any(t.is_alive() for t in threads) and errors == []
        kept = [i for i in range(n) if not (i % 7 == 3 and i + 3 < n)]
        assert sorted(buf, key=int) == [str(i) for i in kept] and len(buf) == len(kept)
        assert all(buf.peek(str(i)) == value(i) for i in kept)
        assert 0 < len(buf.spilled) and buf.unspill_count > 0
        assert buf.memory_bytes <= 2000 and buf.memory_bytes + buf.disk_bytes == 100 * len(kept)
        assert len(files(buf)) == len(buf.spilled) == buf.disk_bytes // 100
    finally:
        buf.close()


def test_its_directory_is_made_by_the_first_spill_and_removed_at_close(tmp_path):
    buf = SpillBuffer(str(tmp_path / "spill"), target=100)
    try:
        buf.store("a", b"a" * 80, 80)
        assert os.listdir(tmp_path / "spill") == []  # nothing spilled: nothing made
        buf.store("b", b"b" * 80, 80)  # a goes to disk
        (own,) = os.listdir(tmp_path / "spill")
        assert own.startswith("hpcsched-spill-") and buf.spilled == {"a"}
    finally:
        buf.close()
    assert os.listdir(tmp_path / "spill") == []
    unused = SpillBuffer(str(tmp_path / "spill"), target=100)
    unused.close()
    with pytest.raises(ValueError, match="closed"):
        unused.directory  # noqa: B018 - a closed buffer makes no directory any more
    assert os.listdir(tmp_path / "spill") == []


def test_a_directory_it_cannot_use_is_an_error_at_once(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError):
        SpillBuffer(str(tmp_path / "a-file"), target=100)
