"""The book of bulk maps: the maps by prefix, their queue, and what clients forget.

:class:`MapBook` owns the :class:`~.elements.ElementStore` (each map's arrays, the
workers' slots), the queue of maps with elements not yet given to a worker (best
priority first), the prefixes of dropped maps whose elements are tasks still, and the
forgotten results each worker may drop (sent in one ``free-keys`` per worker). It says
how many elements are queued and what they are expected to cost; it does not know the
workers' loads (:mod:`.handout`), nor make tasks (:mod:`.promotion`).
"""

from __future__ import annotations

from array import array
from itertools import compress
from typing import Any

from hpcsched.core.protocol.messages import FreeKeys
from hpcsched.core.state import events as ev
from hpcsched.core.state.bulk.elements import (
    FORGOTTEN,
    MEMORY,
    PROCESSING,
    PROMOTED,
    QUEUED,
    BulkMap,
    ElementStore,
    holds,
)
from hpcsched.core.state.model import Outbox
from hpcsched.core.state.registry import WorkerRegistry
from hpcsched.core.state.tasks import TaskGraph

Key = Any

#: elements made tasks, of dropped maps, remembered before the maps whose tasks are gone
#: are let go (8 bytes each)
SPENT_PRUNE = 65_536


class MapBook:
    """The maps and their queue (module docstring). Its tables are never rebound: the
    views and the other parts read them in place."""

    def __init__(self, graph: TaskGraph):
        self.graph = graph
        self.store = ElementStore()
        self.maps = self.store.maps
        self.pending: list[BulkMap] = []  # maps with queued elements, best priority first
        # dropped maps with elements made tasks: prefix -> those elements (their keys may
        # still be tasks', so the prefix may not name a new map); pruned as it doubles
        self.spent: dict[str, array] = {}
        self._spent_size = 0  # their elements, and one per map
        self._spent_bound = SPENT_PRUNE
        self._frees: dict[str, list] = {}  # worker -> forgotten results it holds

    # ================================================================ the queue
    def add_block(self, e: ev.UpdateMap) -> bool:
        """Hold a block of a map (its first makes the map); whether it queued elements."""
        m = self.maps.get(e.prefix)
        if not e.prefix.endswith("-"):
            raise ev.MalformedMessage(f"update-map: prefix {e.prefix!r} must end with '-'")
        if m is None:
            if e.offset != 0:
                raise ev.MalformedMessage(
                    f"update-map: the first block of {e.prefix!r} starts at {e.offset}, not 0"
                )
            if e.prefix in self.spent:
                raise ev.MalformedMessage(
                    f"update-map: prefix {e.prefix!r} named an earlier "
                    "map, whose elements may be tasks still"
                )
            m = self.maps[e.prefix] = BulkMap(
                e.prefix,
                e.client,
                e.function,
                (self.graph.new_generation(), -e.priority),
                e.retries,
            )
            m.duration = e.duration
        elif m.client != e.client or e.offset != len(m.args):
            raise ev.MalformedMessage(
                f"update-map: a block of {e.prefix!r} at {e.offset} does not continue the map"
            )
        if not e.args:
            return False
        m.extend(e.args)
        self.queue(m)
        return True

    def queue(self, m: BulkMap) -> None:
        """``m`` has queued elements: it is in the queue, in order of priority."""
        if m not in self.pending:
            self.pending.append(m)
            self.pending.sort(key=lambda b: b.priority)

    def requeue(self, m: BulkMap, indices: list[int]) -> None:
        """Elements ``indices`` of ``m`` (sorted) go back to the queue."""
        m.requeue(indices)
        self.queue(m)

    def take(self, size: int) -> tuple[BulkMap, int, int]:
        """The next range of the first map's queue, of at most ``size`` elements:
        ``(map, start, stop)``; the map leaves the queue when nothing of it is left."""
        m = self.pending[0]
        start, stop = m.take(size)
        if not m.free:
            self.pending.pop(0)
        return m, start, stop

    def unassigned(self) -> int:
        """Elements queued in every map (promoted or forgotten ones in its ranges too)."""
        return sum(m.unassigned() for m in self.pending)

    def element_seconds(self, m: BulkMap) -> float | None:
        """Seconds one element of ``m`` is expected to take: the mean of its elements
        reported so far, else its TaskGroup's (elements promoted, tasks of the same
        name), else None (nothing measured yet)."""
        seconds = m.mean_seconds()
        if seconds is None:
            tg = self.graph.groups.get(m.group)
            seconds = tg.average_duration if tg is not None else None
        return seconds

    def waiting(self) -> list[tuple[str, int, float | None]]:
        """The work waiting in the maps' queues, given to no worker yet: ``(TaskGroup,
        elements, seconds each as in element_seconds)`` per map with queued elements. The
        held tasks among them count (a range runs them); promoted or forgotten elements
        still in a queue's ranges do not. Visits the queue's ranges, not the elements."""
        out = []
        for m in self.pending:
            state = m.state
            n = sum(state.count(QUEUED, a, b) for a, b in m.free)
            n += sum(1 for ts in m.held.values() if ts.state == "waiting")
            if n:
                out.append((m.group, n, self.element_seconds(m)))
        return out

    # ================================================================ forgetting
    def release(self, keys: list, client: str) -> list:
        """``client`` dropped its futures of ``keys``: the elements held here among them
        are forgotten (their results' holders hear it at :meth:`flush_frees`); returns the
        other keys, which the caller releases as tasks (promoted elements among them).

        One pass over the keys, with no call per element: a client drops a map's futures
        together, and each is released."""
        run = self.store.run_of(keys) if self.maps else None
        if run is not None and run[0].client == client:
            m, lo, hi, ordered = run
            n = hi - lo
            if m.state.count(MEMORY, lo, hi) == n:  # the common case: all in memory
                slot_ws = self.store.slot_ws
                by_slot = self.store.by_slot(m.where, lo, hi, ordered)
                seg, sizes = m.where[lo:hi], m.nbytes[lo:hi]
                for w, wkeys in by_slot.items():
                    ws = slot_ws[w]
                    if ws is not None:
                        self._frees.setdefault(ws.address, []).extend(wkeys)
                        size = (
                            sum(sizes)
                            if len(by_slot) == 1
                            else sum(compress(sizes, map(w.__eq__, seg)))
                        )
                        holds(ws, -len(wkeys), -size)
                m.state[lo:hi] = bytes([FORGOTTEN]) * n
                m.where[lo:hi] = array("i", [-1]) * n
                m.n_live -= n
                self.drop_if_done(m)
                return []
        rest: list = []
        touched: dict[BulkMap, None] = {}
        frees: dict[int, list] = {}
        freed_bytes: dict[int, int] = {}
        for m, found in self.store.split(keys, rest).items():
            touched[m] = None
            state, where = m.state, m.where
            if m.client != client:  # not its map: nothing of it to release
                for key, i in found:
                    if state[i] == PROMOTED:
                        rest.append(key)
                continue
            live = orphans = 0
            for key, i in found:
                st = state[i]
                if st == MEMORY:
                    state[i] = FORGOTTEN
                    live += 1
                    w = where[i]
                    where[i] = -1
                    got = frees.get(w)
                    if got is None:
                        got = frees[w] = []
                        freed_bytes[w] = 0
                    got.append(key)
                    freed_bytes[w] += m.nbytes[i]
                elif st == PROCESSING:  # its worker's report is due; the result is freed then
                    state[i] = FORGOTTEN
                    live += 1
                    orphans += 1
                elif st == QUEUED:
                    state[i] = FORGOTTEN
                    live += 1
                elif st == PROMOTED:  # a task of its own now: released as one
                    rest.append(key)
            m.n_live -= live
            m.n_orphans += orphans
        slot_ws = self.store.slot_ws
        for w, wkeys in frees.items():
            ws = slot_ws[w]
            if ws is not None:  # one free-keys per worker: flush_frees
                self._frees.setdefault(ws.address, []).extend(wkeys)
                holds(ws, -len(wkeys), -freed_bytes[w])
        for m in touched:
            self.drop_if_done(m)
        return rest

    def forget_all(self, m: BulkMap) -> None:
        """Every element of ``m`` not made a task is forgotten (its client left)."""
        for i in range(len(m.state)):
            self._forget(m, i)

    def _forget(self, m: BulkMap, i: int) -> None:
        st = m.state[i]
        if st >= PROMOTED:
            return
        m.state[i] = FORGOTTEN
        m.n_live -= 1
        w = m.where[i]
        if st == PROCESSING:
            m.n_orphans += 1  # its worker's report is due; the result is freed then
        elif st == MEMORY:
            ws = self.store.slot_ws[w]
            m.where[i] = -1
            if ws is not None:  # one free-keys per worker: flush_frees
                self._frees.setdefault(ws.address, []).append(m.prefix + str(i))
                holds(ws, -1, -m.nbytes[i])

    def flush_frees(self, out: Outbox) -> None:
        """Tell each worker the forgotten results it may drop, in one message."""
        frees, self._frees = self._frees, {}
        for address, keys in frees.items():
            out.send(address, FreeKeys(keys))

    def drop_if_done(self, m: BulkMap) -> None:
        """``m`` is let go once no element of it lives, none is reported still, and no
        task of it is held (its ranges are still to give)."""
        if m.n_live == 0 and m.n_orphans == 0 and not m.held and self.maps.get(m.prefix) is m:
            if PROMOTED in m.state:  # their keys are tasks' (a client never reuses a prefix)
                self._spend(m)
            given_maps = self.store.given_maps
            for slot in m.given:
                given_maps.get(slot, {}).pop(m, None)
            del self.maps[m.prefix]
            if m in self.pending:
                self.pending.remove(m)

    def _spend(self, m: BulkMap) -> None:
        """Map ``m`` is dropped while some of its elements are tasks: remember which, so
        that its prefix names no new map while one of them lives. Prefixes whose tasks
        are all forgotten are let go whenever the record has doubled: a client running
        maps all day does not grow it (amortized, a look-up per element made a task). It
        is counted in elements, not maps: a map of a million elements, all made tasks,
        weighs as much as a million maps of one."""
        state, promoted = m.state, array("q")
        i = state.find(PROMOTED)
        while i >= 0:
            promoted.append(i)
            i = state.find(PROMOTED, i + 1)
        self.spent[m.prefix] = promoted
        self._spent_size += len(promoted) + 1
        if self._spent_size > self._spent_bound:
            tasks = self.graph.tasks
            for p in [
                p for p, idx in self.spent.items() if not any(p + str(i) in tasks for i in idx)
            ]:
                del self.spent[p]
            self._spent_size = sum(len(idx) + 1 for idx in self.spent.values())
            self._spent_bound = max(SPENT_PRUNE, 2 * self._spent_size)

    # ================================================================ invariants
    def validate(self, registry: WorkerRegistry) -> dict[int, int]:
        """The counters agree with the arrays; returns, per worker slot, the elements it
        runs or must still report (its load, as the hand-out counts it)."""
        per_slot: dict[int, int] = {}
        slot_ws = self.store.slot_ws
        for prefix, m in self.maps.items():
            assert m.prefix == prefix
            st = m.state
            assert m.n_live == st.count(QUEUED) + st.count(PROCESSING) + st.count(MEMORY), m
            orphans = 0
            for i, s in enumerate(st):
                w = m.where[i]
                if s in (PROCESSING, MEMORY):
                    assert w >= 0 and slot_ws[w] is not None, (prefix, i)
                if s == FORGOTTEN and w >= 0:
                    orphans += 1
                if s in (PROCESSING, FORGOTTEN) and w >= 0:
                    per_slot[w] = per_slot.get(w, 0) + 1
                if s == QUEUED:
                    assert w == -1 and any(a <= i < b for a, b in m.free), (prefix, i)
            assert orphans == m.n_orphans, (prefix, orphans, m.n_orphans)
            assert (m in self.pending) == bool(m.free), prefix
            assert m.n_free == sum(b - a for a, b in m.free), prefix
            assert all(m.free[k][1] < m.free[k + 1][0] for k in range(len(m.free) - 1)), prefix
            # every element a worker runs or holds is in the runs given to it
            for to, given in m.given.items():
                assert m in self.store.given_maps[to], (prefix, to)
                r = given.runs
                inside = {i for k in range(0, len(r), 2) for i in range(r[k], r[k + 1])}
                assert inside.issuperset(i for i, w in enumerate(m.where) if w == to), (prefix, to)
            assert not {w for w in m.where if w >= 0} - set(m.given), prefix
        for given_to, maps in self.store.given_maps.items():
            assert all(self.maps.get(m.prefix) is m and given_to in m.given for m in maps), given_to
        # each worker's count and bytes of the elements' results it holds
        results: dict[int, list[int]] = {}
        for m in self.maps.values():
            for i, s in enumerate(m.state):
                if s == MEMORY:
                    got = results.setdefault(m.where[i], [0, 0])
                    got[0] += 1
                    got[1] += m.nbytes[i]
        for ws in registry.workers.values():
            slot = self.store.slots.get(ws.address)
            n, size = results.get(slot, (0, 0)) if slot is not None else (0, 0)
            assert (ws.n_elements, ws.element_nbytes) == (n, size), (ws, n, size)
        return per_slot
