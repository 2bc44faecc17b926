"""A worker whose scheduler vanished keeps its results and finds the scheduler again.

A scheduler that dies unannounced (killed, its node rebooted) may be restarted
with its journal (:mod:`hpcsched.core.scheduler.journal`) at the same address,
or at another one written to the scheduler file. For
``worker.scheduler-reconnect-timeout`` seconds the worker goes on running the
tasks it has and holding every result, while a :class:`Reconnect` thread tries
the scheduler file (re-read each time) or the address, with a backoff that
starts small (:func:`hpcsched.core.comm.scheduler_file.find_again`). It registers as a worker
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
from collections.abc import Callable
from typing import Any

from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Comm, CommClosedError, Security
from hpcsched.core.comm.scheduler_file import find_again
from hpcsched.core.protocol.wire import MalformedMessage

logger = logging.getLogger("hpcsched.worker")


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

    def _attempt(self, address: str, security: Security | None, seconds: float) -> Any:
        comm = registry.connect(address, timeout=seconds, security=security)
        try:
            return comm, self._register(comm, seconds)
        except BaseException:
            comm.close()
            raise

    def _run(self) -> None:
        try:
            found = find_again(self.address, self.security, self.scheduler_file, self.timeout,
                               self._attempt, (OSError, TimeoutError, CommClosedError,
                                               MalformedMessage, RuntimeError), self._closed)
        except TimeoutError as e:
            self._give_up(f"{e} (worker.scheduler-reconnect-timeout)")
            return
        if found is None:
            return  # the worker closed meanwhile
        (comm, reply), address, security = found
        logger.info("reconnected to the scheduler at %s", address)
        self.address, self.security = address, security
        try:
            self._attach(comm, address, reply)
        except RuntimeError:  # the worker closed meanwhile
            comm.close()
