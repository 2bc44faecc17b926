"""The elements of bulk maps: a store of arrays, apart from how they are scheduled.

A :class:`BulkMap` holds one ``Client.map``'s function once, each element's pickled
arguments, and per element a state byte (queued, processing, memory, promoted,
forgotten), the worker slot running or holding it and its result's size, in flat
arrays; its queued elements are a list of ranges. :class:`Given` keeps, per worker, the
runs of elements given to it, so that what a worker had is found without a pass over the
map. :class:`ElementStore` holds the maps by prefix and the workers' slots, and answers
the questions asked of elements by key without making a task of any: which element a key
names, which workers hold a run of them (a gather), what a worker holds or runs, how many
are in each state. How elements are handed out, reported, given back and made tasks is
the work of the other modules of this package (:mod:`hpcsched.core.state.bulk`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator
from itertools import compress
from typing import Any

from hpcsched.core.graph.dsk import key_split
from hpcsched.core.state.model import TaskState, WorkerInfo

Key = Any

QUEUED, PROCESSING, MEMORY, PROMOTED, FORGOTTEN = 0, 1, 2, 3, 4
#: the slot of a worker never given an element: matches no element's ``where`` (-1: none)
NO_SLOT = -2
#: elements of a map's runs given to a worker past which they are compacted to those it
#: still runs or holds (at least; see :class:`Given`)
COMPACT_AT = 1024
#: keys in a release or a gather from which they are checked for being one run of a
#: map's elements (below, looking each up costs as little)
RUN_MIN = 64


def holds(ws: WorkerInfo, n: int, nbytes: int) -> None:
    """``ws`` holds ``n`` more results of elements, of ``nbytes`` more bytes (negative:
    fewer): its ``nbytes`` counts them with its tasks' results, so that what weighs a
    worker (retirement, rebalancing, placement's tie-breaks, the memory views) sees them."""
    ws.n_elements += n
    ws.element_nbytes += nbytes
    ws.nbytes += nbytes


def runs(indices: list[int]) -> Iterator[tuple[int, int]]:
    """The ``[start, stop)`` runs of consecutive numbers in ascending ``indices``.

    >>> list(runs([1, 2, 3, 7, 9, 10]))
    [(1, 4), (7, 8), (9, 11)]
    """
    if not indices:
        return
    start = prev = indices[0]
    for i in indices[1:]:
        if i != prev + 1:
            yield start, prev + 1
            start = i
        prev = i
    yield start, prev + 1


class Given:
    """The elements of one map given to one worker, as runs ``[start, stop)`` in a flat
    array: a superset of those the worker runs or holds (``BulkMap.where`` says which),
    so that its departure visits what it was given, not the whole map. Elements it no
    longer has (reported and released, promoted, taken back) are dropped from the runs
    whenever they have grown to twice what it had at the last compaction: the runs stay
    within a constant factor of what the worker has, plus :data:`COMPACT_AT`."""

    __slots__ = ("runs", "length", "limit")

    def __init__(self) -> None:
        self.runs = array("q")
        self.length = 0  # elements in the runs
        self.limit = COMPACT_AT  # compact past this length

    def add(self, start: int, stop: int) -> None:
        r = self.runs
        if r and r[-1] == start:
            r[-1] = stop
        else:
            r.append(start)
            r.append(stop)
        self.length += stop - start

    def held(self, where: array, slot: int) -> list[int]:
        """The elements of the runs whose ``where`` is ``slot``, ascending, each once (an
        element taken back and given to the same worker again is in two runs)."""
        r = self.runs
        out: list[int] = []
        for k in range(0, len(r), 2):
            a, b = r[k], r[k + 1]
            seg = where[a:b]
            if seg.count(slot) == b - a:
                out += range(a, b)
            else:
                out += [a + j for j, w in enumerate(seg) if w == slot]
        return sorted(set(out)) if len(r) > 2 else out

    def compact(self, where: array, slot: int) -> None:
        held = self.held(where, slot)
        self.runs = array("q", [x for run in runs(held) for x in run])
        self.length = len(held)
        self.limit = 2 * len(held) + COMPACT_AT


class BulkMap:
    """One bulk map: its function, its elements' arguments and their state."""

    __slots__ = ("prefix", "client", "function", "args", "state", "where", "nbytes",
                 "priority", "retries", "free", "n_free", "n_live", "n_orphans", "group",
                 "suspicious", "given", "spent", "n_done", "held", "duration")

    def __init__(self, prefix: str, client: str, function: bytes, priority: tuple,
                 retries: int):
        self.prefix = prefix
        self.client = client
        self.function = function
        self.args: list[bytes] = []
        self.state = bytearray()
        # the worker slot (BulkMaps.slot_ws) running or holding each element, -1: none
        self.where = array("i")
        self.nbytes = array("q")
        self.priority = priority
        self.retries = retries
        self.free: list[list[int]] = []  # [start, stop) of queued elements, in order
        self.n_free = 0  # elements in those ranges
        self.n_live = 0  # queued, processing or in memory
        self.n_orphans = 0  # forgotten while a worker runs them: their reports are due
        self.group = key_split(prefix + "0")
        # per element, the workers that died while it was given to them; made when the
        # first such worker dies (a map whose workers live pays nothing for it)
        self.suspicious: bytearray | None = None
        self.given: dict[int, Given] = {}  # worker slot -> the elements given to it
        self.spent = 0.0  # seconds the reported elements took, over n_done of them
        self.n_done = 0
        self.duration: float | None = None  # seconds an element is expected to take, as said
        # queued elements made tasks that still run in a range (BulkMaps.resolve): index ->
        # its task, which waits until a range with it is given to a worker
        self.held: dict[int, TaskState] = {}

    def extend(self, args: list[bytes]) -> None:
        start, n = len(self.args), len(args)
        self.args += args
        self.state += bytes(n)
        self.where += array("i", [-1]) * n
        self.nbytes += array("q", [0]) * n
        if self.suspicious is not None:
            self.suspicious += bytes(n)
        self.n_live += n
        self.n_free += n
        if self.free and self.free[-1][1] == start:
            self.free[-1][1] = start + n
        else:
            self.free.append([start, start + n])

    def requeue(self, indices: list[int]) -> None:
        """Elements ``indices`` (ascending, none of them queued) go back to the queue, kept
        in index order (earlier first): a binary search per run of them."""
        state, where, free = self.state, self.where, self.free
        for i in indices:
            state[i] = QUEUED
            where[i] = -1
        self.n_free += len(indices)
        for a, b in runs(indices):
            k = bisect_left(free, [a])
            if k > 0 and free[k - 1][1] == a:
                free[k - 1][1] = b
                if k < len(free) and free[k][0] == b:
                    free[k - 1][1] = free[k][1]
                    del free[k]
            elif k < len(free) and free[k][0] == b:
                free[k][0] = a
            else:
                free.insert(k, [a, b])

    def take(self, n: int) -> tuple[int, int]:
        """The next ``[start, stop)`` of at most ``n`` queued-range elements (some of which
        may have been promoted or forgotten since)."""
        r = self.free[0]
        start = r[0]
        stop = min(r[1], start + n)
        if stop == r[1]:
            self.free.pop(0)
        else:
            r[0] = stop
        self.n_free -= stop - start
        return start, stop

    def unassigned(self) -> int:
        return self.n_free

    def mean_seconds(self) -> float | None:
        """The mean time of the elements reported so far; None: none reported yet."""
        return self.spent / self.n_done if self.n_done else None


class ElementStore:
    """The bulk maps by prefix, and the workers' slots (see the module docstring)."""

    def __init__(self) -> None:
        self.maps: dict[str, BulkMap] = {}
        self.slots: dict[str, int] = {}  # worker address -> its slot
        self.slot_ws: list[WorkerInfo | None] = []
        # worker slot -> the maps with elements given to it (their Given runs)
        self.given_maps: dict[int, dict[BulkMap, None]] = {}
        self._last: BulkMap | None = None  # the map of the last key looked up

    def slot(self, ws: WorkerInfo) -> int:
        """``ws``'s slot: the number its elements' ``where`` names it by (a new one for a
        worker that registers again at the same address)."""
        s = self.slots.get(ws.address)
        if s is None or self.slot_ws[s] is not ws:
            s = self.slots[ws.address] = len(self.slot_ws)
            self.slot_ws.append(ws)
        return s

    def element(self, key: Key) -> tuple[BulkMap, int] | None:
        if not self.maps or type(key) is not str:
            return None
        last = self._last  # lookups come in runs of one map's keys (a gather, a release)
        tail = ""
        if last is not None and key.startswith(last.prefix) and \
                self.maps.get(last.prefix) is last:
            tail = key[len(last.prefix):]
        m: BulkMap | None = last
        # digits after the prefix: its key; else look it up
        if m is None or not (tail.isdigit() and tail.isascii()):
            head, _, tail = key.rpartition("-")
            m = self.maps.get(head + "-")
            if m is None or not (tail.isdigit() and tail.isascii()):
                return None
            self._last = m
        i = int(tail)
        if i >= len(m.state) or str(i) != tail:
            return None
        return m, i

    def run_of(self, keys: list) -> tuple[BulkMap, int, int, list] | None:
        """``(map, lo, hi, keys ascending)`` if ``keys`` are elements ``lo .. hi-1`` of one map,
        each once, in ascending or descending order (a part of a gather; a map's futures
        dropped together, which a list drops last first); None otherwise. Checked with no
        call per key: the keys such a run would have are made and compared at once."""
        n = len(keys)
        if n < RUN_MIN:
            return None
        first, last = self.element(keys[0]), self.element(keys[-1])
        if first is None or last is None or first[0] is not last[0]:
            return None
        m, a = first
        b = last[1]
        if b - a == n - 1:
            lo, hi, ordered = a, b + 1, keys
        elif a - b == n - 1:
            lo, hi, ordered = b, a + 1, keys[::-1]
        else:
            return None
        prefix = m.prefix
        if ordered != [prefix + s for s in map(str, range(lo, hi))]:
            return None
        return m, lo, hi, ordered

    def by_slot(self, where: array, lo: int, hi: int, ordered: list) -> dict[int, list]:
        """The keys ``ordered`` of elements ``lo .. hi-1`` grouped by their ``where``."""
        seg = where[lo:hi]
        slots = set(seg)
        if len(slots) == 1:
            return {slots.pop(): list(ordered)}
        return {w: list(compress(ordered, map(w.__eq__, seg))) for w in slots}

    def split(self, keys: list, rest: list) -> dict[BulkMap, list[tuple[Key, int]]]:
        """The elements held here among ``keys``, as ``(key, index)`` per map, in the order
        of ``keys``; the other keys are appended to ``rest``. What :meth:`_element` does
        for one key, for many, with no call per key (the keys of one map come in runs)."""
        out: dict[BulkMap, list[tuple[Key, int]]] = {}
        maps = self.maps
        if not maps:
            rest.extend(keys)
            return out
        m: BulkMap | None = None
        prefix = ""
        cut = size = 0
        found: list = []
        for key in keys:
            if type(key) is not str:
                rest.append(key)
                continue
            tail = key[cut:]
            if m is None or not key.startswith(prefix) or not tail.isdigit() \
                    or not tail.isascii():
                head, _, tail = key.rpartition("-")
                got = maps.get(head + "-")
                if got is None or not tail.isdigit() or not tail.isascii():
                    rest.append(key)
                    continue
                m, prefix = got, got.prefix
                cut, size = len(prefix), len(got.state)
                found = out.get(m)  # type: ignore[assignment]
                if found is None:
                    found = out[m] = []
            i = int(tail)
            if i >= size or (tail[0] == "0" and len(tail) > 1):  # "07" names no element
                rest.append(key)
                continue
            found.append((key, i))
        return out

    def holders(self, key: Key) -> list[WorkerInfo] | None:
        """The worker holding element ``key``'s result; [] if it is not in memory; None if
        ``key`` is no element held here."""
        found = self.element(key)
        if found is None:
            return None
        m, i = found
        if m.state[i] != MEMORY:
            return [] if m.state[i] < PROMOTED else None
        ws = self.slot_ws[m.where[i]]
        return [ws] if ws is not None else []

    def result_sizes(self, keys: list, rest: list) -> dict[Key, int]:
        """The bytes of the results of the elements among ``keys`` that are in memory;
        promoted elements and other keys are appended to ``rest``."""
        run = self.run_of(keys)  # the common case: the rest of a map, all in memory
        if run is not None:
            m, lo, hi, ordered = run
            if m.state.count(MEMORY, lo, hi) == hi - lo:
                return dict(zip(ordered, m.nbytes[lo:hi], strict=True))
        out: dict[Key, int] = {}
        for m, found in self.split(keys, rest).items():
            state, nbytes = m.state, m.nbytes
            for key, i in found:
                st = state[i]
                if st == MEMORY:
                    out[key] = nbytes[i]
                elif st == PROMOTED:
                    rest.append(key)
        return out

    def holders_of(self, keys: list, rest: list) -> tuple[dict[str, list], list]:
        """The elements held here among ``keys``: ``({worker address: keys whose result it
        holds}, keys of elements whose result no worker holds)``; other keys (tasks,
        promoted elements) are appended to ``rest``. One pass, no call per key."""
        run = self.run_of(keys)
        if run is not None:
            m, lo, hi, ordered = run
            if m.state.count(MEMORY, lo, hi) == hi - lo:  # the common case: all in memory
                out: dict[str, list] = {}
                missing: list = []
                for w, wkeys in self.by_slot(m.where, lo, hi, ordered).items():
                    ws = self.slot_ws[w]
                    if ws is None:
                        missing += wkeys
                    else:
                        out.setdefault(ws.address, []).extend(wkeys)
                return out, missing
        held: dict[int, list] = {}
        missing = []
        for m, found in self.split(keys, rest).items():
            state, where = m.state, m.where
            for key, i in found:
                st = state[i]
                if st == MEMORY:
                    w = where[i]
                    got = held.get(w)
                    if got is None:
                        got = held[w] = []
                    got.append(key)
                elif st < PROMOTED:
                    missing.append(key)
                else:
                    rest.append(key)
        out = {}
        slot_ws = self.slot_ws
        for w, wkeys in held.items():
            ws = slot_ws[w]
            if ws is None:
                missing.extend(wkeys)
            else:
                out.setdefault(ws.address, []).extend(wkeys)
        return out, missing

    def keys_on(self, address: str, running: bool = False) -> list[str]:
        """The keys of the elements whose result the worker at ``address`` holds, or
        (``running``) that it runs or was given to run: what it was given, not the maps."""
        slot = self.slots.get(address)
        if slot is None:
            return []
        code = PROCESSING if running else MEMORY
        out: list[str] = []
        for m in self.given_maps.get(slot, ()):
            prefix, state = m.prefix, m.state
            out += [prefix + str(i) for i in m.given[slot].held(m.where, slot)
                    if state[i] == code]
        return out

    def memory_keys(self) -> list[str]:
        """The keys of every element whose result a worker holds."""
        out: list[str] = []
        for m in self.maps.values():
            prefix = m.prefix
            out += [prefix + str(i) for i in compress(range(len(m.state)),
                                                      map(MEMORY.__eq__, m.state))]
        return out

    def group_counts(self) -> dict[tuple[str, str], int]:
        """Elements held here by (group, state), as tasks are counted in the views."""
        out: dict[tuple[str, str], int] = {}
        for m in self.maps.values():
            for name, code in (("queued", QUEUED), ("processing", PROCESSING),
                               ("memory", MEMORY)):
                c = m.state.count(code)
                if c:
                    out[(m.group, name)] = out.get((m.group, name), 0) + c
        return out

    def counts(self) -> dict[str, int]:
        """Elements held here in each state (``task_counts`` adds them)."""
        out: dict[str, int] = {}
        for m in self.maps.values():
            for name, code in (("queued", QUEUED), ("processing", PROCESSING),
                               ("memory", MEMORY)):
                c = m.state.count(code)
                if c:
                    out[name] = out.get(name, 0) + c
        return out
