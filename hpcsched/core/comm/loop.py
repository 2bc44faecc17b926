"""The thread that owns a state machine, and the inbox that feeds it.

A server (and a client, for what its scheduler sends) has one :class:`Loop`:
the :class:`~hpcsched.core.comm.base.Inbox` that transports
(``Comm.deliver_to``), the thread pool and other threads put items on. Each iteration takes everything
pending (so a busy server handles large batches), hands the items to the
server's ``process`` callback, then calls ``flush`` once, which sends one
batched message per destination. Idle, the thread sleeps on a condition until
the next item or the next tick: no spinning. A producer may ``offer`` an item
(or ``offer_batch`` several) instead: if the loop is idle, the producer runs
that iteration itself (the MPI progress thread and the TCP I/O thread do,
saving a thread hand-off per message; the I/O thread offers everything one
round of socket events brought, so the iteration still handles a batch).

Other threads run code on the loop with :meth:`Loop.call` (the result comes
back through a ``concurrent.futures.Future``), so server state is only ever
touched by one thread at a time, the one running the current iteration.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm.base import Inbox
from hpcsched.core.settings import AdminSettings

logger = logging.getLogger("hpcsched.loop")

CLOSED = object()  # payload a reader puts when its comm closes
MAX_BATCH = 5000  # items per iteration, to keep flushing regularly under load
_LIVENESS_CHECK = 1.0  # seconds between two looks at the loop's thread in an unbounded call


_gc_tuned = False


def raise_gc_threshold() -> None:
    """Raise CPython's young-generation GC threshold (config ``admin.gc-threshold``) in a
    process that runs a scheduler or a worker; once per process, never lowered.

    A scheduler holds hundreds of thousands of long-lived task objects. With CPython's
    threshold of 700 allocations, the young collections after each graph arrives walk
    them again and again, and promote them to the older generations whose collections
    walk the whole heap, a cost per task that grows with the graph. Garbage that is not
    in a reference cycle is freed at once either way (reference counting); cyclic garbage
    waits a little longer. CPython's documentation of ``gc.set_threshold`` describes the generations;
    Instagram's "Dismissing Python Garbage Collection at Instagram" (2017) measured the
    same cost in a server process.
    """
    global _gc_tuned
    if _gc_tuned:
        return
    _gc_tuned = True
    wanted = config.read(AdminSettings).gc_threshold
    if wanted is None or wanted is False or str(wanted).lower() == "none":
        return
    if isinstance(wanted, bool) or not isinstance(wanted, (int, float, str)):
        raise ValueError(f"admin.gc-threshold: expected a whole number or None, got {wanted!r}")
    try:
        threshold = int(wanted)
    except ValueError:
        raise ValueError(f"admin.gc-threshold: expected a whole number or None, "
                         f"got {wanted!r}") from None
    first, *rest = gc.get_threshold()
    if threshold > first:
        gc.set_threshold(threshold, *rest)


class _Call:
    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[], Any], future: Future):
        self.fn = fn
        self.future = future


class Loop(Inbox):
    """The thread running ``process(items)`` then ``flush()`` for each batch of items put
    on it (module docstring), and ``tick(now)`` every ``tick_interval`` seconds.

    ``any_thread``: the receiver's code is short and never blocks, so a transport whose
    sends only queue may run it in its own thread (see ``Inbox.any_thread``); a client's
    loop is so. ``raise_gc``: a server's loop raises the process's GC threshold when it
    starts (:func:`~hpcsched.core.graph.dsk.raise_gc_threshold`); a client's leaves the
    user's process as it is.
    """

    def __init__(
        self,
        name: str,
        process: Callable[[list], None],
        flush: Callable[[], None],
        tick: Callable[[float], None] | None = None,
        tick_interval: float = 0.5,
        *,
        any_thread: bool = False,
        raise_gc: bool = True,
    ):
        self.name = name
        self.any_thread = any_thread
        self._raise_gc = raise_gc
        self._process = process
        self._flush = flush
        self._tick = tick
        self.tick_interval = tick_interval
        self._quiet_interval = 0.0  # quiet_ticks()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._items: deque = deque()
        self._busy = False  # a thread is running an iteration (state is taken)
        self._owner: int | None = None  # ... and this is its thread id

    def start(self) -> None:
        if self._raise_gc:
            raise_gc_threshold()  # a server runs in this process: see its docstring
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def put(self, item: Any) -> None:
        """Queue ``item`` for the loop's thread (from any thread)."""
        with self._lock:
            self._items.append(item)
            if not self._busy:
                self._wakeup.notify()

    def offer(self, item: Any) -> None:
        """Hand ``item`` over; an idle loop handles it in the calling thread (see
        :meth:`offer_batch`)."""
        self.offer_batch([item])

    def offer_batch(self, items: list) -> None:
        """Handle ``items`` now, in the calling thread, if the loop is idle (nothing
        queued, no iteration running): one iteration -- process, then flush -- as the
        loop thread would, saving the hand-off to it (a thread wake-up is costly on a
        busy, oversubscribed node). Otherwise queue them like :meth:`put`. Order is
        kept: items run inline only when everything put before them has run.

        Only for producers whose transport never blocks in ``send``: the handler may send
        to the very peer the producer reads for, and a send waiting for that peer to read
        while the producer is busy in the handler would deadlock both ends. MPI sends
        and TCP sends (queued per connection, written by the I/O thread) never wait."""
        with self._lock:
            if self._busy or self._items or self._stop or self._thread is None:
                self._items.extend(items)
                if not self._busy:
                    self._wakeup.notify()
                return
            self._busy = True
            self._owner = threading.get_ident()
        try:
            self._iteration(items)
        finally:
            with self._lock:
                self._busy = False
                self._owner = None
                if self._items or self._stop:
                    self._wakeup.notify()

    def quiet_ticks(self, interval: float | None) -> None:
        """Tick no more often than every ``interval`` seconds from the next tick on, or
        every ``tick_interval`` again (None): while a thread of this process must not be
        disturbed, as each tick takes Python's lock from it."""
        self._quiet_interval = interval or 0.0

    def _interval(self) -> float:
        return max(self.tick_interval, self._quiet_interval)

    def on_loop(self) -> bool:
        """Is the calling thread the one running the loop's code right now?"""
        return self._owner == threading.get_ident() or threading.current_thread() is self._thread

    def call(self, fn: Callable[[], Any], timeout: float | None = 30.0) -> Any:
        """Run ``fn()`` on the loop thread and return its result (raises its exception).

        ``timeout`` bounds code that is brief by nature (a lookup, a handler). Code whose
        duration grows with the state it works on (a journal's restore) passes None: the
        call then waits as long as the loop runs it, and ends with a RuntimeError if the
        loop's thread ends first, so that a dead loop never leaves its caller waiting."""
        if self.on_loop():
            return fn()
        if self.stopped.is_set():
            raise RuntimeError(f"{self.name} is closed")
        fut: Future = Future()
        self.put(_Call(fn, fut))
        if timeout is not None:
            return fut.result(timeout)
        while True:
            try:
                return fut.result(_LIVENESS_CHECK)
            except FutureTimeout:
                thread = self._thread
                if self.stopped.is_set() or thread is None or not thread.is_alive():
                    if fut.done():  # its answer came with the loop's last turn
                        return fut.result()
                    raise RuntimeError(f"{self.name} ended before running the call") from None

    def stop(self, join: bool = True, timeout: float = 5.0) -> None:
        with self._lock:
            self._stop = True
            self._wakeup.notify()
        if join and self._thread is not None and not self.on_loop():
            self._thread.join(timeout)

    def _run(self) -> None:
        next_tick = time.monotonic() + self._interval()
        items = self._items
        me = threading.get_ident()
        try:
            while True:
                with self._lock:
                    while not self._stop and (self._busy or not items):
                        if self._tick is not None:
                            wait = next_tick - time.monotonic()
                            if wait <= 0 and not self._busy:
                                break
                            self._wakeup.wait(max(wait, 0.001))
                        else:
                            self._wakeup.wait()
                    if self._stop:
                        break
                    batch = [items.popleft() for _ in range(min(len(items), MAX_BATCH))]
                    self._busy = True
                    self._owner = me
                try:
                    if self._tick is not None and time.monotonic() >= next_tick:
                        next_tick = time.monotonic() + self._interval()
                        self._iteration(batch, tick=True)
                    else:
                        self._iteration(batch)
                finally:
                    with self._lock:
                        self._busy = False
                        self._owner = None
        finally:
            self.stopped.set()
            # fail pending calls instead of leaving callers blocked
            with self._lock:
                left = list(items)
                items.clear()
            for item in left:
                if type(item) is _Call and not item.future.done():
                    item.future.set_exception(RuntimeError(f"{self.name} closed"))

    def _iteration(self, items: list, tick: bool = False) -> None:
        work: list = []
        for item in items:
            if type(item) is _Call:
                if work:
                    self._safe_process(work)
                    work = []
                try:
                    item.future.set_result(item.fn())
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    item.future.set_exception(e)
            elif item is not None:
                work.append(item)
        if work:
            self._safe_process(work)
        if tick and self._tick is not None:
            try:
                self._tick(time.time())
            except Exception:
                logger.exception("%s: error in periodic tick", self.name)
        try:
            self._flush()
        except Exception:
            logger.exception("%s: error while sending", self.name)

    def _safe_process(self, work: list) -> None:
        try:
            self._process(work)
        except Exception:
            logger.exception("%s: error while handling %d messages", self.name, len(work))
