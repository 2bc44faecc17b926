"""The scheduler's journal: what a restarted scheduler cannot learn from its workers.

A journaled scheduler (``hpcsched scheduler --journal J``, ``scheduler.journal``)
appends here every client message that changes which tasks exist or who wants
them -- submitted graphs (keys, run specs as the pickled bytes they arrived as,
dependencies, annotations), desires, releases, cancellations, published
datasets -- and the departure of clients. Restarted with the same journal, it
rebuilds that state (:meth:`Journal.restore_messages`) and listens at the
address, with the secret, it had (:attr:`Journal.meta`); workers then report the
results they still hold, and only what nobody holds runs again.

The file::

    b"HPCSCHED-JOURNAL"  version:uint32
    record*   where a record is  length:uint32  crc32:uint32  payload[length]

Each payload is one pickled tuple of plain data: the wire dicts as they arrived, whose
task blobs are bytes already (pickled as they are; a key that the plain pickler refuses
goes through :func:`~hpcsched.core.protocol.serialize.dumps_object`). (Not marshal, though
it is several times faster: it writes any object that exposes a buffer -- a numpy number
in an annotation, a ``bytearray`` -- as ``bytes``, and a restart would get back other values.)
Records are appended, never changed; a record whose length runs past the end of the
file or whose checksum is wrong ends the journal (a process killed in the middle of
a write leaves a torn last record: it is ignored, and cut off before the next append).

Writes are buffered for one turn of the scheduler's loop and written by :meth:`sync`,
in one ``write`` however many records the turn made, which the server calls before it
sends that turn's messages: no client hears of a submission before the journal holds it
(in the operating system's hands: a process killed after the write loses nothing).
``scheduler.journal-fsync`` adds an ``os.fsync`` there (survives the machine's crash, not
only the process's).

The workers that join and leave are recorded too: a restarted scheduler waits (a
little) for those it had before it gives out work.

Beside the client messages, plain data is kept here under names (:meth:`Journal.set_section`):
the coordination primitives' state (:mod:`.primitives`), and, for a component above
the scheduler, a batch cluster's jobs and its scale and adapt settings. The latest value
of each section survives restarts and compactions; the keys a section holds (futures
stored in a variable or a queue) stay live, with what they depend on.

The journal keeps, beside the file, a model of the live state it describes (each
task's spec, each client's wanted keys, the datasets, the workers): when the file has grown past
twice its size after the last compaction (and past ``compact_bytes``), it is rewritten
from that model -- one graph of the tasks some client or dataset still needs, the
desires, the datasets -- so its size stays bounded by the live state, however many
graphs come and go.
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import zlib
from collections.abc import Iterator
from typing import Any

from hpcsched.core.protocol import messages as pr
from hpcsched.core.protocol.primitives import DatasetPublish, DatasetUnpublish
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.protocol.serialize import dumps_object, loads_object

logger = logging.getLogger("hpcsched.scheduler")

MAGIC = b"HPCSCHED-JOURNAL"
VERSION = 1
HEADER = struct.Struct("<16sI")
RECORD = struct.Struct("<II")
MAX_RECORD = 2**31  # a length past this is garbage, not a record

#: the client records journaled (as the wire dicts they arrived as)
JOURNALED = frozenset({pr.UpdateGraph, pr.UpdateMap, pr.ClientDesiresKeys,
                       pr.ClientReleasesKeys, pr.CancelKeys, DatasetPublish, DatasetUnpublish})
FIRE_AND_FORGET = "fire-and-forget"  # the pseudo-client wanting fire-and-forget keys
#: the call-wide fields of ``update-graph`` that become per-key annotations when graphs merge
_CALL_WIDE = ("priority", "resources", "workers", "allow_other_workers")


class JournalError(RuntimeError):
    """A journal that this hpcsched cannot read (another version, not a journal)."""


def read_records(path: str) -> tuple[list[Any], int]:
    """The records of the journal at ``path`` and the offset where the intact part ends
    (a torn or corrupt last record is left out)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER.size:
        if MAGIC.startswith(data[:len(MAGIC)]):
            return [], 0  # killed while writing the header: an empty journal
        raise JournalError(f"{path} is not an hpcsched journal")
    magic, version = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise JournalError(f"{path} is not an hpcsched journal")
    if version != VERSION:
        raise JournalError(f"journal {path} is version {version}; this hpcsched reads "
                           f"version {VERSION} (finish or discard that campaign with the "
                           "hpcsched that wrote it, or start with a new journal)")
    out: list[Any] = []
    pos = HEADER.size
    while pos + RECORD.size <= len(data):
        length, crc = RECORD.unpack_from(data, pos)
        start = pos + RECORD.size
        end = start + length
        if length > MAX_RECORD or end > len(data):
            break
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            break
        pos = end
        try:
            out.append(loads_object(payload))
        except Exception as e:  # intact, but names what this process cannot import
            logger.warning("journal %s: skipping a record that does not load: %s", path, e)
    return out, pos


