"""A worker's link to its scheduler: the connection, registration, the outgoing batch,
and finding a vanished scheduler again.

:class:`SchedulerLink` owns the comm to the scheduler and what waits to leave on it. It
connects (attempts of :data:`CONNECT_ATTEMPT` seconds until ``death_timeout``, so that a
batch job's log says early why the scheduler is out of reach), registers the worker
(``register-worker``, answered ``registered`` or ``register-error``), and hands the
scheduler's batches to the worker's loop as :class:`~.inbox.FromScheduler` items. On the
loop, protocol records wait in its outbox until the loop flushes, where each is encoded
once; work that must start only once they left (a task that announces its start, a
thread of ranges: should it kill the process, the scheduler knows what came before)
waits with them.

A scheduler that keeps a journal says so when it registers us. Lost unannounced, such
a scheduler is looked for again for ``worker.scheduler-reconnect-timeout`` seconds
(:class:`~hpcsched.core.worker.reconnect.Reconnect`), the worker registering with the
results it holds; the link tells the worker whether to wait (:meth:`SchedulerLink.
reconnects`).

The link knows the worker through a few callables (:class:`LinkOwner`), never the
worker itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Comm, CommClosedError, Security
from hpcsched.core.comm.loop import Loop
from hpcsched.core.protocol import records
from hpcsched.core.protocol.directions import SCHEDULER_TO_WORKER
from hpcsched.core.protocol.records import Record
from hpcsched.core.protocol.wire import MalformedMessage, decode, encode
from hpcsched.core.protocol.worker import HeartbeatInterval, Registered, RegisterWorker
from hpcsched.core.state import events as ev
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.worker.parts.inbox import SCHEDULER_GONE, CommInbox, FromScheduler
from hpcsched.core.worker.reconnect import Reconnect

logger = logging.getLogger("hpcsched.worker")

CONNECT_ATTEMPT = 10.0  # seconds: one attempt to reach the scheduler, then a warning


class LinkOwner(Record):
    """What the link uses of its worker.

    ``comms``: the inbox its comms deliver to; ``inventory()``: on the loop, the results it
    holds (key -> nbytes) and the tasks it
    runs; ``heartbeat_interval(record)``: the interval the scheduler's registration
    answer asks for; ``want_usage(wanted)``: whether that answer asks for each task's CPU
    seconds and peak memory; ``give_up(reason)``: the scheduler is lost for good, close;
    ``closed``: set once the worker closes.
    """

    loop: Loop
    comms: CommInbox
    inventory: Callable[[], tuple[dict, list]]
    heartbeat_interval: Callable[[HeartbeatInterval], Any]
    want_usage: Callable[[bool], Any]
    give_up: Callable[[str], None]
    closed: threading.Event


class SchedulerLink:
    """The worker's comm to the scheduler at ``address`` and its outgoing batch (module
    docstring). ``reconnect_timeout``: 0 where the transport cannot reconnect."""

    def __init__(
        self,
        address: str,
        security: Security | None,
        scheduler_file: str | None,
        death_timeout: float,
        reconnect_timeout: float,
        owner: LinkOwner,
    ):
        self.address = address
        self.security = security
        #: where a restarted scheduler may write its new address (re-read to reconnect)
        self.scheduler_file = scheduler_file
        self.death_timeout = death_timeout
        self.reconnect_timeout = reconnect_timeout
        self.journaled = False  # from the scheduler's answer to our registration
        self.close_asked = False  # the scheduler said "close" (its exit code stands)
        self._owner = owner
        self._comm: Comm | None = None
        self._outbox: list = []  # protocol records for the scheduler, encoded when flushed
        self._after_flush: list[tuple] = []  # (function, *args) run once the outbox left
        self._sent_inventory: dict = {}  # the keys our last registration said we hold
        self._registration: RegisterWorker | None = None  # the worker's introduction

    # ---------------------------------------------------------------- connecting
    def open(self, registration: RegisterWorker) -> None:
        """Connect and register with ``registration`` (sent again, with the results held,
        to a scheduler found again), within ``death_timeout``; raises ``TimeoutError`` or
        ``ConnectionError`` (the comm closed) when that fails."""
        self._registration = registration
        comm = self._connect(registration.address)
        try:
            reply = self._register(comm, self.death_timeout, {})
        except ConnectionError:
            comm.close()
            raise
        self._attach(comm, reply)

    def _connect(self, worker_address: str) -> Comm:
        deadline = time.monotonic() + self.death_timeout
        last: Exception | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"worker could not reach the scheduler at {self.address} within "
                    f"death_timeout={self.death_timeout}s: {last}"
                )
            try:
                return registry.connect(
                    self.address, timeout=min(left, CONNECT_ATTEMPT), security=self.security
                )
            except (TimeoutError, OSError) as e:
                if isinstance(e, ConnectionError) and "refused our credentials" in str(e):
                    raise
                if last is None:
                    logger.warning(
                        "worker %s cannot reach the scheduler at %s yet: %s; "
                        "trying until death_timeout=%gs",
                        worker_address,
                        self.address,
                        e,
                        self.death_timeout,
                    )
                last = e
                time.sleep(min(0.2, max(left, 0)))

    def _register(self, comm: Comm, timeout: float, keys: dict, running: list | None = None) -> Any:
        """Introduce the worker over ``comm``; the scheduler's answer (``ConnectionError``
        if it refused us or did not answer)."""
        assert self._registration is not None  # open() set it
        comm.send(
            [encode(records.replace(self._registration, keys=keys, running=running or None))]
        )
        try:
            reply = comm.recv(timeout=timeout)
        except (CommClosedError, TimeoutError) as e:
            raise ConnectionError(
                f"scheduler at {self.address} did not answer our registration: {e}"
            ) from e
        first = reply[0] if isinstance(reply, list) and reply else reply
        try:
            answer = decode(SCHEDULER_TO_WORKER, first)
        except MalformedMessage as e:
            answer = e
        if type(answer) is not Registered:
            why = getattr(answer, "message", answer)  # RegisterError's, or what was wrong
            raise ConnectionError(f"scheduler at {self.address} refused us: {why}")
        return reply

    def _attach(self, comm: Comm, reply: Any) -> None:
        """Talk to the scheduler over ``comm``, which registered us (``reply``: its
        answer, ``registered`` first)."""
        self._comm = comm
        answer = decode(SCHEDULER_TO_WORKER, reply[0] if isinstance(reply, list) else reply)
        if answer.heartbeat_interval:
            self._owner.heartbeat_interval(HeartbeatInterval(answer.heartbeat_interval))
        # only a scheduler with a journal comes back with what it knew: waiting for any
        # other would keep this worker (and its batch job) alive for nothing
        self.journaled = answer.journaled
        self._owner.want_usage(answer.usage)
        loop = self._owner.loop
        if isinstance(reply, list) and len(reply) > 1:
            # tasks assigned at registration travel in the same batch as "registered"
            loop.put(FromScheduler(reply[1:]))
        self._owner.comms.take_from(comm, FromScheduler, SCHEDULER_GONE)

    # ---------------------------------------------------------------- losing it
    def reconnects(self) -> bool:
        """On the loop, the comm closed: whether to look for the scheduler again."""
        return (
            self.reconnect_timeout > 0
            and self.journaled
            and not self.close_asked
            and not self._owner.closed.is_set()
        )

    def lose(self, worker_address: str) -> None:
        """On the loop: the scheduler vanished; look for it again on a thread."""
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.close()
        logger.warning(
            "worker %s lost its scheduler at %s: keeping its tasks and results, "
            "reconnecting for up to %ss",
            worker_address,
            self.address,
            self.reconnect_timeout,
        )
        owner = self._owner
        Reconnect(
            self.address,
            self.security,
            self.scheduler_file,
            self.reconnect_timeout,
            self._register_again,
            self._reattach,
            owner.give_up,
            owner.closed,
        ).start()

    def _register_again(self, comm: Comm, timeout: float) -> Any:
        keys, running = self._owner.loop.call(self._owner.inventory)
        self._sent_inventory = keys
        return self._register(comm, timeout, keys, running)

    def _reattach(self, comm: Comm, address: str, reply: Any) -> None:
        def attach() -> None:
            if self._owner.closed.is_set():
                comm.close()
                return
            self.address = address
            # what waited for the scheduler: only the results that finished after the
            # registration's inventory are news to it (that inventory said the rest)
            sent = self._sent_inventory
            self._outbox = [
                m for m in self._outbox if type(m) is ev.TaskFinished and m.key not in sent
            ]
            self._attach(comm, reply)

        self._owner.loop.call(attach)

    # ---------------------------------------------------------------- the batch
    def send(self, record: Any) -> None:
        """On the loop: ``record`` leaves with this iteration's batch."""
        self._outbox.append(record)

    def after_flush(self, start: tuple) -> None:
        """On the loop: ``(function, *args)`` is called once this iteration's batch left."""
        self._after_flush.append(start)

    def flush(self) -> None:
        """On the loop, once per iteration: the batch leaves, encoded; then what waited."""
        if self._outbox and self._comm is not None:
            msgs, self._outbox = self._outbox, []
            try:  # encoded once, here: records until they leave
                self._comm.send([encode(m) for m in msgs])
            except (CommClosedError, OSError):
                pass
        if self._after_flush:
            starts, self._after_flush = self._after_flush, []
            for fn, *args in starts:
                fn(*args)

    def close(self) -> None:
        if self._comm is not None:
            self._comm.close()


def inventory(state: WorkerState | None) -> tuple[dict, list]:
    """On the loop: the results a worker holds (key -> nbytes), the tasks it runs: what it
    registers with when it found its scheduler again."""
    assert state is not None
    held = {k: max(ts.nbytes, 0) for k, ts in state.tasks.items() if ts.state == "memory"}
    return held, [ts.key for ts in state.executing | state.long_running]
