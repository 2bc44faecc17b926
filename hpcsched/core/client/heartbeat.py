"""A client's watch over its scheduler: an unresponsive scheduler is a lost one.

A scheduler that died closes its connection and the client learns it at once.
One that hangs -- stopped (SIGSTOP, a debugger), swapping, its host gone from
the network -- leaves the connection open and silent, and without a watch
``gather()`` would wait forever. So the client pings: after
``client.heartbeat-interval`` seconds without a message from the scheduler it
sends a cheap request, and after ``client.scheduler-timeout`` seconds without
any message at all it declares the scheduler lost (its futures err with a
``ConnectionError`` naming the timeout), as dask.distributed's client does with
its heartbeat and comm timeouts.

Anything the scheduler sends counts as an answer, so a busy cluster costs no
pings; the timeout must exceed the longest single message the client expects
(a large ``gather`` reply is one message).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable

from hpcsched.core import config
from hpcsched.core.settings import ClientSettings


class SchedulerWatch:
    """Calls ``probe()`` when the scheduler has been silent for ``interval`` seconds and
    ``on_lost(reason)`` (once) after ``timeout`` seconds of silence; :meth:`heard` is called
    by the client's reader for every message."""

    def __init__(self, name: str, probe: Callable[[], None], on_lost: Callable[[str], None],
                 interval: float | None = None, timeout: float | None = None):
        settings = config.read(ClientSettings, heartbeat_interval=interval,
                               scheduler_timeout=timeout)
        self.interval = float(settings.heartbeat_interval)
        self.timeout = float(settings.scheduler_timeout)
        if self.interval <= 0 or self.timeout <= 0:
            raise ValueError(f"client.heartbeat-interval ({self.interval}) and "
                             f"client.scheduler-timeout ({self.timeout}) must be positive")
        self.last_heard = time.monotonic()
        self._stop = threading.Event()
        self._probe = probe
        self._on_lost = on_lost
        self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop),
                                        name=f"{name}-heartbeat", daemon=True)

    def start(self) -> SchedulerWatch:
        self._thread.start()
        return self

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> bool:
        """One look at the clock: probe or give up; False once the scheduler is lost."""
        silent = time.monotonic() - self.last_heard
        if silent >= self.timeout:
            self._stop.set()
            self._on_lost(f"the scheduler did not answer for {silent:.0f}s "
                          f"(client.scheduler-timeout={self.timeout:g})")
            return False
        if silent >= self.interval:
            self._probe()
        return True


def _run(ref: weakref.ref, stop: threading.Event) -> None:
    """The watch's thread; holds the watch (hence its client) only weakly, so that a client
    dropped without close() is still collected."""
    watch = ref()
    if watch is None:
        return
    step = min(watch.interval, watch.timeout) / 2
    del watch
    while not stop.wait(step):
        watch = ref()
        if watch is None or not watch.check():
            return
        del watch