def _frame(record: Any) -> tuple[bytes, bytes]:
    """``record`` as the two parts of one record (header, payload), written together."""
    try:
        payload = pickle.dumps(record, protocol=5)
    except Exception:  # a key of a class only cloudpickle can carry
        payload = dumps_object(record)
    return RECORD.pack(len(payload), zlib.crc32(payload)), payload


class Journal:
    """An open journal at ``path`` (created if missing); see the module docstring.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "j")
    >>> j = Journal(path)
    >>> j.set_meta({"address": "tcp://127.0.0.1:8786"})
    >>> j.append("client-1", pr.ClientDesiresKeys("client-1", ["x"]))
    >>> j.sync(); j.close()
    >>> Journal(path).meta["address"]
    'tcp://127.0.0.1:8786'
    """

    def __init__(self, path: str, fsync: bool = False, compact_bytes: int = 64 * 2**20):
        self.path = path
        self.fsync = fsync
        self.compact_bytes = compact_bytes
        self.meta: dict = {}
        #: the live state: key -> task spec, key -> {annotation: value}, client -> keys
        self.tasks: dict[Any, dict] = {}
        self.annotations: dict[Any, dict] = {}
        self.wants: dict[str, set] = {}
        self.datasets: dict[str, Any] = {}  # name -> its DatasetPublish record
        self.workers: set[str] = set()  # addresses of the workers connected
        self.sections: dict[str, Any] = {}  # name -> the latest value set_section gave it
        self.section_keys: dict[str, list] = {}  # name -> the keys that section holds
        self.compactions = 0
        self._pending: list[bytes] = []  # the parts of the records sync() writes next
        records: list[Any] = []
        end = 0
        if os.path.exists(path) and os.path.getsize(path) > 0:
            records, end = read_records(path)
        for rec in records:
            self._apply(rec)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._fd = fd
        if end == 0:  # new (or only a torn header): write the header
            os.ftruncate(fd, 0)
            os.write(fd, HEADER.pack(MAGIC, VERSION))
            end = HEADER.size
        else:
            os.ftruncate(fd, end)  # a torn last record goes before anything follows it
        os.lseek(fd, end, os.SEEK_SET)
        self.size = end
        self._compacted_size = end
        self.restored = bool(records)

    # ------------------------------------------------------------ writing
    def set_meta(self, meta: dict) -> None:
        """Record the scheduler's address and secret (what a restart listens with)."""
        self.meta = dict(meta)
        self._write(("meta", self.meta))

    def append(self, client: str, record: Any, wire: dict | None = None) -> None:
        """Record ``record`` (one of :data:`JOURNALED`), which the scheduler accepted from
        ``client``; ``wire``: the dict it arrived as (else it is encoded here)."""
        self._apply_record(client, record)
        self._write(("msg", client, pr.encode(record) if wire is None else wire))

    def set_section(self, name: str, value: Any, keys: list | None = None) -> None:
        """Keep ``value`` (plain, picklable data) under ``name`` in place of what was there;
        None removes it. ``keys``: the task keys it holds (they stay live). Written at the
        next :meth:`sync`."""
        keys = list(keys or ())
        if self.sections.get(name) == value and self.section_keys.get(name, []) == keys:
            return
        rec = ("section", name, value, keys)
        self._apply(rec)
        self._write(rec)

    def worker_joined(self, address: str) -> None:
        rec = ("worker", address, True)
        self._apply(rec)
        self._write(rec)

    def worker_left(self, address: str) -> None:
        if address in self.workers:
            rec = ("worker", address, False)
            self._apply(rec)
            self._write(rec)

    def client_gone(self, client: str) -> None:
        """``client`` left: it wants nothing any more."""
        if client in self.wants:
            rec = ("gone", client)
            self._apply(rec)
            self._write(rec)

    def _write(self, rec: Any) -> None:
        self._pending += _frame(rec)

    def sync(self) -> None:
        """Write what was recorded since the last call (and ``fsync`` if asked); compact
        when the file has grown too much."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending = []
        _write_all(self._fd, data)
        self.size += len(data)
        if self.fsync:
            os.fsync(self._fd)
        if self.size > max(self.compact_bytes, 2 * self._compacted_size):
            self.compact()

    def compact(self) -> None:
        """Rewrite the file from the live state (to a new file, then renamed over it)."""
        tmp = f"{self.path}.compact"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            parts = [HEADER.pack(MAGIC, VERSION)]
            if self.meta:
                parts += _frame(("meta", self.meta))
            for w in sorted(self.workers):
                parts += _frame(("worker", w, True))
            for n, v in sorted(self.sections.items()):
                parts += _frame(("section", n, v, self.section_keys.get(n, [])))
            for c, r in self.restore_messages():
                parts += _frame(("msg", c, pr.encode(r)))
            data = b"".join(parts)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR)
        os.lseek(self._fd, 0, os.SEEK_END)
        self.size = self._compacted_size = len(data)
        self.compactions += 1

    def close(self) -> None:
        """Write what is pending and close the file. The model of the tasks goes with it
        (a closed journal keeps its meta and sections only)."""
        self.sync()
        os.close(self._fd)
        self._fd = -1
        self.tasks, self.annotations, self.wants = {}, {}, {}

    # ------------------------------------------------------------ the live state
    def _apply(self, rec: Any) -> None:
        kind = rec[0]
        if kind == "meta":
            self.meta = dict(rec[1])
        elif kind == "gone":
            self.wants.pop(rec[1], None)
        elif kind == "section":
            if rec[2] is None:
                self.sections.pop(rec[1], None)
                self.section_keys.pop(rec[1], None)
            else:
                self.sections[rec[1]] = rec[2]
                self.section_keys[rec[1]] = list(rec[3]) if len(rec) > 3 else []
        elif kind == "worker":
            if rec[2]:
                self.workers.add(rec[1])
            else:
                self.workers.discard(rec[1])
        elif kind == "msg":
            record = pr.receive(pr.CLIENT_TO_SCHEDULER, rec[2], _restored, client=rec[1])
            self._apply_record(rec[1], record)

    def _apply_record(self, client: str, record: Any) -> None:
        cls = record.__class__
        if cls is pr.UpdateGraph:
            tasks = record.tasks
            self.tasks.update(tasks)
            self._annotate(tasks, {name: value for name in _CALL_WIDE
                                   if (value := getattr(record, name))},
                           record.retries, record.annotations)
            self.wants.setdefault(client, set()).update(record.keys)
        elif cls is pr.UpdateMap:
            # a bulk map's elements come back as tasks of their own (same keys, run specs)
            function, prefix = record.function, record.prefix
            elements = {f"{prefix}{i}": {"run_spec": RunSpec(function, blob), "deps": []}
                        for i, blob in enumerate(record.args, record.offset)}
            self.tasks.update(elements)
            call_wide = {"retries": record.retries} if record.retries else {}
            if record.priority:
                call_wide["priority"] = record.priority
            self._annotate(elements, call_wide, None, None)
            self.wants.setdefault(client, set()).update(elements)
        elif cls is pr.ClientDesiresKeys:
            who = FIRE_AND_FORGET if record.fire_and_forget else client
            self.wants.setdefault(who, set()).update(record.keys)
        elif cls is pr.ClientReleasesKeys:
            self.wants.get(client, set()).difference_update(record.keys)
        elif cls is pr.CancelKeys:  # cancelled for every client
            keys = set(record.keys)
            for wanted in self.wants.values():
                wanted -= keys
        elif cls is DatasetPublish:
            self.datasets[record.name] = record
        elif cls is DatasetUnpublish:
            self.datasets.pop(record.name, None)

    def _annotate(self, tasks: dict, call_wide: dict, retries: dict | None,
                  annotations: dict | None) -> None:
        """The annotations of the (re)submitted ``tasks`` are what this submission gives
        them: the call-wide ones, then their retries, then the per-key ones (in this
        order, later ones winning); a task given none has none. (The common graph has
        none at all: its keys cost one set operation here, not a loop.)"""
        anns = self.annotations
        if call_wide:
            for key in tasks:
                anns[key] = dict(call_wide)
        elif anns:
            for key in anns.keys() & tasks.keys():
                del anns[key]
        for name, per_key in ((("retries", retries),) if retries else ()) + \
                tuple((annotations or {}).items()):
            for key, value in per_key.items():
                if key in tasks:
                    ann = anns.get(key)
                    if ann is None:
                        ann = anns[key] = {}
                    ann[name] = value

    def live_keys(self) -> set:
        """The tasks some client or dataset still needs, with everything they depend on."""
        roots: set = set()
        for wanted in self.wants.values():
            roots |= wanted
        for published in self.datasets.values():
            roots.update(published.keys)
        for keys in self.section_keys.values():
            roots.update(keys)
        live: set = set()
        stack = [k for k in roots if k in self.tasks]
        while stack:
            key = stack.pop()
            if key in live:
                continue
            live.add(key)
            stack.extend(d for d in self.tasks[key].get("deps", ()) if d in self.tasks)
        return live

    def restore_messages(self) -> Iterator[tuple[str, Any]]:
        """The live state as ``(client, record)`` pairs that, handled in order by a fresh
        scheduler, rebuild it: one graph of every live task, each client's desires, the
        datasets. (Also what a compaction writes.)"""
        live = self.live_keys()
        # forget what nothing needs (bounded memory, as the file)
        for key in [k for k in self.tasks if k not in live]:
            del self.tasks[key]
            self.annotations.pop(key, None)
        for client in [c for c, w in self.wants.items() if not w]:
            del self.wants[client]
        if live:
            annotations: dict[str, dict] = {}
            for key in live:
                for name, value in self.annotations.get(key, {}).items():
                    annotations.setdefault(name, {})[key] = value
            # the restore holds every live key until the clients and datasets below say
            # which they want, then lets go (the last record): a task none of them wants
            # stays only while a dependent needs it
            yield (RESTORE_CLIENT, pr.UpdateGraph(
                RESTORE_CLIENT, {k: self.tasks[k] for k in live}, sorted(live, key=repr),
                annotations=annotations or None, stimulus_id=_restored("update-graph")))
        for client, keys in self.wants.items():
            keys = keys & live
            if not keys:
                continue
            fire_and_forget = client == FIRE_AND_FORGET
            owner = RESTORE_CLIENT if fire_and_forget else client
            yield (owner, pr.ClientDesiresKeys(owner, sorted(keys, key=repr), fire_and_forget,
                                               stimulus_id=_restored("client-desires-keys")))
        yield from ((RESTORE_CLIENT, published) for published in self.datasets.values())
        if live:
            yield (RESTORE_CLIENT, pr.ClientReleasesKeys(
                RESTORE_CLIENT, sorted(live, key=repr),
                stimulus_id=_restored("client-releases-keys")))

    @property
    def clients(self) -> list[str]:
        """The clients whose wanted keys the journal holds (they may come back)."""
        return [c for c in self.wants if c != FIRE_AND_FORGET]


#: the client id under which a restore submits the merged graph; it lets go of the
#: keys (the last record of :meth:`Journal.restore_messages`) once every real client, and
#: every section holding keys, has said what it wants
RESTORE_CLIENT = "journal-restore"


def _restored(op: str) -> str:
    """The stimulus id of the events a restore replays."""
    return f"journal-{op}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
