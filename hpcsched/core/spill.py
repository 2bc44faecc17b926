"""The worker's data store when memory is managed: results that spill to local disk.

:class:`SpillBuffer` is a mapping (key -> result) over ``zict.Buffer``, the
spill buffer dask.distributed's workers use: a "fast" dict in memory, least
recently used first out, and a "slow" mapping of files in a directory on the
node's local disk. A result stored past the ``target`` threshold pushes the
least recently used results to disk; reading a spilled key loads it back
(pushing others out), so a task, a peer's fetch or the client's gather reads a
spilled result as if it had never left. zict is thread-safe (task threads read
dependencies, peer readers serve fetches while the loop stores results) and
keeps a key in memory when writing it fails (disk full, unpicklable), so a
failed spill loses nothing.

Each result's size is the ``nbytes`` the worker measured once when the task
finished (:meth:`SpillBuffer.store`); it is not measured again.

Files are the frames of :func:`hpcsched.core.serialize.dumps` (pickle protocol
5, buffers out of band) behind a small header of frame lengths: a numpy array
is written and read back without a pickle copy of its data.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator, MutableMapping
from typing import Any

import zict

from hpcsched.core.serialize import dumps, loads, sizeof

logger = logging.getLogger("hpcsched.worker")

_LEN = struct.Struct("<Q")


def local_directory(path: str | None = None) -> str:
    """Where a worker spills: ``path``, else ``worker.local-directory``, else the node's
    ``$TMPDIR`` (batch systems point it at node-local disk), else the system's temp dir."""
    from hpcsched.core import config

    path = config.get("worker.local-directory", path, default=None)
    return os.path.expandvars(os.path.expanduser(str(path))) if path else tempfile.gettempdir()


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

    def __init__(self, directory: str, target: float):
        os.makedirs(directory, exist_ok=True)
        # a directory of our own, removed at close: several workers share a node's $TMPDIR
        self.directory = tempfile.mkdtemp(prefix="hpcsched-spill-", dir=directory)
        self._nbytes: dict[Any, int] = {}
        self.spilled_bytes_total = 0  # written to disk since start
        self.spill_count = 0
        self.unspill_count = 0
        # zict.File writes a list of buffers as one file without joining them, though its
        # annotations name bytes only
        slow = zict.Func(_pack, _unpack, zict.File(self.directory))  # type: ignore[arg-type]
        self._buffer = zict.Buffer(
            {}, slow, n=target, weight=self._weight,
            fast_to_slow_callbacks=[self._on_spill], slow_to_fast_callbacks=[self._on_unspill])

    def _weight(self, key: Any, value: Any) -> int:
        n = self._nbytes.get(key)
        if n is None:
            n = self._nbytes[key] = max(int(sizeof(value)), 1)
        return n

    def _on_spill(self, key: Any, value: Any) -> None:
        self.spill_count += 1
        self.spilled_bytes_total += self._nbytes.get(key, 0)

    def _on_unspill(self, key: Any, value: Any) -> None:
        self.unspill_count += 1

    # ---------------------------------------------------------------- the worker's use
    def store(self, key: Any, value: Any, nbytes: int) -> None:
        """Store a result whose size was measured already (once, when it was made)."""
        self._nbytes[key] = max(int(nbytes), 1)
        try:
            self._buffer[key] = value
        except Exception as e:  # noqa: BLE001 - zict kept it in memory: nothing is lost
            logger.warning("could not spill to %s: %s", self.directory, e)

    def peek(self, key: Any) -> Any:
        """The value of ``key`` without loading it back into memory for good: serving a
        spilled result to a peer or the client must not push out the results that local
        tasks are about to use."""
        try:
            return self._buffer.fast[key]
        except KeyError:
            pass
        try:
            return self._buffer.slow[key]
        except KeyError:  # loaded back by another thread meanwhile
            return self._buffer.fast[key]

    def evict(self, nbytes: int) -> int:
        """Spill least recently used results until ``nbytes`` went to disk (or none is
        left in memory); the bytes spilled."""
        done = 0
        fast = self._buffer.fast
        while done < nbytes and len(fast):
            try:
                key, _, weight = fast.evict()
            except KeyError:  # emptied by another thread meanwhile
                break
            except Exception as e:  # noqa: BLE001 - kept in memory by zict
                logger.warning("could not spill to %s: %s", self.directory, e)
                break
            if key is None:  # another thread took that one: try the next
                continue
            done += int(weight)
        return done

    @property
    def memory_bytes(self) -> int:
        """Managed memory: bytes of results in memory."""
        return int(self._buffer.fast.total_weight)

    @property
    def disk_bytes(self) -> int:
        return int(sum(self._nbytes.get(k, 0) for k in list(self._buffer.slow)))

    @property
    def spilled(self) -> set:
        return set(self._buffer.slow)

    @property
    def target(self) -> float:
        """Bytes of results kept in memory; setting it spills what is past it now."""
        return self._buffer.n

    @target.setter
    def target(self, nbytes: float) -> None:
        self._buffer.n = nbytes
        try:
            self._buffer.evict_until_below_target()
        except Exception as e:  # noqa: BLE001 - zict kept the result in memory
            logger.warning("could not spill to %s: %s", self.directory, e)

    def close(self) -> None:
        self._buffer.fast.clear()
        shutil.rmtree(self.directory, ignore_errors=True)
        self._nbytes.clear()

    # ---------------------------------------------------------------- mapping
    def __getitem__(self, key: Any) -> Any:
        return self._buffer[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._nbytes.pop(key, None)  # measured by _weight
        self._buffer[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._buffer[key]
        self._nbytes.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._buffer

    def __iter__(self) -> Iterator:
        return iter(self._buffer)

    def __len__(self) -> int:
        return len(self._buffer)
