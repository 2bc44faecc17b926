"""The scheduler server: runs :class:`SchedulerState` over any transport.

The server is a shell over parts that own their data, each reached through its
own methods: the peers' connections (:mod:`.connections`), the outgoing batches
(:mod:`.outbox`), recovery after a restart (:mod:`.recovery`), and the state
machine. Parts that need the server back are handed it as a protocol of
:mod:`.interfaces`.

Peers connect and introduce themselves with one message, ``register-worker``
or ``register-client`` (:mod:`.registration`); their transport delivers their
messages to the server's :class:`~hpcsched.core.comm.loop.Loop`
(``Comm.deliver_to``) from the start, the first read there as the introduction. The server decodes each with its sender's context
(:func:`~hpcsched.core.protocol.wire.receive`), hands it to its handler by record
type -- the state machine's events to :class:`SchedulerState` -- and sends the
resulting messages batched per peer.

A few requests are served here rather than by the state machine because they move
data or answer questions (:mod:`.ops`): ``gather`` (:mod:`.gather`),
``scheduler-info``, ``retire-workers``, cluster control
(:mod:`.control`), coordination primitives (:mod:`.primitives`) and
extensions (:mod:`.extensions`).

Each event built from a message gets a ``stimulus_id`` (``"<op>-<n>"``), which
the state's transition log records, and the scheduler plugins' ``transition``
hooks are called with each logged transition after the event is handled.

Every inbound message takes one path: it is decoded into its protocol record
by its sender's direction (:data:`~hpcsched.core.protocol.messages.WORKER_TO_SCHEDULER`
or :data:`~hpcsched.core.protocol.messages.CLIENT_TO_SCHEDULER`), which checks every
field and gives a state machine's event its sender, ``now`` and ``stimulus_id``
(:func:`~hpcsched.core.protocol.wire.receive`), then handed to the handler
:attr:`Scheduler.handlers` has for its type: the state machine, or a request this
server answers itself. Each message is handled
on its own: a peer whose message is malformed, or makes a handler fail, is
sent one error message, logged and dropped; the other messages of the batch,
everyone else's, are served on. The state machine's commands carry records
too; each is encoded once, when its batch is sent.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Security, parse_address
from hpcsched.core.comm.loop import CLOSED, Loop
from hpcsched.core.protocol import messages as pr
from hpcsched.core.protocol import records
from hpcsched.core.scheduler import ops as scheduler_ops
from hpcsched.core.scheduler.checkpoints import ANNOTATION as CHECKPOINT
from hpcsched.core.scheduler.checkpoints import Checkpoints, next_to_journal
from hpcsched.core.scheduler.connections import Connections
from hpcsched.core.scheduler.control import ClusterControl
from hpcsched.core.scheduler.extensions import close_extensions, start_extensions
from hpcsched.core.scheduler.gather import Gathers
from hpcsched.core.scheduler.journal import JOURNALED
from hpcsched.core.scheduler.outbox import INTERNAL, Outbox
from hpcsched.core.scheduler.primitives import Primitives
from hpcsched.core.scheduler.recovery import Recovery
from hpcsched.core.scheduler.registration import (
    Newcomer,
    add_worker_event,
    refuse,
    worker_name,
)
from hpcsched.core.settings import (
    CommSettings,
    DashboardSettings,
    SchedulerServerSettings,
    SchedulerSettings,
    WorkerSettings,
)
from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState

logger = logging.getLogger("hpcsched.scheduler")

# public address -> (inproc address, secret) of the schedulers running in this process
LOCAL_SCHEDULERS: dict[str, tuple[str, bytes | None]] = {}

#: the records a worker or a client sends that the state machine handles itself
STATE_EVENTS = tuple(sorted(
    SchedulerState.event_types()
    & (set(pr.WORKER_TO_SCHEDULER.values()) | set(pr.CLIENT_TO_SCHEDULER.values())),
    key=lambda t: t.__name__))

#: the loop inbox item that asks for the next workers' share of the queue
FILL_QUEUE = object()


class Scheduler:
    """A scheduler listening on ``address`` (``tcp://host:port``, ``inproc://``, ``mpi://0``).

    A shell over parts that own their data: :attr:`connections` (the peers),
    :attr:`outbox` (batching and flushing), :attr:`recovery` (the journal, and the
    peers a restarted scheduler awaits), :attr:`state` (the state machine) and the
    requests it serves (:attr:`gathers`, :attr:`control`, :attr:`primitives`).

    Example::

        s = Scheduler("tcp://127.0.0.1:0", security=Security.generate()).start()
        print(s.address)
        ...
        s.close()
    """

    def __init__(self, address: str = "inproc://", security: Security | None = None, *,
                 worker_ttl: float | None = None, tick_interval: float | None = None,
                 dashboard_address: Any = ..., journal: str | None = None,
                 checkpoint_directory: str | None = None, history: str | None = None,
                 **state_kwargs: Any):
        self.listen_address = address
        #: what the server does beside its state (``scheduler.*``)
        self.settings = server = config.read(SchedulerServerSettings, journal=journal,
                                             checkpoint_directory=checkpoint_directory,
                                             history=history)
        self.recovery = Recovery(server, self)
        #: what a restart needs (``scheduler.journal``): see :mod:`.journal`
        self.journal = self.recovery.journal
        self.security = self.recovery.security(security)
        # results of tasks annotated checkpoint=True (see .checkpoints): next to the journal
        checkpoint_directory = server.checkpoint_directory
        if checkpoint_directory is None and self.journal is not None:
            checkpoint_directory = next_to_journal(self.journal.path)
        self.checkpoints = Checkpoints(checkpoint_directory) if checkpoint_directory else None
        self._said_no_checkpoints = False
        parse_address(address)  # a malformed address is named here, before anything starts
        if worker_ttl is None and registry.backend_for(address).needs_heartbeat:
            worker_ttl = server.worker_ttl
        if state_kwargs.get("heartbeat_interval") is None:  # the workers' key
            state_kwargs["heartbeat_interval"] = config.read(WorkerSettings).heartbeat_interval
        self.state = SchedulerState(config.read(SchedulerSettings, worker_ttl=worker_ttl,
                                                **state_kwargs))
        if tick_interval is None:
            tick_interval = server.work_stealing_interval
        self.loop = Loop("hpcsched-scheduler", self._process, self._flush, self._tick,
                         tick_interval)
        self.address = ""
        self.inproc_address = ""
        self.id = f"scheduler-{uuid.uuid4().hex[:8]}"
        self._listener: Any = None
        self._extra_listeners: list = []
        self.connections = Connections(self.loop,
                                       float(config.read(CommSettings).handshake_timeout))
        self.outbox = Outbox()
        self._send_failed = self.connections.lost  # bound once: the outbox's every flush
        self._fill_asked = False  # a FILL_QUEUE item waits in the loop's inbox
        self.gathers = Gathers(self)
        self._stimuli = itertools.count()
        self._worker_callbacks: list = []
        self.removal_stimulus = ""  # of the worker removal being announced to callbacks
        self._closed = False
        self._workers_changed = threading.Condition()
        self.started = time.time()
        # ``host:port`` of the dashboard (None: none); read by the diagnostics extension
        self.dashboard_address = config.read(DashboardSettings).address \
            if dashboard_address is ... else dashboard_address
        # extensions (config scheduler.extensions) by name, and the links they serve
        self.extensions: dict[str, Any] = {}
        self.services: dict[str, str] = {}
        # whether workers send each task's CPU seconds and peak memory: a cost on every
        # task-finished, asked for only when a task history keeps them (None until the
        # extensions started, which open the history: a worker joining before is asked)
        self.usage_wanted: bool | None = None
        # Client.run, who_has, upload_file, ... (scheduler/control.py)
        self.control = ClusterControl(self)
        # Lock, Semaphore, Event, Variable, Queue, MultiLock, datasets (scheduler/primitives.py)
        self.primitives = Primitives(self)
        self._table = self.handlers.bind(self)

    # ================================================================ lifecycle
    def start(self) -> Scheduler:
        """Listen, start the loop and the configured extensions; returns the scheduler."""
        self.loop.start()
        if self.journal is not None:
            # no fixed bound: a restore takes as long as its journal is large (and the node
            # busy); the wait ends when the loop's thread does
            self.loop.call(lambda: self.recovery.restore(self._table, self.primitives,
                                                         self.outbox), timeout=None)
        self._listener = self.recovery.listen(self.listen_address,
                                              self.connections.on_connect, self.security)
        self.address = self._listener.address
        self.recovery.listening(self.address, self.security)
        # a client in this process (a notebook's, rank 0's) talks to us without sockets
        same_process = registry.backend_for(self.address).same_process
        self.inproc_address = self.address if same_process else self.add_listener("inproc://")
        LOCAL_SCHEDULERS[self.address] = (self.inproc_address,
                                          self.security.secret if self.security else None)
        logger.info("scheduler at %s", self.address)
        self.extensions.update(start_extensions(self))
        self.usage_wanted = getattr(self.state.recorder, "history", None) is not None
        return self

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's URL, if the diagnostics extension serves one."""
        return self.services.get("dashboard")

    def add_listener(self, address: str) -> str:
        """Also accept peers on ``address`` (e.g. ``inproc://`` for a client in this process
        while workers come over ``mpi://``); returns the contactable address."""
        lst = registry.listen(address, self.connections.on_connect, self.security)
        self._extra_listeners.append(lst)
        return lst.address

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, timeout: float = 10.0, exit_code: int = 0, detach: bool = False) -> None:
        """Close every worker (they exit with ``exit_code`` when run by the CLI or under
        MPI), tell clients, stop listening. ``detach`` (a journaled scheduler whose process
        ends without being asked to close): tell nobody, only stop; workers and clients
        take it as a scheduler that died, and wait for it to restart from its journal."""
        if self._closed:
            return
        self._closed = True
        LOCAL_SCHEDULERS.pop(self.address, None)
        self.control.close()  # scheduler plugins
        close_extensions(self.extensions)
        for lst in [self._listener, *self._extra_listeners]:
            if lst is not None:
                lst.stop()

        def shutdown() -> None:
            for addr in list(self.state.workers):
                self.outbox.queue(addr, pr.Close("scheduler closing", exit_code))
            for cid in list(self.state.clients):
                self.outbox.queue(cid, pr.SchedulerClosing())

        try:
            if not detach:
                self.loop.call(shutdown, timeout=timeout)
        except Exception:
            pass
        self.loop.stop(timeout=timeout)
        self.recovery.close()
        self.connections.close()
        if self.loop.stopped.is_set():
            # a closed cluster may be kept (a notebook's output history holds what a cell
            # showed): not the tasks of its clients, their arguments, its workers
            self.state = SchedulerState(self.state.settings)
            self.outbox.clear()

    # ================================================================ peers
    def _newcomer(self, nc: Newcomer, payload: Any, now: float) -> None:
        """An item from a peer that had not introduced itself when it was sent."""
        if nc.peer is not None:  # accepted since: the rest is the peer's
            if payload is CLOSED:
                self._disconnect(nc.peer, "connection closed")
            elif self.connections.comms.get(nc.peer) is nc.comm:
                self._handle_messages(nc.peer, payload, now)
            return
        intro = self.connections.introduction(nc, payload)
        if intro is not None and self._register(intro[0], nc.comm, intro[1]):
            nc.peer = intro[0]
            if intro[2]:
                self._handle_messages(nc.peer, intro[2], now)

    def _register(self, peer: str, comm: Any, msg: pr.RegisterClient | pr.RegisterWorker
                  ) -> bool:
        """Accept a peer whose introduction ``msg`` passed its checks (False: refused)."""
        now = time.time()
        if isinstance(msg, pr.RegisterClient):
            self.connections.accept(peer, comm, worker=False)
            self.recovery.client_joined(peer)
            self.handle_event(ev.AddClient(peer, now=now,
                                           stimulus_id=self.stimulus("register-client")))
            self.outbox.queue(peer, pr.Registered(self.address, self.id,
                                                  journaled=self.journal is not None))
            return True
        name = msg.name or peer
        if peer in self.state.workers or self.state.registry.named(worker_name(name)) is not None:
            refuse(comm, peer, f"a worker named {name!r} is already registered")
            return False
        try:
            event = add_worker_event(peer, msg, name, now, self.stimulus("register-worker"))
        except (TypeError, ValueError) as e:
            logger.warning("dropping worker %s: malformed registration: %s", peer, e)
            comm.close()
            return False
        self.connections.accept(peer, comm, worker=True)
        # no work until the others a restarted scheduler awaits are back with what they hold
        event = self.recovery.worker_joining(event)
        self.handle_event(event)
        self.recovery.worker_joined(peer)
        ws = self.state.workers[peer]
        # first in its batch, before the tasks the event gave it: the worker reads it first
        self.outbox.queue_first(peer, pr.Registered(
            self.address, self.id, ws.heartbeat_interval, self.journal is not None,
            self.usage_wanted is not False))
        logger.info("worker %s (%s, %d threads) joined", peer, name, event.nthreads)
        self._notify_workers("add", peer, ws.info())
        return True

    def _disconnect(self, peer: str, reason: str) -> None:
        """``peer`` is gone (or is dropped): the state forgets it, and what it held."""
        was_worker = self.connections.drop(peer)
        self.outbox.drop(peer)
        now = time.time()
        if was_worker:
            info = None
            if peer in self.state.workers:  # not already removed by the state (retired, ttl)
                logger.info("worker %s left: %s", peer, reason)
                info = self.state.workers[peer].info()
                self.handle_event(ev.RemoveWorker(peer, reason, now=now,
                                                  stimulus_id=self.stimulus("remove-worker")))
            self.recovery.worker_left(peer)
            self.gathers.worker_left(peer)
            # the remove_worker hooks name the event that removed it (this one, or the
            # state's own: a retirement, a missed heartbeat)
            self.removal_stimulus = self.state.removed_by.pop(peer, "")
            self._notify_workers("remove", peer, info)
        else:
            # a client; or a peer the state does not know, such as a holder of leases the
            # journal named that has no task of its own: its waits and leases end all the same
            self.primitives.peer_left(peer)
            if peer in self.state.clients:
                self.handle_event(ev.RemoveClient(peer, now=now,
                                                  stimulus_id=self.stimulus("remove-client")))
            self.recovery.client_left(peer)

    def _notify_workers(self, what: str, address: str, info: dict | None = None) -> None:
        """Wake ``wait_for_workers``; call ``fn(event, address, info)`` callbacks (on the loop
        thread: they must not block)."""
        with self._workers_changed:
            self._workers_changed.notify_all()
        for cb in list(self._worker_callbacks):
            try:
                cb(what, address, info)
            except Exception:
                logger.exception("worker callback failed")

    # ================================================================ the loop
    def _process(self, items: list) -> None:
        """Handle a batch. Each peer's message is decoded (every field checked) and
        handled on its own: whatever one message provokes, the peer that sent it gets one
        error message and is disconnected, and everyone else's messages are handled."""
        now = time.time()
        fill = False
        comms = self.connections.comms
        for source, payload in items:
            if source is FILL_QUEUE:
                fill = True
                continue
            try:
                if source.__class__ is Newcomer:
                    self._newcomer(source, payload, now)
                elif payload is CLOSED:
                    self._disconnect(source, "connection closed")
                elif source in comms:  # else a late message from a peer we dropped
                    self._handle_messages(source, payload, now)
            except Exception:  # a bug, not the peer's fault: log it, serve the rest
                logger.exception("error while handling a message from %s", source)
        if fill:  # after what arrived with it: the first results of the tasks handed out
            self._fill_asked = False
            if self.state.fill_pending:
                self.handle_event(ev.FillQueue(now=now, stimulus_id=self.stimulus("fill")))

    def _handle_messages(self, source: str, payload: Any, now: float) -> None:
        receive, table, stimulus = pr.receive, self._table, self.stimulus
        journal = None
        if source in self.connections.workers:
            direction, context = pr.WORKER_TO_SCHEDULER, {"worker": source, "now": now}
        else:
            direction, context = pr.CLIENT_TO_SCHEDULER, {"client": source, "now": now}
            journal = self.journal
        for msg in payload if isinstance(payload, list) else [payload]:
            record = None
            try:
                record = receive(direction, msg, stimulus, **context)
                try:
                    handler = table[type(record)]
                except KeyError:  # an introduction: a peer's first message only
                    raise pr.MalformedMessage(f"{type(record).__name__} is a peer's first "
                                              "message only") from None
                handler(source, record)
                if journal is not None and type(record) in JOURNALED:
                    journal.append(source, record, msg)  # written before answers leave
            except Exception as e:
                self._reject(source, record, e)
                return  # the peer is gone: the rest of its batch goes with it

    def _reject(self, peer: str, record: Any, error: Exception) -> None:
        """Tell ``peer`` why its message (``record``, if it was decoded) was refused, then
        disconnect it."""
        if isinstance(error, pr.MalformedMessage):
            reason = f"malformed message: {error}"
            logger.warning("dropping %s: %s", peer, reason)
        else:
            reason = f"handling {type(record).__name__} failed: {type(error).__name__}: {error}"
            logger.error("dropping %s: %s", peer, reason, exc_info=error)
        conns = self.connections
        notice = pr.Close(reason, 1) if peer in conns.workers else pr.Error(reason)
        self.outbox.send_now(peer, conns.comms.get(peer), notice)
        self._disconnect(peer, reason)

    def _tick(self, now: float) -> None:
        self.connections.expire()
        self.outbox.release_held()  # this iteration's flush sends what waited
        self.handle_event(ev.Tick(now=now, stimulus_id=self.stimulus("tick")))
        self.primitives.tick(now)
        for client in self.recovery.tick(self.connections.comms):
            self._disconnect(client, "did not come back")
        # workers the state removed (no heartbeat, retired) lose their comms too; the
        # state's workers are worker peers (only a registration adds them), so equal
        # counts mean there is none to look for
        workers = self.connections.workers
        if len(workers) != len(self.state.workers):
            for peer in [p for p in workers if p not in self.state.workers]:
                # told so, it exits (a worker that only lost its connection reconnects)
                self.outbox.send_now(peer, self.connections.comms.get(peer),
                                     pr.Close("removed by the scheduler", 1))
                self._disconnect(peer, "removed")

    def _route(self, commands: list) -> None:
        """Queue the state's commands; tell scheduler plugins of the new transitions."""
        entries = self.state.transition_listener
        if entries:
            self.state.transition_listener = [] if self.control.scheduler_plugins else None
            self.control.transitions(entries)
        queue = self.outbox.queue
        for cmd in commands:
            queue(cmd.to, cmd.msg)

    def _flush(self) -> None:
        """The loop turn is over: journal what it changed, then send each peer its batch
        (:class:`~.outbox.Outbox`)."""
        if self.journal is not None:  # what clients are told is in the journal first
            self.recovery.sync(self.primitives)
        if self.state.fill_pending and not self._fill_asked:
            # the next iteration, once these messages are out, hands the next workers
            # their queued tasks (see SchedulerState.fill_pending)
            self._fill_asked = True
            self.loop.put((FILL_QUEUE, None))
        self.outbox.flush(self.connections.comms, self._send_failed)

    # ================================================================ inbound records
    #: record type -> handler(sender, record), for every record a registered worker or
    #: client may send: the requests this server answers itself (:mod:`.ops`), the state
    #: machine's events and closing
    handlers = scheduler_ops.handlers

    @handlers.on(*STATE_EVENTS)
    def _state_event(self, source: str, event: Any) -> None:
        """A record the state machine handles: the decoded record is its event."""
        if source in self.connections.workers and source not in self.state.workers:
            return  # news from a worker already removed (retired, timed out)
        if event.__class__ is pr.UpdateGraph and event.annotations and \
                CHECKPOINT in event.annotations:
            if self.checkpoints is not None:
                event = self.checkpoints.rewrite(event)
            elif not self._said_no_checkpoints:
                self._said_no_checkpoints = True
                logger.warning("tasks annotated checkpoint=True, but this scheduler keeps no "
                               "checkpoints: give it a journal (--journal, scheduler.journal) "
                               "or scheduler.checkpoint-directory")
        self._route(self.state.handle(event))

    @handlers.on(pr.CloseClient)
    def _close_client(self, source: str, msg: pr.CloseClient) -> None:
        self.outbox.queue(source, pr.CloseClientReply())
        self._flush()
        self._disconnect(source, "client closed")

    # ================================================================ in-process API
    def identity(self) -> dict:
        """Summary of the cluster (runs on the loop thread)."""
        counts = self.state.task_counts()
        return {
            "type": "Scheduler", "id": self.id, "address": self.address,
            "started": self.started, "workers": self.state.workers_info(),
            "n_tasks": sum(counts.values()), "task_counts": counts,
            "clients": sorted(self.state.clients), "queued": self.state.n_queued,
            "unrunnable": self.state.n_unrunnable, "services": dict(self.services),
        }

    def handle_event(self, event: Any, op: str = "") -> None:
        """Feed ``event`` to the state and carry out its commands (on the loop thread);
        an event without a stimulus id is given one named after ``op`` (events are frozen:
        a copy carries it)."""
        if not event.stimulus_id:
            event = records.replace(
                event, stimulus_id=self.stimulus(op or type(event).__name__))
        self._route(self.state.handle(event))

    def stimulus(self, op: str) -> str:
        """A new stimulus id, ``"<op>-<n>"``, for an event this server builds."""
        return f"{op}-{next(self._stimuli)}"

    def send(self, to: str, msg: Any, before_tasks: bool = False) -> None:
        """Queue ``msg`` for peer ``to`` (on the loop thread: served ops answer so);
        ``before_tasks``: ahead of the tasks already queued for it (what a worker that just
        joined must have first: uploaded files, plugins)."""
        if before_tasks:
            self.outbox.queue_before_tasks(to, msg)
        else:
            self.outbox.queue(to, msg)

    def workers_info(self) -> dict[str, dict]:
        """Each worker's description, by address (from any thread)."""
        return self.loop.call(self.state.workers_info)

    def scheduler_info(self) -> dict:
        """The cluster's summary, :meth:`identity` (from any thread)."""
        return self.loop.call(self.identity)

    def call(self, fn: Any, timeout: float | None = 30.0) -> Any:
        """Run ``fn(scheduler)`` on the scheduler's thread (for adaptive and clusters)."""
        return self.loop.call(lambda: fn(self), timeout)

    def retire_workers(self, workers: list[str] | None = None, names: list[str] | None = None,
                       close: bool = True, timeout: float = 60.0, n: int | None = None
                       ) -> list[str]:
        """Gracefully retire workers: their results move to others, then they close."""
        rid = f"retire-{uuid.uuid4().hex[:8]}"
        fut: Future = Future()

        def start() -> None:
            self.outbox.expect(rid, fut)
            addrs = self.state.workers_to_retire(workers, names, n)
            self.handle_event(ev.RetireWorkers(rid, INTERNAL, addrs, close, now=time.time(),
                                               stimulus_id=self.stimulus("retire-workers")))

        self.loop.call(start)
        reply: pr.RetireWorkersReply = fut.result(timeout)
        return list(reply.retired)

    def wait_for_workers(self, n: int, timeout: float | None = None) -> None:
        """Block until ``n`` workers are registered (TimeoutError after ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._workers_changed:
            while len(self.state.workers) < n:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"only {len(self.state.workers)} of {n} workers "
                                       f"joined within {timeout}s")
                self._workers_changed.wait(min(left, 1.0) if left is not None else 1.0)

    def add_worker_callback(self, fn: Any) -> None:
        """Call ``fn("add" | "remove", address, info)`` as workers join and leave (on the loop
        thread: it must not block)."""
        self._worker_callbacks.append(fn)

    def remove_worker_callback(self, fn: Any) -> None:
        """Stop calling ``fn`` (see :meth:`add_worker_callback`)."""
        if fn in self._worker_callbacks:
            self._worker_callbacks.remove(fn)
