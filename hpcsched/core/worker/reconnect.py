"""A worker whose scheduler vanished keeps its results and finds the scheduler again.

A scheduler that dies unannounced (killed, its node rebooted) may be restarted
with its journal (:mod:`hpcsched.core.scheduler.journal`) at the same address,
or at another one written to the scheduler file. For
``worker.scheduler-reconnect-timeout`` seconds the worker goes on running the
tasks it has and holding every result, while a :class:`Reconnect` thread tries
the scheduler file (re-read each time) or the address, with a backoff that
starts small and doubles up to :data:`MAX_DELAY`. It registers as a worker
that already holds data: the ``keys`` of its ``register-worker`` are the
results it holds, with their sizes, so the scheduler takes them as in memory and
runs again only what nobody holds. Tasks still running then report their results
when they finish, as any task does. Past the timeout, the worker exits as one
whose scheduler is lost (a batch job never outlives a scheduler that does not
come back).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Comm, CommClosedError, Security
from hpcsched.core.comm.scheduler_file import read_scheduler_file
from hpcsched.core.protocol.messages import MalformedMessage

logger = logging.getLogger("hpcsched.worker")

FIRST_DELAY = 0.1  # seconds between the first attempts: a restart takes about a second
MAX_DELAY = 5.0
ATTEMPT_TIMEOUT = 10.0  # seconds one connection and registration may take


class Reconnect:
    """One search for a lost scheduler, on its own thread.

    ``register(comm) -> reply``: the worker's registration over a new comm (raises
    ``ConnectionError`` when refused); ``attach(comm, address, reply)``: hand the comm
    to the worker; ``give_up(reason)``: close the worker.
    """

    def __init__(self, address: str, security: Security | None, scheduler_file: str | None,
                 timeout: float, register: Callable[[Comm, float], Any],
                 attach: Callable[[Comm, str, Any], None],
                 give_up: Callable[[str], None], closed: threading.Event):
        self.address, self.security, self.scheduler_file = address, security, scheduler_file
        self.timeout = timeout
        self._register, self._attach, self._give_up = register, attach, give_up
        self._closed = closed
        self.thread = threading.Thread(target=self._run, name="hpcsched-reconnect", daemon=True)

    def start(self) -> Reconnect:
        self.thread.start()
        return self

    def _where(self) -> tuple[str, Security | None]:
        """The scheduler's address and secret: the scheduler file's, if it can be read
        (a restart elsewhere writes its new address there), else the last known."""
        if self.scheduler_file:
            try:
                return read_scheduler_file(self.scheduler_file)
            except ValueError:
                pass  # not rewritten yet
        return self.address, self.security

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        delay = FIRST_DELAY
        last: Exception | None = None
        while not self._closed.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                self._give_up(f"the scheduler did not come back within "
                              f"worker.scheduler-reconnect-timeout={self.timeout}s "
                              f"(last error: {last})")
                return
            address, security = self._where()
            comm = None
            try:
                comm = registry.connect(address, timeout=min(left, ATTEMPT_TIMEOUT),
                                        security=security)
                reply = self._register(comm, min(left, ATTEMPT_TIMEOUT))
            except (OSError, TimeoutError, CommClosedError, MalformedMessage, RuntimeError) as e:
                last = e
                if comm is not None:
                    comm.close()
                self._closed.wait(min(delay, max(left, 0.0)))
                delay = min(delay * 2, MAX_DELAY)
                continue
            logger.info("reconnected to the scheduler at %s", address)
            self.address, self.security = address, security
            try:
                self._attach(comm, address, reply)
            except RuntimeError:  # the worker closed meanwhile
                comm.close()
            return
