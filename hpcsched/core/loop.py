"""The thread that owns a state machine, and the reader threads that feed it.

A server has one :class:`Loop`: an inbox (a ``queue.SimpleQueue``) that reader
threads, the thread pool and other threads put items on. Each iteration takes
everything pending (so a busy server handles large batches), hands the items
to the server's ``process`` callback, then calls ``flush`` once, which sends
one batched message per destination. Idle, the thread sleeps in
``SimpleQueue.get`` until the next item or the next tick: no spinning.

Other threads run code on the loop with :meth:`Loop.call` (the result comes
back through a ``concurrent.futures.Future``), so server state is only ever
touched by the loop thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from hpcsched.core.comm.base import Comm, CommClosedError

logger = logging.getLogger("hpcsched.loop")

CLOSED = object()  # payload a reader puts when its comm closes
MAX_BATCH = 5000  # items per iteration, to keep flushing regularly under load


class _Call:
    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[], Any], future: Future):
        self.fn = fn
        self.future = future


class Loop:
    def __init__(
        self,
        name: str,
        process: Callable[[list], None],
        flush: Callable[[], None],
        tick: Callable[[float], None] | None = None,
        tick_interval: float = 0.5,
    ):
        self.name = name
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._process = process
        self._flush = flush
        self._tick = tick
        self.tick_interval = tick_interval
        self._thread: threading.Thread | None = None
        self._stop = False
        self.stopped = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def put(self, item: Any) -> None:
        self.inbox.put(item)

    def call(self, fn: Callable[[], Any], timeout: float | None = 30.0) -> Any:
        """Run ``fn()`` on the loop thread and return its result (raises its exception)."""
        if threading.current_thread() is self._thread:
            return fn()
        if self.stopped.is_set():
            raise RuntimeError(f"{self.name} is closed")
        fut: Future = Future()
        self.inbox.put(_Call(fn, fut))
        return fut.result(timeout)

    def stop(self, join: bool = True, timeout: float = 5.0) -> None:
        self._stop = True
        self.inbox.put(None)
        if join and self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        next_tick = time.monotonic() + self.tick_interval
        get = self.inbox.get
        get_nowait = self.inbox.get_nowait
        try:
            while not self._stop:
                wait = max(next_tick - time.monotonic(), 0.0) if self._tick else None
                items: list = []
                try:
                    items.append(get(timeout=wait))
                    while len(items) < MAX_BATCH:
                        items.append(get_nowait())
                except queue.Empty:
                    pass
                work = []
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
                if self._tick is not None and time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + self.tick_interval
                    try:
                        self._tick(time.time())
                    except Exception:
                        logger.exception("%s: error in periodic tick", self.name)
                try:
                    self._flush()
                except Exception:
                    logger.exception("%s: error while sending", self.name)
        finally:
            self.stopped.set()
            # fail pending calls instead of leaving callers blocked
            while True:
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
                if type(item) is _Call and not item.future.done():
                    item.future.set_exception(RuntimeError(f"{self.name} closed"))

    def _safe_process(self, work: list) -> None:
        try:
            self._process(work)
        except Exception:
            logger.exception("%s: error while handling %d messages", self.name, len(work))


def start_reader(comm: Comm, source: Any, inbox: queue.SimpleQueue,
                 name: str) -> threading.Thread | None:
    """Have ``(source, message)`` put on ``inbox`` for every message of ``comm``, then
    ``(source, CLOSED)`` when it closes: by the backend itself where it can
    (``Comm.deliver_to``), else by a reader thread (returned)."""
    if comm.deliver_to(inbox, source, CLOSED):
        return None

    def run() -> None:
        try:
            while True:
                msg = comm.recv()
                inbox.put((source, msg))
        except (CommClosedError, OSError, EOFError):
            pass
        except Exception:
            logger.exception("reader for %s failed", source)
        finally:
            inbox.put((source, CLOSED))

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t
