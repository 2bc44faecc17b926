"""The one I/O thread of a process: a ``selectors`` loop over every TCP socket.

Listeners, handshakes in progress and connections are *handlers*: objects with
``on_event(mask)``, registered with the selector and run on this thread only.
Nothing on it blocks: sockets are non-blocking, and reads, writes and the
authentication handshake are state machines advanced by readiness events. So
an unauthenticated peer costs a socket and a few hundred bytes, never a thread,
and a peer that stops reading stalls only its own outgoing queue.

Other threads reach the loop through :meth:`IOThread.call_soon` (thread-safe;
wakes the selector through a socket pair). Timeouts (handshakes, messages
that started and never finished, lingering closes) are :meth:`call_later`
timers on a heap: an idle process sleeps in ``select`` until the next deadline,
and wakes for nothing else.

The thread exists while something uses it: :func:`acquire` starts it for the
first listener or connection, :meth:`IOThread.release` by the last one ends it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger("hpcsched.comm")

READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE
#: cancelled timers the heap may hold before a purge is considered (as asyncio's loop)
PURGE_AT = 100


class Handler(Protocol):
    def on_event(self, mask: int) -> None: ...


class Timer:
    """A pending :meth:`IOThread.call_later`; ``cancel()`` from the I/O thread."""

    __slots__ = ("when", "fn", "cancelled", "_io")

    def __init__(self, when: float, fn: Callable[[], None], io: IOThread | None = None):
        self.when = when
        self.fn = fn
        self.cancelled = False
        self._io = io

    def cancel(self) -> None:
        if self.cancelled:
            return  # cancelled already, or it ran
        self.cancelled = True
        # it stays in the heap until its time or the next purge (IOThread._cancelled):
        # without what it would have called (a connection, and through it the server
        # it delivered to)
        self.fn = _nothing
        if self._io is not None:
            self._io._cancelled += 1


def _nothing() -> None:
    pass


class IOThread:
    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, READ, None)
        self._lock = threading.Lock()
        self._calls: deque = deque()
        self._woken = False
        self._timers: list[tuple[float, int, Timer]] = []
        self._cancelled = 0  # cancelled timers still on the heap
        self._seq = itertools.count()
        self.users = 0
        self.exiting = False
        self._thread = threading.Thread(target=self._run, name="hpcsched-tcp-io", daemon=True)
        self._ident: int | None = None
        self._deliveries: dict[int, tuple[Any, list]] = {}  # id(inbox) -> (inbox, items)

    # ------------------------------------------------------------ any thread
    def on_thread(self) -> bool:
        return threading.get_ident() == self._ident

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the I/O thread, after what is already queued."""
        with self._lock:
            self._calls.append((fn, args))
            wake = not self._woken
            self._woken = True
        if wake and not self.on_thread():
            try:
                self._wake_w.send(b"\0")
            except (BlockingIOError, OSError):
                pass  # already woken (buffer full) or shutting down

    def release(self) -> None:
        """One user is done; the last one ends the thread."""
        global _current
        with _current_lock:
            self.users -= 1
            if self.users > 0:
                return
            self.exiting = True
            if _current is self:
                _current = None
        self.call_soon(lambda: None)  # wake the loop so it sees ``exiting``

    # ------------------------------------------------------------ the I/O thread only
    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        t = Timer(time.monotonic() + delay, fn, self)
        timers = self._timers
        if self._cancelled > PURGE_AT and 2 * self._cancelled > len(timers):
            # most of the heap is cancelled timers, which would stay until their deadline
            # (a message timeout: minutes, of a timer per message read in parts); keeping
            # only the live ones costs O(heap) once per as many cancellations
            timers[:] = [e for e in timers if not e[2].cancelled]
            heapq.heapify(timers)
            self._cancelled = 0
        heapq.heappush(timers, (t.when, next(self._seq), t))
        return t

    def deliver(self, inbox: Any, item: Any) -> None:
        """Hand ``item`` to ``inbox`` once this round of events is handled, together with
        every other item for it: a server's loop then handles all the messages that
        arrived at once, from every peer, in one iteration (one flush per destination)."""
        entry = self._deliveries.get(id(inbox))
        if entry is None:
            self._deliveries[id(inbox)] = (inbox, [item])
        else:
            entry[1].append(item)

    def _hand_over(self) -> None:
        while self._deliveries:
            batch, self._deliveries = self._deliveries, {}
            for inbox, items in batch.values():
                try:
                    inbox.offer_batch(items)  # an idle loop runs its iteration here
                except Exception:
                    logger.exception("delivering %d messages to %r failed", len(items), inbox)

    def register(self, sock: socket.socket, events: int, handler: Handler) -> None:
        self._selector.register(sock, events, handler)

    def modify(self, sock: socket.socket, events: int, handler: Handler) -> None:
        self._selector.modify(sock, events, handler)

    def unregister(self, sock: socket.socket) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _run(self) -> None:
        self._ident = threading.get_ident()
        timers = self._timers
        try:
            # each step in a method of its own: what it handled (a connection, a callback
            # and the server behind it) is not held by this frame while it waits
            while not self.exiting:
                timeout = None
                while timers and timers[0][2].cancelled:
                    heapq.heappop(timers)
                    self._cancelled -= 1
                if timers:
                    timeout = max(timers[0][0] - time.monotonic(), 0.0)
                if self._calls:
                    timeout = 0.0
                self._dispatch(self._selector.select(timeout))
                self._hand_over()
                self._run_calls()
                self._run_timers()
                self._hand_over()
        finally:
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _dispatch(self, events: list) -> None:
        for key, mask in events:
            handler = key.data
            if handler is None:
                self._drain_wakeups()
                continue
            try:
                handler.on_event(mask)
            except Exception:  # a bug in one connection must not stop the others
                logger.exception("I/O handler %r failed", handler)

    def _run_calls(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, deque()
            self._woken = False
        for fn, args in calls:
            try:
                fn(*args)
            except Exception:
                logger.exception("I/O callback %r failed", fn)

    def _run_timers(self) -> None:
        timers = self._timers
        now = time.monotonic()
        while timers and (timers[0][2].cancelled or timers[0][0] <= now):
            _, _, t = heapq.heappop(timers)
            if t.cancelled:
                self._cancelled -= 1
            else:
                t.cancelled = True
                try:
                    t.fn()
                except Exception:
                    logger.exception("I/O timer %r failed", t.fn)

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass


_current: IOThread | None = None
_current_lock = threading.Lock()


def acquire() -> IOThread:
    """The process's I/O thread, started if needed; call ``release()`` when done with it."""
    global _current
    with _current_lock:
        io = _current
        if io is None:
            io = _current = IOThread()
            io._thread.start()
        io.users += 1
    return io


def _forget_after_fork() -> None:
    # a forked child has no I/O thread, only the parent's bookkeeping of it
    global _current, _current_lock
    _current = None
    _current_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
