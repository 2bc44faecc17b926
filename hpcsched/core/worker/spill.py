"""The worker's data store when memory is managed: results that spill to local disk.

:class:`SpillBuffer` is a mapping (key -> result) in two tiers, as dask.distributed's
worker spill buffer: results in memory up to ``target`` bytes, least recently used
first out, and beyond that files in a directory on the node's local disk. A result
stored past ``target`` pushes the least recently used results to disk; reading a
spilled key loads it back (pushing others out), so a task, a peer's fetch or the
client's gather reads a spilled result as if it had never left.

The memory tier is ours, for speed: every task's result is stored, read and deleted
here, mostly far below ``target``, so that path is an insertion-ordered ``dict`` used
as the LRU (a read moves the key to the end), a running byte total and one
``threading.Lock``: a few dict operations a result, where ``zict.Buffer`` over
``zict.LRU`` takes a lock per layer, keeps an ordered set and a weight table of its
own and runs callbacks on every store, read and delete: much more work on this path
(``benchmarks/bench_spill_buffer.py`` compares them). The disk tier stays zict's, the
well-kept file store dask uses: ``zict.Func(_pack, _unpack, zict.File(directory))``
(zict's docs, https://zict.readthedocs.io: "File", "Func").

Threads: task threads read dependencies and peer readers serve fetches while the
loop stores results. The lock guards only the in-memory state, never disk I/O, as in
zict ("callbacks are not protected by locks and can be arbitrarily slow", zict's
``LRU`` notes): a result being written stays readable (it sits in ``_writing`` until
its file is complete), and a spilled result is read without the lock, then put back
in memory only if no other thread deleted, replaced or loaded it meanwhile (each
file has a generation number). One spill runs at a time (``_spill_lock``), so two
writers never race on one key's file. A failed write (disk full, unpicklable value)
puts the result back in memory, as the most recently used so that the next spill
tries another: nothing is lost.

Each result's size is the ``nbytes`` the worker measured once when the task
finished (:meth:`SpillBuffer.store`); it is not measured again.

Files are the frames of :func:`hpcsched.core.protocol.serialize.dumps` (pickle protocol
5, buffers out of band) behind a small header of frame lengths: a numpy array
is written and read back without a pickle copy of its data.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
from collections.abc import Iterator, MutableMapping
from itertools import count
from typing import Any

from hpcsched.core.protocol.serialize import dumps, loads, sizeof

logger = logging.getLogger("hpcsched.worker")

_LEN = struct.Struct("<Q")


def configured_directory(path: str | None = None) -> str | None:
    """Where a worker spills if it is said: ``path``, else ``worker.local-directory``."""
    from hpcsched.core import config
    from hpcsched.core.settings import WorkerSettings

    path = config.read(WorkerSettings, local_directory=path).local_directory
    return os.path.expandvars(os.path.expanduser(str(path))) if path else None


def local_directory(path: str | None = None) -> str:
    """Where a worker spills: ``path``, else ``worker.local-directory``, else the node's
    ``$TMPDIR`` (batch systems point it at node-local disk), else the system's temp dir."""
    configured = configured_directory(path)
    if configured is not None:
        return configured
    import tempfile  # here: tempfile imports shutil, bz2, lzma, random...

    return tempfile.gettempdir()


def _pack(value: Any) -> list:
    frames = dumps(value)
    head = _LEN.pack(len(frames)) + b"".join(_LEN.pack(memoryview(f).nbytes) for f in frames)
    return [head, *frames]


def _unpack(blob: bytes | bytearray | memoryview) -> Any:
    view = memoryview(blob)
    (n,) = _LEN.unpack_from(view, 0)
    sizes = [_LEN.unpack_from(view, 8 * (i + 1))[0] for i in range(n)]
    offset = 8 * (n + 1)
    frames = []
    for size in sizes:
        frames.append(view[offset:offset + size])
        offset += size
    return loads(frames)


_MISSING: Any = object()


