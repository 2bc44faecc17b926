"""A client's futures: each key's state, its reference count, and the done callbacks.

Every :class:`~hpcsched.core.client.futures.Future` of a client registers with the
client's :class:`FutureTable` (``Future.__init__`` and ``Future.release``); the
client's handling of scheduler messages moves the states along through it (``key-in-memory``,
``task-erred``, ``cancelled-keys``), and ``gather`` waits until all its futures are done.
A key's last Future released tells the scheduler, as dask.distributed's client
does (https://distributed.dask.org/en/stable/memory.html).

The table also holds the results fetched ahead of their ``result()`` (see
:mod:`hpcsched.core.client.futures`): which finished futures the client is about to
ask for (:meth:`FutureTable.candidates`), their values until taken, and their bytes,
kept under ``client.prefetch-held-bytes`` together with the bytes the requests in flight
may bring (:meth:`FutureTable.reserve`); a released or lost future's value goes.
Single submissions count as one sequence in the order they were made
(:class:`_Submitted`), as ``[f.result() for f in [submit(...) ...]]`` asks for them.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from hpcsched.core.client.futures import (
    TAKEN,
    UNFETCHED,
    Arrivals,
    Future,
    FutureGroup,
    FutureState,
    fetchable,
    run_callback,
)
from hpcsched.core.protocol.messages import ClientReleasesKeys

logger = logging.getLogger("hpcsched.client")


class FutureTable:
    """The futures one client holds: each key's :class:`FutureState`, how many
    :class:`Future` objects refer to it, the condition waiters sleep on, and the thread
    that runs done callbacks.

    When the last Future of a key is released, ``post`` gets the
    ``client-releases-keys`` message (the client's outgoing queue, so that
    ``Future.__del__`` never blocks on a socket). Done callbacks run on their own
    thread: one that calls ``result()`` (which needs the client's handling of scheduler
    messages) must not block that handling.
    """

    def __init__(self, post: Callable[[Any], Any], held_limit: int = 64 * 2**20):
        self.states: dict[Any, FutureState] = {}
        self.changed = threading.Condition()  # guards _waits
        self._waits: list[_Wait] = []  # gather calls blocked in wait()
        self.closed = False
        self._lock = threading.Lock()
        self._post = post
        self.client_id = ""  # the client's id, set by start()
        self._callbacks = _Callbacks()
        #: callbacks of the batch of scheduler messages being handled (:meth:`batch_done`)
        self._deferred: list = []
        self._thread: threading.Thread | None = None
        #: where the futures whose results are asked for next are (``ready(out, limit)``):
        #: the live ``as_completed`` iterators
        self.sources: weakref.WeakSet = weakref.WeakSet()
        self._waited: deque[FutureGroup] = deque(maxlen=4)  # the latest waits' futures
        self._submitted = _Submitted()  # the latest single submissions, in order
        self._held: dict[FutureState, int] = {}  # state fetched ahead -> its bytes
        self._counted = 0  # bytes of _held: values held, and some taken (_room)
        #: bytes the requests in flight may bring ahead (their budgets), counted against
        #: ``held_limit`` from the request to its reply, with the bytes held
        self.in_flight_bytes = 0
        self.held_limit = held_limit
        #: the request for results fetched ahead still in flight, its keys -> states, and
        #: the bytes reserved for it
        self._ahead: tuple[dict, Any, int] | None = None

    def acquire(self, key: Any, state: FutureState | None = None) -> FutureState:
        """Count one more Future of ``key``; its state (``state`` if given, else the key's,
        made on first use)."""
        with self._lock:
            if state is None:
                state = self.states.get(key)
                if state is None:
                    state = self.states[key] = FutureState()
            state.refs += 1
        return state

    def acquire_many(self, keys: list) -> list[FutureState]:
        """:meth:`acquire` of each of ``keys`` (a map's), under one lock."""
        states = self.states
        with self._lock:
            made = [FutureState(1) for _ in keys]
            fresh = dict(zip(keys, made, strict=True))
            if len(fresh) == len(keys) and states.keys().isdisjoint(fresh):
                states.update(fresh)  # the common case: a new map's keys, in C loops
                return made
            out = []
            for key in keys:
                state = states.get(key)
                if state is None:
                    state = states[key] = FutureState()
                state.refs += 1
                out.append(state)
        return out

    def release(self, key: Any, state: FutureState | None = None) -> None:
        """One Future of ``key`` (whose state is ``state``, else the key's) fewer; the last
        one tells the scheduler."""
        with self._lock:
            if state is None:
                state = self.states.get(key)
                if state is None:
                    return
            n = state.refs = state.refs - 1
            if n > 0:
                return
            if self.states.get(key) is state:
                del self.states[key]
            if self._held:  # its value goes (also one dropped since: lost, cancelled)
                self._counted -= self._held.pop(state, 0)
            state.value = UNFETCHED
        if not self.closed:
            self._post(ClientReleasesKeys(self.client_id, [key]))

    def known(self, key: Any) -> bool:
        """Whether a live future of ``key`` is held (so submitting it again is the same
        task); a cancelled one is made pending, to be submitted anew."""
        st = self.states.get(key)
        if st is None:
            return False
        if st.status == "cancelled":
            st.lose("pending")
            return False
        return True

    def erred(self, key: Any, exception: Any, traceback: str, text: str) -> None:
        """The task of ``key`` erred (``exception`` serialized)."""
        st = self.states.get(key)
        if st is not None:
            self.defer_callbacks(st.error(exception, traceback, text))

    def cancel(self, states: Iterable[FutureState]) -> None:
        """Mark ``states`` cancelled (those not already) and wake the waiters."""
        for st in states:
            if st.status != "cancelled":
                self.run_callbacks(st.cancel())
        self.notify()

    def fail(self, exception: Any, text: str) -> None:
        """Every future not done errs with ``exception`` (serialized): the scheduler is
        lost."""
        for st in list(self.states.values()):
            if not st.done():
                self.run_callbacks(st.error(exception, "", text))
        self.notify()

    def notify(self) -> None:
        """States changed (called once per batch of scheduler messages): wake each
        :meth:`wait` whose states are now all done, and only those. A gather of 10,000
        futures is woken once, not once per batch of results."""
        with self.changed:
            for w in self._waits:
                if not w.event.is_set() and w.satisfied():
                    w.event.set()

    def batch_done(self) -> None:
        """A batch of scheduler messages is handled (on the thread that handles them):
        queue the callbacks its messages returned, then :meth:`notify`."""
        if self._deferred:
            cbs, self._deferred = self._deferred, []
            self._callbacks.put(cbs)
        self.notify()

    def wait(self, states: list[FutureState], deadline: float | None,
             timeout: float | None) -> None:
        """Block until every state is done."""
        w = _Wait([st for st in states if not st._is_done])  # done(), with no call per state
        with self.changed:
            if w.satisfied():
                return
            self._waits.append(w)
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"futures not done within {timeout}s")
                if w.event.wait(1.0 if left is None else min(left, 1.0)):
                    return
                with self.changed:  # a second look, should a notify ever be missed
                    if w.satisfied():
                        return
        finally:
            with self.changed:
                self._waits.remove(w)

    # ------------------------------------------------------------ results fetched ahead
    def waited(self, group: FutureGroup) -> None:
        """``group``'s futures were waited for: their results are likely asked for next."""
        self._waited.append(group)

    def submitted(self, key: Any, state: FutureState) -> None:
        """A single task of ``key`` was submitted (``Client.submit``)."""
        self._submitted.append(key, state)

    def candidates(self, future: Future, limit: int) -> dict:
        """Up to ``limit`` finished futures (key -> state), ``future`` left out, whose
        results the client is about to ask for: the rest of ``future``'s map (of a single
        submission: the submissions around it), the done futures of the live
        ``as_completed`` iterators, the latest waits' futures, and those whose done
        callbacks are queued."""
        out: dict = {}
        if future.group is not None:
            future.group.ready(out, limit + 1)
        else:
            self._submitted.ready(out, limit + 1)
        for group in list(self._waited):
            if len(out) > limit:
                break
            if group is not future.group:  # walked above
                group.ready(out, limit + 1)
        for source in list(self.sources):
            if len(out) > limit:
                break
            source.ready(out, limit + 1)
        if len(out) <= limit:
            self._callbacks.ready(out, limit + 1)
        out.pop(future.key, None)
        ahead = self._ahead
        if ahead is not None:  # on their way already
            for key in ahead[0]:
                out.pop(key, None)
        while len(out) > limit:
            out.popitem()
        return out

    def send_ahead(self, states: dict, request: Any, reserved: int) -> bool:
        """Keep ``request`` (a reply to come, ``reserved`` bytes counted for it) for the
        results of ``states`` (key -> state); False, keeping nothing, if one is in flight
        already."""
        with self._lock:
            if self._ahead is not None:
                return False
            self._ahead = (states, request, reserved)
            return True

    def on_its_way(self, key: Any = None) -> bool:
        """Whether the request in flight asked for the result of ``key`` (None: whether
        one is in flight)."""
        ahead = self._ahead
        return ahead is not None and (key is None or key in ahead[0])

    def ahead_in_flight(self) -> tuple[dict, Any, int] | None:
        """The request in flight, its states (key -> state) and the bytes reserved for
        it, given up here: the caller awaits its reply and holds its values (which ends
        the reservation)."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
        return ahead

    @property
    def held_bytes(self) -> int:
        """Bytes of the values fetched ahead and held here, not yet taken."""
        with self._lock:
            self._room(self.held_limit + 1)  # counts the values taken back
            return self._counted

    def room(self) -> int:
        """Bytes that results fetched ahead may still take here: neither held nor
        reserved for a reply in flight."""
        with self._lock:
            return self._room(self.held_limit)

    def _room(self, wanted: int) -> int:
        """:meth:`room`, under ``_lock``; the bytes of the values taken (which ``take``
        leaves counted) or dropped since (lost, cancelled) are counted back first if
        fewer than ``wanted`` are left: one pass for many values, none per take."""
        left = self.held_limit - self._counted - self.in_flight_bytes
        if left < wanted and self._held:
            for st, n in list(self._held.items()):
                if st.value is UNFETCHED or st.value is TAKEN or st.refs <= 0:
                    del self._held[st]
                    self._counted -= n
            left = self.held_limit - self._counted - self.in_flight_bytes
        return max(left, 0)

    def reserve(self, budget: int) -> int:
        """Count up to ``budget`` bytes for a request that brings results ahead, from
        its sending to its reply (:meth:`hold`, or :meth:`unreserve`): the bytes granted,
        0 when nothing is left under ``held_limit``. So a reply in flight is counted as
        the values held are, and requests of several threads together stay within it."""
        with self._lock:
            granted = min(budget, self._room(budget))
            self.in_flight_bytes += granted
        return granted

    def unreserve(self, reserved: int) -> None:
        """Give back ``reserved`` bytes of :meth:`reserve` (no request was sent)."""
        with self._lock:
            self.in_flight_bytes -= reserved

    def hold(self, states: dict, values: dict, sizes: dict, reserved: int = 0) -> None:
        """Keep ``values[key]`` (``sizes[key]`` bytes) for each of ``states`` (key ->
        state) still finished, held and not fetched, until :meth:`take`; those past
        ``held_limit`` are dropped. The reply that brought them ends the reservation of
        ``reserved`` bytes made for it."""
        held, limit = self._held, self.held_limit
        with self._lock:
            self.in_flight_bytes -= reserved
            if self._counted + sum(sizes.values()) > limit:
                self._room(limit + 1)  # count the values taken back first
            for key, st in states.items():
                n = sizes.get(key, 0)
                # fetchable(st), inline: a look at each of a map's values
                if key in values and st.value is UNFETCHED and st.status == "finished" \
                        and st.refs > 0 and self._counted + n <= limit:
                    st.value = values[key]
                    self._counted += n - held.get(st, 0)  # one taken before: its bytes
                    held[st] = n  # were still counted

    def take(self, st: FutureState) -> Any:
        """The value of ``st`` fetched ahead (it is then dropped here), else UNFETCHED.

        With no lock, as ``Future.result`` takes it: a value is only ever replaced by a
        marker, and two threads taking one value both return it, as two ``result()``
        calls of one future do. Its bytes are counted back by the next look at the room
        (:meth:`_room`), not here."""
        value = st.value
        if value is UNFETCHED or value is TAKEN or st.status != "finished":
            return UNFETCHED
        st.value = TAKEN
        return value

    # ------------------------------------------------------------ done callbacks
    def run_callbacks(self, cbs: list) -> None:
        """Queue the done callbacks a state change returned (see ``FutureState.finish``)."""
        if cbs:
            self._callbacks.put(cbs)

    def defer_callbacks(self, cbs: list) -> None:
        """:meth:`run_callbacks`, from a handler of scheduler messages: queued with those
        of the whole batch at its end (:meth:`batch_done`). The callback thread then wakes
        once per batch, and an ``as_completed`` takes the batch's futures at once, when
        each task's completion is a message of its own (single submissions)."""
        self._deferred += cbs

    def start(self, name: str) -> None:
        """Start the thread that runs done callbacks (named after the client ``name``)."""
        self.client_id = name
        self._thread = threading.Thread(target=self._callbacks.run,
                                        name=f"{name}-callbacks", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """No more release messages; the callback thread ends after what is queued."""
        self.closed = True
        self._callbacks.put(None)


class _Wait:
    """One :meth:`FutureTable.wait`: its states, how many of them (in order) are known
    done, and the event that wakes it. ``satisfied`` runs under the table's lock."""

    __slots__ = ("states", "done", "event")

    def __init__(self, states: list[FutureState]):
        self.states = states
        self.done = 0
        self.event = threading.Event()

    def satisfied(self) -> bool:
        states, i, n = self.states, self.done, len(self.states)
        while i < n and states[i]._is_done:  # done(), with no call per state
            i += 1
        self.done = i
        return i == n


class _Submitted:
    """The latest single submissions of a client, ``(key, state)`` in the order they were
    made, at most ``kept``: a loop of ``result()`` over a list of submits asks for them in
    that order, as it asks for a map's. Those settled at the front (done and fetched, or
    not to be fetched, or released) are dropped as the next results are looked for, so a
    look costs the results it may bring, not the submissions made."""

    def __init__(self, kept: int = 16_384) -> None:
        self._items: deque[tuple[Any, FutureState]] = deque(maxlen=kept)
        self._lock = threading.Lock()  # submits and result() may run on different threads

    def append(self, key: Any, state: FutureState) -> None:
        with self._lock:
            self._items.append((key, state))

    def ready(self, out: dict, limit: int) -> None:
        """Add the :func:`fetchable` states among the first ``limit`` kept to ``out`` (key
        -> state, up to ``limit`` entries)."""
        with self._lock:
            items = self._items
            while items:
                st = items[0][1]
                if st.refs > 0 and (not st._is_done or fetchable(st)):
                    break
                items.popleft()
            for key, st in itertools.islice(items, limit):
                if st._is_done and fetchable(st):
                    out[key] = st
                    if len(out) >= limit:
                        return


class _Callbacks:
    """The done callbacks to run, in order, on one thread: lists of ``(weakref of the
    future, fn, future)``. Which futures they are is visible (:meth:`ready`), so that the
    results a callback's ``result()`` asks for come with those of the callbacks after it.

    An ``as_completed``'s callback (:class:`~hpcsched.core.client.futures.Arrivals`) is
    called once for a run of entries in a row that name it, with their futures: a map's
    futures finished together reach their iterator with one lock and one wake-up."""

    def __init__(self) -> None:
        self._queue: deque = deque()
        self._cond = threading.Condition(threading.Lock())
        self._current: list = []  # the list being run, and the index of its entry running
        self._at = 0

    def put(self, cbs: list | None) -> None:
        """Queue ``cbs`` (None: stop after what is queued)."""
        with self._cond:
            self._queue.append(cbs)
            self._cond.notify()

    def ready(self, out: dict, limit: int) -> None:
        """Add to ``out`` (key -> state, up to ``limit`` entries) the futures of the
        callbacks to run whose results may be fetched ahead."""
        with self._cond:
            current, at = self._current, self._at
            for cbs in (current[at + 1:], *self._queue):
                for entry in cbs or ():
                    if len(out) >= limit:
                        return
                    st = entry[2].state  # fetchable(st), inline
                    if st.value is UNFETCHED and st.status == "finished" and st.refs > 0:
                        out[entry[2].key] = st

    def run(self) -> None:
        """Run the callbacks as they are queued, until None."""
        cond, q = self._cond, self._queue
        while True:
            with cond:
                while not q:
                    cond.wait()
                cbs = q.popleft()
                if cbs is None:
                    self._current = []
                    return
                self._current, self._at = cbs, 0
            fut = _strong = None
            i, n = 0, len(cbs)
            while i < n:
                ref, fn, _strong = cbs[i]
                self._at = i
                if type(fn) is Arrivals:  # the run of entries of fn, at once
                    j = i + 1
                    while j < n and cbs[j][1] is fn:
                        j += 1
                    self._at = j - 1
                    run_callback(fn.many, [entry[2] for entry in cbs[i:j]])
                    i = j
                    continue
                fut = ref()
                if fut is not None:
                    try:  # run_callback(), inline: one call less per future
                        fn(fut)
                    except Exception:
                        logger.exception("done callback %r of %r failed", fn, fut)
                i += 1
            with cond:
                self._current = []
            del cbs, fut, _strong  # or the last future stays alive while we wait
