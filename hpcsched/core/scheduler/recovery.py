"""A scheduler's recovery after a restart: its journal, and the peers it waits for.

A journaled scheduler (``scheduler.journal``, :mod:`.journal`) comes back where
it was: at the address, with the secret, it had (:meth:`Recovery.listen`,
:meth:`Recovery.security`), with the graphs, clients and coordination
primitives its journal holds (:meth:`Recovery.restore`). Then it waits:

* for the clients it knew, ``scheduler.journal-client-grace`` seconds each; one
  that does not come back wants nothing any more (:meth:`Recovery.tick` names
  it, the server lets go of its keys and leases);
* for the workers it knew, with what they hold: those that come back get no
  work until all are back, or ``scheduler.journal-worker-grace`` seconds have
  passed -- else the first back would be given tasks whose inputs the next one
  brings.

A scheduler without a journal has a :class:`Recovery` too, which waits for
nobody and records nothing.

Runs on the scheduler's loop thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Container, Mapping
from typing import Any

from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Security
from hpcsched.core.protocol import messages as pr
from hpcsched.core.protocol import records
from hpcsched.core.scheduler.interfaces import ServerOps
from hpcsched.core.scheduler.journal import RESTORE_CLIENT, Journal
from hpcsched.core.scheduler.outbox import Outbox
from hpcsched.core.scheduler.primitives import SECTION as PRIMITIVES
from hpcsched.core.scheduler.primitives import Primitives
from hpcsched.core.settings import SchedulerServerSettings
from hpcsched.core.state import events as ev

logger = logging.getLogger("hpcsched.scheduler")


def open_journal(settings: SchedulerServerSettings) -> Journal | None:
    """The journal ``settings`` name (None: none), with their fsync and compaction."""
    if not settings.journal:
        return None
    return Journal(os.path.expanduser(str(settings.journal)), bool(settings.journal_fsync),
                   settings.journal_compact_bytes)


class Recovery:
    """The journal (None: none) and the clients and workers a restored scheduler awaits."""

    def __init__(self, settings: SchedulerServerSettings, server: ServerOps):
        self._server = server
        #: what a restart needs (``scheduler.journal``): see :mod:`.journal`
        self.journal = open_journal(settings)
        self._client_grace = float(settings.journal_client_grace)
        self._worker_grace = float(settings.journal_worker_grace)
        # restored clients (by id) that have until then (monotonic) to come back
        self._awaited_clients: dict[str, float] = {}
        # the workers the journal knew, not back yet; those back, given no work until all
        # are (or until _hold_until, monotonic; 0: not holding)
        self._awaited_workers: set[str] = set()
        self._held_workers: list[str] = []
        self._hold_until = 0.0
        #: called each loop turn before the journal is written, by what must be in the
        #: operating system's hands no later than it (a task history's rows)
        self.before_sync: list[Callable[[], None]] = []

    # ------------------------------------------------------------ starting again
    def security(self, given: Security | None) -> Security | None:
        """``given``, with the secret the journal kept: peers that outlived the scheduler
        prove the secret they had."""
        if self.journal is not None and self.journal.meta.get("secret"):
            return records.replace(given or Security(),
                                       secret=bytes.fromhex(self.journal.meta["secret"]))
        return given

    def listen(self, address: str, on_connect: Callable[[Any], None],
               security: Security | None) -> Any:
        """Listen where the journal says this scheduler listened (its workers and clients
        come back there), else (or if that address is taken) at ``address``."""
        journaled = self.journal.meta.get("address") if self.journal is not None else None
        if journaled:
            try:
                return registry.listen(journaled, on_connect, security)
            except OSError as e:
                logger.warning("cannot listen at %s again (%s): listening at %s; peers find "
                               "it in the scheduler file", journaled, e, address)
        return registry.listen(address, on_connect, security)

    def listening(self, address: str, security: Security | None) -> None:
        """Record where the scheduler listens, and its secret, for its next start."""
        if self.journal is not None:
            self.journal.set_meta({"address": address,
                                   "secret": security.secret_hex() if security else ""})
            self.journal.sync()

    def restore(self, table: Mapping[type, Callable[[str, Any], None]],
                primitives: Primitives, outbox: Outbox) -> None:
        """Rebuild the journal's graphs, clients and datasets (on the loop, before anyone
        connects): its messages are handed to ``table``'s handlers as when they arrived."""
        journal, server = self.journal, self._server
        if journal is None:
            return
        now = time.time()
        for client in journal.clients:
            server.handle_event(ev.AddClient(client, now=now,
                                             stimulus_id=server.stimulus("restore-client")))
            self._awaited_clients[client] = time.monotonic() + self._client_grace
        records = list(journal.restore_messages())
        # the restore's last record lets go of the keys it held: after the primitives
        # hold theirs (the futures stored in variables and queues)
        release = records.pop() if records and records[-1][0] == RESTORE_CLIENT and \
            records[-1][1].__class__ is pr.ClientReleasesKeys else None
        for client, record in records:
            table[type(record)](client, record)
        for holder in primitives.restore(journal.sections.get(PRIMITIVES)):
            self._awaited_clients.setdefault(holder, time.monotonic() + self._client_grace)
        if release is not None:
            table[pr.ClientReleasesKeys](*release)
        outbox.clear()  # answers to clients not connected yet
        journal.compact()
        self._awaited_workers = set(journal.workers)
        if self._awaited_workers:
            self._hold_until = time.monotonic() + self._worker_grace
        if self._awaited_clients:
            logger.info("restored %d tasks of %d clients from the journal %s",
                        len(server.state.tasks), len(self._awaited_clients), journal.path)

    # ------------------------------------------------------------ peers coming back
    def client_joined(self, client: str) -> None:
        """``client`` registered (a restored client came back)."""
        self._awaited_clients.pop(client, None)

    def worker_joining(self, event: ev.AddWorker) -> ev.AddWorker:
        """The event that adds a worker joining: paused while the others are awaited."""
        if not self._hold_until:
            return event
        self._held_workers.append(event.address)
        return records.replace(event, paused=True)

    def worker_joined(self, address: str) -> None:
        """A worker is registered: journaled; the last one awaited releases the others."""
        if self.journal is not None:
            self.journal.worker_joined(address)
        if self._hold_until:
            self._awaited_workers.discard(address)
            if not self._awaited_workers:
                self._release_workers()

    def worker_left(self, address: str) -> None:
        if self.journal is not None:
            self.journal.worker_left(address)

    def client_left(self, client: str) -> None:
        if self.journal is not None:
            self.journal.client_gone(client)

    def tick(self, connected: Container[str]) -> list[str]:
        """The restored clients whose grace is over and are not ``connected``: they want
        nothing any more. Workers still held are released once their grace is over."""
        gone: list[str] = []
        mono = time.monotonic()
        if self._awaited_clients:
            for client, deadline in list(self._awaited_clients.items()):
                if deadline <= mono:
                    del self._awaited_clients[client]
                    if client not in connected:
                        logger.info("client %s did not come back: releasing its keys and "
                                    "leases", client)
                        gone.append(client)
        if self._hold_until and mono >= self._hold_until:
            self._release_workers()
        return gone

    def _release_workers(self) -> None:
        """The workers the journal knew are back (or the grace is over): work goes out."""
        self._hold_until = 0.0
        server = self._server
        now = time.time()
        for peer in self._held_workers:
            if peer in server.state.workers:
                server.handle_event(ev.WorkerStatusChange(
                    status="running", worker=peer, now=now,
                    stimulus_id=server.stimulus("workers-back")))
        logger.info("%d workers came back%s: giving out work", len(self._held_workers),
                    f", {len(self._awaited_workers)} did not: {sorted(self._awaited_workers)}"
                    if self._awaited_workers else "")
        for address in self._awaited_workers:
            self.worker_left(address)
        self._held_workers, self._awaited_workers = [], set()

    # ------------------------------------------------------------ each loop turn
    def sync(self, primitives: Primitives) -> None:
        """Write what this loop turn changed (before its messages go out: what clients are
        told is in the journal first). The server calls it only when there is a journal:
        it runs every loop turn."""
        if self.journal is not None:
            for hook in self.before_sync:
                hook()
            if primitives.changed:
                primitives.write_journal(self.journal)
            self.journal.sync()

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