class SpillBuffer(MutableMapping):
    """Results in memory up to ``target`` bytes, the least recently used beyond on disk.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> buf = SpillBuffer(d, target=100)
    >>> buf.store("a", b"x" * 80, 80)
    >>> buf.store("b", b"y" * 80, 80)   # a goes to disk
    >>> sorted(buf.spilled), buf["a"][:1]   # reading a brings it back (b goes out)
    (['a'], b'x')
    >>> sorted(buf.spilled)
    ['b']
    >>> buf.close()
    """

    def __init__(self, directory: str | None, target: float):
        """Spill under ``directory`` (None: the system's temp dir, see
        :func:`local_directory`), which must be writable (checked now: a worker that cannot
        spill says so at its start)."""
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            if not os.access(directory, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "cannot write there", directory)
        self._parent = directory
        self._directory: str | None = None  # our own, made by the first spill: see directory
        self._directory_lock = threading.Lock()
        self._closed = False
        self._target = target
        self._lock = threading.Lock()  # guards the dicts and totals below, never disk I/O
        self._spill_lock = threading.Lock()  # one writer at a time: taken before _lock
        self._nbytes: dict[Any, int] = {}  # every key's size, wherever its value is
        self._fast: dict[Any, Any] = {}  # in memory, least recently used first
        self._fast_bytes = 0
        self._writing: dict[Any, Any] = {}  # in memory, its file being written
        self._writing_bytes = 0
        self._slow_gen: dict[Any, int] = {}  # on disk: key -> generation of its file
        self._gen = count()
        self.spilled_bytes_total = 0  # written to disk since start
        self.spill_count = 0
        self.unspill_count = 0
        self._disk: MutableMapping | None = None  # made at the first spill: see _slow
        self._disk_lock = threading.Lock()

    # ---------------------------------------------------------------- the worker's use
    def store_many(self, keys: list, values: list, nbytes: list) -> None:
        """:meth:`store` of many results at once (the elements of a bulk map's range)."""
        over = False
        with self._lock:
            held, fast = self._nbytes, self._fast
            if keys and len(keys) == len(values) == len(nbytes) \
                    and set(map(type, nbytes)) == {int} and min(nbytes) >= 1:
                sizes = dict(zip(keys, nbytes, strict=True))
                if len(sizes) == len(keys) and held.keys().isdisjoint(sizes):
                    # the common case, in C loops: new keys, each once, sizes as they should be
                    held.update(sizes)
                    fast.update(zip(keys, values, strict=True))
                    self._fast_bytes += sum(nbytes)
                    keys = values = nbytes = []
            for key, value, size in zip(keys, values, nbytes, strict=True):
                n = max(int(size), 1)
                if key in held:
                    self._drop(key)
                held[key] = n
                fast[key] = value
                self._fast_bytes += n
            over = self._fast_bytes > self._target
        if over:
            self._spill_until_below_target(first=_MISSING)

    def store(self, key: Any, value: Any, nbytes: int) -> None:
        """Store a result whose size was measured already (once, when it was made)."""
        n = max(int(nbytes), 1)
        with self._lock:
            if key in self._nbytes:
                self._drop(key)
            self._nbytes[key] = n
            self._fast[key] = value
            self._fast_bytes += n
            over = self._fast_bytes > self._target
        if over:
            # a result heavier than target alone goes first, not everything else (as zict)
            self._spill_until_below_target(first=key if n > self._target else _MISSING)

    def peek(self, key: Any) -> Any:
        """The value of ``key`` without loading it back into memory for good: serving a
        spilled result to a peer or the client must not push out the results that local
        tasks are about to use."""
        while True:
            value, gen = self._find(key, touch=False)
            if gen is None:
                return value
            value = self._read_file(key, gen)
            if value is not _MISSING:
                return value

    def discard_many(self, keys: list) -> None:
        """Forget each of ``keys`` held here (others are ignored), under one lock: a bulk
        map's results are freed by the thousand."""
        with self._lock:
            fast, held = self._fast, self._nbytes
            freed = 0
            for key in keys:
                if key in fast:
                    del fast[key]
                    freed += held.pop(key)
                else:
                    self._drop(key)
            self._fast_bytes -= freed

    def peek_many(self, keys: list, out: dict, missing: list) -> None:
        """:meth:`peek` of each of ``keys`` into ``out`` (those held nowhere appended to
        ``missing``): those in memory under one lock, with no call per key (a bulk map's
        results are served by the thousand)."""
        fast, writing = self._fast, self._writing
        rest = []
        with self._lock:
            for key in keys:
                value = fast.get(key, _MISSING)
                if value is _MISSING:
                    value = writing.get(key, _MISSING)
                    if value is _MISSING:
                        rest.append(key)
                        continue
                out[key] = value
        for key in rest:
            try:
                out[key] = self.peek(key)
            except KeyError:
                missing.append(key)

    def evict(self, nbytes: int) -> int:
        """Spill least recently used results until ``nbytes`` went to disk (or none is
        left in memory); the bytes spilled."""
        done = 0
        with self._spill_lock:
            while done < nbytes:
                try:
                    n = self._spill_one(_MISSING)
                except Exception as e:  # noqa: BLE001 - kept in memory: nothing is lost
                    logger.warning("could not spill to %s: %s", self._where(), e)
                    break
                if n is None:
                    break
                done += n
        return done

    @property
    def memory_bytes(self) -> int:
        """Managed memory: bytes of results in memory."""
        return self._fast_bytes + self._writing_bytes

    @property
    def disk_bytes(self) -> int:
        with self._lock:
            return sum(self._nbytes[k] for k in self._slow_gen)

    @property
    def spilled(self) -> set:
        with self._lock:
            return set(self._slow_gen)

    @property
    def target(self) -> float:
        """Bytes of results kept in memory; setting it spills what is past it now."""
        return self._target

    @target.setter
    def target(self, nbytes: float) -> None:
        self._target = nbytes
        self._spill_until_below_target()

    def close(self) -> None:
        with self._lock:
            self._fast.clear()
            self._writing.clear()
            self._slow_gen.clear()
            self._nbytes.clear()
            self._fast_bytes = self._writing_bytes = 0
        with self._directory_lock:
            self._closed = True
            made = self._directory
        if made is not None:
            import shutil

            shutil.rmtree(made, ignore_errors=True)

    @property
    def directory(self) -> str:
        """Our own directory, removed at close (several workers share a node's $TMPDIR),
        made when first needed: most workers never spill, and tempfile's import is then
        spared at every worker's start."""
        with self._directory_lock:
            if self._directory is None:
                if self._closed:
                    raise ValueError("the spill buffer is closed")
                import tempfile

                self._directory = tempfile.mkdtemp(prefix="hpcsched-spill-",
                                                   dir=self._parent or tempfile.gettempdir())
            return self._directory

    def _where(self) -> str:
        """The directory, for a message (never made for one)."""
        return self._directory or self._parent or "the system's temp dir"

    # ---------------------------------------------------------------- the two tiers
    @property
    def _slow(self) -> MutableMapping:
        """The disk tier, made when first needed: most workers never spill, and zict is
        imported then."""
        if self._disk is None:
            with self._disk_lock:
                if self._disk is None:
                    import zict

                    # zict.File writes a list of buffers as one file without joining them,
                    # though its annotations name bytes only
                    self._disk = zict.Func(
                        _pack, _unpack, zict.File(self.directory))  # type: ignore[arg-type]
        return self._disk

    def _in_memory(self, key: Any, touch: bool) -> Any:
        """``key``'s value if it is in memory, else _MISSING; ``touch``: now the most
        recently used. Under the lock."""
        fast = self._fast
        if key in fast:
            if touch:
                value = fast[key] = fast.pop(key)
                return value
            return fast[key]
        return self._writing.get(key, _MISSING)

    def _drop(self, key: Any) -> bool:
        """Forget ``key`` wherever it is; whether it was there. Under the lock. A file
        being written for it is removed by its writer, which finds the key gone."""
        n = self._nbytes.pop(key, 0)
        if key in self._fast:
            del self._fast[key]
            self._fast_bytes -= n
        elif key in self._writing:
            del self._writing[key]
            self._writing_bytes -= n
        elif key in self._slow_gen:
            del self._slow_gen[key]
            self._remove_file(key)
        else:
            return False
        return True

    def _remove_file(self, key: Any) -> None:
        try:
            del self._slow[key]
        except KeyError:
            pass
        except OSError as e:  # the file is gone already or cannot go: only disk space
            logger.warning("could not remove %r's file from %s: %s", key, self._where(), e)

    def _spill_until_below_target(self, first: Any = _MISSING) -> None:
        with self._spill_lock:
            while self._fast_bytes > self._target:
                try:
                    if self._spill_one(first) is None:
                        return
                except Exception as e:  # noqa: BLE001 - kept in memory: nothing is lost
                    logger.warning("could not spill to %s: %s", self._where(), e)
                    return
                first = _MISSING

    def _spill_one(self, key: Any) -> int | None:
        """Write ``key`` (default: the least recently used) to disk; the bytes spilled,
        or None with nothing in memory to spill. Under ``_spill_lock`` only: the file is
        written without ``_lock``, the value readable meanwhile from ``_writing``."""
        with self._lock:
            fast = self._fast
            if key is _MISSING or key not in fast:
                if not fast:
                    return None
                key = next(iter(fast))
            value = self._writing[key] = fast.pop(key)
            n = self._nbytes[key]
            self._fast_bytes -= n
            self._writing_bytes += n
        try:
            self._slow[key] = value
        except BaseException:
            with self._lock:  # back in memory, most recently used: others go first next
                if self._writing.get(key, _MISSING) is value:
                    del self._writing[key]
                    self._writing_bytes -= n
                    self._fast[key] = value
                    self._fast_bytes += n
            raise
        with self._lock:
            if self._writing.get(key, _MISSING) is value:
                del self._writing[key]
                self._writing_bytes -= n
                self._slow_gen[key] = next(self._gen)
                self.spill_count += 1
                self.spilled_bytes_total += n
                return n
            # deleted or replaced while written: that file is stale (a new one for
            # this key cannot be under way: writers hold _spill_lock)
            self._remove_file(key)
            return 0

    def _find(self, key: Any, touch: bool) -> tuple[Any, int | None]:
        """``(value, None)`` for a key in memory, ``(_MISSING, generation)`` for one on
        disk; KeyError if absent."""
        with self._lock:
            value = self._in_memory(key, touch)
            if value is not _MISSING:
                return value, None
            gen = self._slow_gen.get(key)
            if gen is None:
                raise KeyError(key)
            return _MISSING, gen

    def _read_file(self, key: Any, gen: int) -> Any:
        """``key``'s value read from its file of generation ``gen``, without the lock;
        _MISSING if another thread loaded it back, deleted or replaced it meanwhile."""
        try:
            return self._slow[key]
        except (KeyError, OSError):
            with self._lock:
                if self._slow_gen.get(key) == gen:
                    raise  # the file is there but unreadable: a real error
            return _MISSING

    def _unspill(self, key: Any) -> Any:
        """``key``'s value, loaded back into memory if it is on disk; KeyError if absent."""
        while True:
            value, gen = self._find(key, touch=True)
            if gen is None:
                return value
            value = self._read_file(key, gen)
            if value is _MISSING:
                continue  # moved meanwhile: look again
            with self._lock:
                if self._slow_gen.get(key) != gen:
                    continue  # deleted, replaced or loaded back meanwhile: look again
                self.unspill_count += 1
                n = self._nbytes[key]
                if n > self._target:
                    return value  # heavier than target: it would go straight back (zict)
                del self._slow_gen[key]
                self._remove_file(key)
                self._fast[key] = value
                self._fast_bytes += n
                over = self._fast_bytes > self._target
            if over:
                self._spill_until_below_target()
            return value

    # ---------------------------------------------------------------- mapping
    def __getitem__(self, key: Any) -> Any:
        with self._lock:  # the common case, inline: a result in memory
            fast = self._fast
            if key in fast:
                value = fast[key] = fast.pop(key)
                return value
        return self._unspill(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.store(key, value, sizeof(value))

    def __delitem__(self, key: Any) -> None:
        with self._lock:
            if not self._drop(key):
                raise KeyError(key)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        """As ``dict.pop``; a spilled result is read from disk, not loaded back first."""
        while True:
            with self._lock:
                fast = self._fast
                if key in fast:  # the common case, inline: a result in memory
                    self._fast_bytes -= self._nbytes.pop(key)
                    return fast.pop(key)
                if key in self._writing:
                    value = self._writing[key]
                    self._drop(key)
                    return value
                gen = self._slow_gen.get(key)
                if gen is None:
                    if default is _MISSING:
                        raise KeyError(key)
                    return default
            value = self._read_file(key, gen)
            if value is _MISSING:
                continue  # moved meanwhile: look again
            with self._lock:
                if self._slow_gen.get(key) == gen:
                    self._drop(key)
                    return value

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._fast or key in self._writing or key in self._slow_gen

    def __iter__(self) -> Iterator:
        with self._lock:
            keys = [*self._fast, *self._writing, *self._slow_gen]
        return iter(keys)

    def __len__(self) -> int:
        with self._lock:
            return len(self._fast) + len(self._writing) + len(self._slow_gen)
