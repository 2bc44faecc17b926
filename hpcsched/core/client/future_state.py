"""A client's futures: each key's state, its reference count, and the done callbacks.

Every :class:`~hpcsched.core.client.futures.Future` of a client registers with the
client's :class:`FutureTable` (``Future.__init__`` and ``Future.release``); the
client's handling of scheduler messages moves the states along through it (``key-in-memory``,
``task-erred``, ``cancelled-keys``), and ``gather`` waits until all its futures are done.
A key's last Future released tells the scheduler, as dask.distributed's client
does (https://distributed.dask.org/en/stable/memory.html).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from hpcsched.core.client.futures import FutureState, run_callback
from hpcsched.core.protocol.messages import ClientReleasesKeys


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

    def __init__(self, post: Callable[[Any], Any]):
        self.states: dict[Any, FutureState] = {}
        self.changed = threading.Condition()  # guards _waits
        self._waits: list[_Wait] = []  # gather calls blocked in wait()
        self.closed = False
        self._lock = threading.Lock()
        self._post = post
        self.client_id = ""  # the client's id, set by start()
        self._callback_q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

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
            self.run_callbacks(st.error(exception, traceback, text))

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

    def run_callbacks(self, cbs: list) -> None:
        """Queue the done callbacks a state change returned (see ``FutureState.finish``)."""
        if cbs:
            self._callback_q.put(cbs)

    def start(self, name: str) -> None:
        """Start the thread that runs done callbacks (named after the client ``name``)."""
        self.client_id = name
        self._thread = threading.Thread(target=_callback_loop, args=(self._callback_q,),
                                        name=f"{name}-callbacks", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """No more release messages; the callback thread ends after what is queued."""
        self.closed = True
        self._callback_q.put(None)


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


def _callback_loop(q: queue.SimpleQueue) -> None:
    while True:
        cbs = q.get()
        if cbs is None:
            return
        fut = _strong = None
        for ref, fn, _strong in cbs:
            fut = ref()
            if fut is not None:
                run_callback(fn, fut)
        del cbs, fut, _strong  # or the last future stays alive while we wait
