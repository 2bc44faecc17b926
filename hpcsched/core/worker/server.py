"""The worker server: runs :class:`WorkerState`, executes tasks, serves its data.

Threads of a worker:

* the loop (owns the state machine): scheduler messages, peer messages, task
  results and transfer results come in through one inbox (every transport
  delivers there, :meth:`~hpcsched.core.comm.base.Comm.deliver_to`; MPI's and
  TCP's threads may run an idle loop's iteration themselves), batched messages
  go out;
* ``nthreads`` task threads (:class:`~hpcsched.core.worker.task_pool.TaskPool`), one
  more for each task that seceded while it runs (``hpcsched.secede()``);
* none for transfers over TCP (comms to peers open on the transport's thread);
  elsewhere the fetch threads the process's workers share, which only open comms
  to peers (:mod:`hpcsched.core.worker.peers`).

Messages are the records of :mod:`hpcsched.core.protocol.messages`: each one the
scheduler sends is decoded (``SCHEDULER_TO_WORKER``; the state machine's events
get ``now`` and a ``stimulus_id`` then) and handed to its handler in one table,
record type -> handler, :attr:`Worker.handlers` (the state machine's events,
``update-data``, ``get-data``, ``close``, and the control requests of
:mod:`hpcsched.core.worker.control`); one that is not a known op with the
right fields is logged and skipped. What the worker sends stays a record until
the loop flushes its batch, where each is encoded once.

Tasks reach their cluster through the client inside tasks
(:mod:`hpcsched.core.client.worker_client`, ``get_client()``), which finds
the worker in :mod:`hpcsched.core.worker.context`: one client per worker,
made by the client layer on first use with the worker's address and
credentials, held here (:meth:`Worker.task_client`) and closed with the worker.

A worker that cannot reach its scheduler for ``death_timeout`` seconds exits
with a message naming the address it tried. One that loses a scheduler that
keeps a journal (it says so at registration) unannounced keeps its tasks and
results and looks for it again for ``worker.scheduler-reconnect-timeout``
seconds (:mod:`.reconnect`); then, or at once if that is 0 or the scheduler
keeps no journal, it closes with :data:`EXIT_SCHEDULER_LOST`, whatever its
tasks are doing (the CLI then leaves without waiting for task threads, so that
a batch job ends with its scheduler). ``lifetime`` (a batch job's walltime) makes it ask
the scheduler to retire it gracefully in time.

Memory (:mod:`hpcsched.core.worker.memory`): with a ``memory_limit``, results live in
a :class:`~hpcsched.core.worker.spill.SpillBuffer` under ``local_directory``, and the
loop's tick samples process memory every ``worker.memory.monitor-interval``
seconds to spill, pause or resume; past the terminate fraction it calls
``on_memory_terminate(reason)``: the CLI's exits for its supervisor to restart
it (``restartable``), an MPI rank's ends the job naming the rank once nothing
is left to spill.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Comm, CommClosedError, Listener, Security
from hpcsched.core.comm.loop import CLOSED, Loop
from hpcsched.core.graph.dsk import key_split
from hpcsched.core.protocol import records
from hpcsched.core.protocol.directions import SCHEDULER_TO_WORKER
from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.serialize import deserialize, sizeof
from hpcsched.core.protocol.wire import MalformedMessage, decode, encode, receive
from hpcsched.core.protocol.worker import (
    Close,
    ComputeRange,
    GetData,
    Heartbeat,
    HeartbeatInterval,
    Registered,
    RegisterError,
    RegisterWorker,
    ReleaseRange,
    RetireMe,
    UpdateData,
)
from hpcsched.core.settings import WorkerSettings
from hpcsched.core.state import events as ev
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.worker.context import TaskNeedsThread, enter_task, leave_task
from hpcsched.core.worker.control import WorkerControl
from hpcsched.core.worker.execution import pack_exception, run_spec_call
from hpcsched.core.worker.memory import MemoryLimits
from hpcsched.core.worker.memory_monitor import MemoryMonitor
from hpcsched.core.worker.peers import PeerTransfers
from hpcsched.core.worker.preload import PreloadError, Preloads
from hpcsched.core.worker.ranges import RangeRunner
from hpcsched.core.worker.reconnect import Reconnect
from hpcsched.core.worker.spill import SpillBuffer, configured_directory, local_directory
from hpcsched.core.worker.task_pool import TaskPool
from hpcsched.core.worker.telemetry import WorkerTelemetry

logger = logging.getLogger("hpcsched.worker")

#: the events a thread of ranges puts on the loop (RangeRunner.as_of_now)
_FROM_RANGE_THREADS = (ev.RangeThreadDone, ev.RangesWaiting)

INLINE_TASK = 0.0005  # seconds: tasks of a group averaging less run on the loop thread
IDLE_REPORT_EVERY = 10  # heartbeat intervals between reports of a worker without news
EXIT_SCHEDULER_LOST = 1  # exit status of a worker whose scheduler went away unannounced
CONNECT_ATTEMPT = 10.0  # seconds: one attempt to reach the scheduler, then a warning
CLOSE_WAIT = 15.0  # seconds: each step of close() is bounded; the whole is waited for so long


class Worker:
    """A worker process's server: connects to the scheduler at ``scheduler_address``,
    runs the tasks it is given and serves their results to its peers (see the module's
    documentation for the threads and the parameters' meaning)."""

    #: record type -> handler(record) returning state-machine commands: every record the
    #: scheduler sends
    handlers = Handlers("worker")

    def __init__(
        self,
        scheduler_address: str,
        *,
        nthreads: int | None = None,
        memory_limit: int | None = None,
        name: str | None = None,
        resources: dict | None = None,
        security: Security | None = None,
        listen_address: str | None = None,
        death_timeout: float | None = None,
        lifetime: float | None = None,
        lifetime_stagger: float = 0.0,
        heartbeat_interval: float | None = None,
        host: str | None = None,
        on_close: Any = None,
        local_directory: str | None = None,
        memory_target_fraction: float | bool | None = None,
        memory_spill_fraction: float | bool | None = None,
        memory_pause_fraction: float | bool | None = None,
        memory_terminate_fraction: float | bool | None = None,
        on_memory_terminate: Any = None,
        restartable: bool = False,
        scheduler_file: str | None = None,
        scheduler_reconnect_timeout: float | None = None,
        preload: str | list[str] | None = None,
    ):
        self.scheduler_address = scheduler_address
        #: modules or ``.py`` files loaded at start, their ``dask_setup(worker)`` called
        self.preloads = Preloads(preload)
        #: where a restarted scheduler may write its new address (re-read to reconnect)
        self.scheduler_file = scheduler_file
        self._sent_inventory: dict = {}  # the keys our last registration said we hold
        # this worker's own directory for files (dask's local_directory); made on demand
        self.local_directory = local_directory
        if local_directory is not None:
            os.makedirs(local_directory, exist_ok=True)
        self.nthreads = nthreads or os.cpu_count() or 1
        self.memory_limit = memory_limit or 0
        self.name = name
        self.resources = dict(resources or {})
        self.security = security
        #: the ``worker.*`` configuration, keyword arguments winning
        self.settings = settings = config.read(
            WorkerSettings, death_timeout=death_timeout, heartbeat_interval=heartbeat_interval,
            scheduler_reconnect_timeout=scheduler_reconnect_timeout,
            memory_target=memory_target_fraction, memory_spill=memory_spill_fraction,
            memory_pause=memory_pause_fraction, memory_terminate=memory_terminate_fraction)
        backend = registry.backend_for(scheduler_address)
        self.reconnect_timeout = float(settings.scheduler_reconnect_timeout) \
            if backend.reconnectable else 0.0
        self.scheduler_journaled = False  # from the scheduler's answer to our registration
        self.listen_address = listen_address or backend.worker_listen_address(
            scheduler_address, host)
        # the scheduler notices this worker died only by missing heartbeats (TCP): send them
        self._uses_heartbeat = backend.needs_heartbeat
        self.death_timeout = settings.death_timeout
        self.lifetime = lifetime
        if lifetime and lifetime_stagger:
            import random  # here: a worker without a lifetime (every MPI rank) never needs it

            self.lifetime = max(lifetime + random.uniform(-lifetime_stagger, lifetime_stagger),
                                1.0)
        # until the scheduler says otherwise (it lengthens the interval as its cluster grows)
        self.heartbeat_interval = settings.heartbeat_interval
        self.host = host or socket.gethostname()
        self.address = ""
        self.state: WorkerState | None = None
        self.memory = MemoryLimits.from_settings(int(self.memory_limit), settings)
        self.spill_buffer: SpillBuffer | None = None
        self.memory_monitor = MemoryMonitor(self.memory, on_memory_terminate, restartable)
        self._close_asked = False  # the scheduler said "close" (its exit code stands)
        tick = self.heartbeat_interval
        if self.memory.managed:
            tick = min(tick, float(settings.memory_monitor_interval))
        self._next_heartbeat = 0.0
        self.loop = Loop("hpcsched-worker", self._process, self._flush, self._tick, tick)
        self.executor = TaskPool(self.nthreads, "hpcsched-task")
        self.peers = PeerTransfers(self)  # get-data served, dependencies fetched
        self.ranges = RangeRunner(self)  # the elements of bulk maps given to this worker
        self._scheduler_comm: Comm | None = None
        self._outbox: list = []  # protocol records for the scheduler, encoded when flushed
        # (function, *args) that start threads once the outbox has left: tasks that
        # announce their start, and ranges, so that should they kill the process, the
        # scheduler knows what started and what finished before them
        self._start_after_flush: list[tuple] = []
        self._listener: Listener | None = None
        self._closed = threading.Event()
        self._close_done = threading.Event()
        self._close_lock = threading.Lock()
        self._closer = 0  # the thread running close()
        self.close_reason = ""
        self.exit_code = 0  # what the scheduler asked us to exit with (MPI jobs)
        self._started = 0.0
        self._retire_asked = False
        self._on_close = on_close
        self._quiet_ticks = IDLE_REPORT_EVERY  # intervals without a report: the first is due
        self._client: Any = None  # the tasks' client (task_client), closed with the worker
        self._client_lock = threading.Lock()
        self._resume: dict[Any, threading.Event] = {}  # seceded tasks waiting to rejoin
        # task groups that must not run on the loop thread: one of theirs asked for a client
        self._threaded_groups: set[str] = set()
        self.telemetry = WorkerTelemetry()  # CPU, job id, transfers, logs: sent with heartbeats
        # Client.run and upload_file; replies reach the scheduler through the loop
        self.control = WorkerControl(self, lambda reply: self.loop.put(("control", reply)))
        self._table = self.handlers.bind(self)
        # The scheduler sends no stimulus ids; each event decoded here is given one
        # ("<op>-<n>") so that a state change, and the transition a worker plugin sees, can
        # be traced to the message that caused it.
        self._stimuli = itertools.count(1)

    # ================================================================ lifecycle
    def start(self) -> Worker:
        self._listener = registry.listen(self.listen_address, self.peers.on_connect,
                                         self.security)
        self.address = self._listener.address
        if self.memory.managed and (self.memory.target or self.memory.spill):
            try:
                self.spill_buffer = SpillBuffer(configured_directory(self.local_directory),
                                                self.memory.bytes_at("target"))
                self.memory_monitor.spill_buffer = self.spill_buffer
            except OSError as e:
                self._listener.stop()
                raise OSError(f"worker cannot spill to local_directory "
                              f"{local_directory(self.local_directory)!r}: {e}") from e
        self.state = WorkerState(self.address, self.nthreads, self.resources,
                                 self.settings.transfer_incoming_count_limit,
                                 data=self.spill_buffer)
        try:  # before any connection to the scheduler, as dask's: no task runs before it
            self.preloads.setup(self)
        except PreloadError:
            self._listener.stop()
            if self.spill_buffer is not None:
                self.spill_buffer.close()
            raise
        comm = self._connect_scheduler()
        try:
            reply = self._register(comm, self.death_timeout, {})
        except ConnectionError:
            comm.close()
            self._listener.stop()
            raise
        self._started = time.monotonic()
        # registering said it is alive: the first heartbeat is one interval away (nothing
        # it would measure is worth delaying the first task for)
        self._next_heartbeat = self._started + self.heartbeat_interval * 0.95
        self._attach(comm, reply)
        self.loop.start()
        logger.info("worker %s (%s) connected to %s", self.address, self.name,
                    self.scheduler_address)
        return self

    def _register(self, comm: Comm, timeout: float, keys: dict, running: list | None = None
                  ) -> Any:
        """Introduce this worker over ``comm``, holding ``keys`` (key -> nbytes) and
        running ``running``; the scheduler's answer (``ConnectionError`` if it refused us
        or did not answer)."""
        comm.send([encode(RegisterWorker(
            self.address, self.nthreads, self.memory_limit, self.name or self.address,
            self.host, self.resources, keys, os.getpid(), running or None))])
        try:
            reply = comm.recv(timeout=timeout)
        except (CommClosedError, TimeoutError) as e:
            raise ConnectionError(f"scheduler at {self.scheduler_address} did not answer our "
                                  f"registration: {e}") from e
        first = reply[0] if isinstance(reply, list) and reply else reply
        try:
            answer = decode(SCHEDULER_TO_WORKER, first)
        except MalformedMessage as e:
            answer = e
        if type(answer) is not Registered:
            why = getattr(answer, "message", answer)  # RegisterError's, or what was wrong
            raise ConnectionError(f"scheduler at {self.scheduler_address} refused us: {why}")
        return reply

    def _attach(self, comm: Comm, reply: Any) -> None:
        """Talk to the scheduler over ``comm``, which registered us (``reply``: its
        answer, ``registered`` first)."""
        self._scheduler_comm = comm
        answer = decode(SCHEDULER_TO_WORKER, reply[0] if isinstance(reply, list) else reply)
        if answer.heartbeat_interval:
            self._set_heartbeat_interval(answer.heartbeat_interval)
        # only a scheduler with a journal comes back with what it knew: waiting for any
        # other would keep this worker (and its batch job) alive for nothing
        self.scheduler_journaled = answer.journaled
        if isinstance(reply, list) and len(reply) > 1:
            # tasks assigned at registration travel in the same batch as "registered"
            self.loop.put(("scheduler", reply[1:]))
        comm.deliver_to(self.loop, "scheduler", CLOSED)

    # ================================================================ losing the scheduler
    def _lose_scheduler(self) -> None:
        """On the loop: the scheduler vanished; keep everything and look for it again."""
        comm, self._scheduler_comm = self._scheduler_comm, None
        if comm is not None:
            comm.close()
        logger.warning("worker %s lost its scheduler at %s: keeping its tasks and results, "
                       "reconnecting for up to %ss", self.address, self.scheduler_address,
                       self.reconnect_timeout)
        Reconnect(self.scheduler_address, self.security, self.scheduler_file,
                  self.reconnect_timeout, self._register_again, self._reattach,
                  lambda why: self.close(why, EXIT_SCHEDULER_LOST), self._closed).start()

    def _inventory(self) -> tuple[dict, list]:
        """On the loop: the results this worker holds (key -> nbytes), the tasks it runs."""
        state = self.state
        assert state is not None
        held = {k: max(ts.nbytes, 0) for k, ts in state.tasks.items() if ts.state == "memory"}
        return held, [ts.key for ts in state.executing | state.long_running]

    def _register_again(self, comm: Comm, timeout: float) -> Any:
        keys, running = self.loop.call(self._inventory)
        self._sent_inventory = keys
        return self._register(comm, timeout, keys, running)

    def _reattach(self, comm: Comm, address: str, reply: Any) -> None:
        def attach() -> None:
            if self._closed.is_set():
                comm.close()
                return
            self.scheduler_address = address
            # what waited for the scheduler: only the results that finished after the
            # registration's inventory are news to it (that inventory said the rest)
            sent = self._sent_inventory
            self._outbox = [m for m in self._outbox
                            if type(m) is ev.TaskFinished and m.key not in sent]
            self._attach(comm, reply)

        self.loop.call(attach)

    def _connect_scheduler(self) -> Comm:
        assert self._listener is not None  # start() opened it
        deadline = time.monotonic() + self.death_timeout
        last: Exception | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._listener.stop()
                raise TimeoutError(
                    f"worker could not reach the scheduler at {self.scheduler_address} within "
                    f"death_timeout={self.death_timeout}s: {last}")
            try:
                # attempts of at most CONNECT_ATTEMPT seconds, so that the log says early
                # why the scheduler is out of reach (a batch job's log is what users read)
                return registry.connect(self.scheduler_address,
                                        timeout=min(left, CONNECT_ATTEMPT),
                                        security=self.security)
            except (TimeoutError, OSError) as e:
                if isinstance(e, ConnectionError) and "refused our credentials" in str(e):
                    self._listener.stop()
                    raise
                if last is None:
                    logger.warning("worker %s cannot reach the scheduler at %s yet: %s; "
                                   "trying until death_timeout=%gs", self.address,
                                   self.scheduler_address, e, self.death_timeout)
                last = e
                time.sleep(min(0.2, max(left, 0)))

    def run(self) -> None:
        """Start and block until closed, and the close is over (the CLI's main loop)."""
        if not self.address:
            self.start()
        while not self._closed.wait(1.0):
            pass
        if not self._close_done.wait(CLOSE_WAIT):
            logger.warning("worker %s: closing took over %ss; leaving anyway", self.address,
                           CLOSE_WAIT)

    def wait_closed(self, timeout: float | None = None) -> bool:
        return self._closed.wait(timeout)

    def close(self, reason: str = "closed", exit_code: int | None = None) -> None:
        """Stop serving: listener, loop, task threads, connections. A call while another
        thread closes the worker returns when that close is over (a cluster closing its
        in-process workers counts on their threads being gone), except on the threads the
        close itself waits for."""
        with self._close_lock:
            closing = self._closed.is_set()
            if not closing:
                self.close_reason = reason
                if exit_code is not None:
                    self.exit_code = exit_code
                self._closer = threading.get_ident()
                self._closed.set()
        if closing:
            if threading.get_ident() != self._closer and not self.loop.on_loop():
                self._close_done.wait(CLOSE_WAIT)
            return
        logger.info("worker %s closing: %s", self.address, reason)
        if self._listener is not None:
            self._listener.stop()
        self.loop.stop(join=True)
        self.telemetry.close()
        if self.state is not None:
            self.state.closing = True
        self.executor.shutdown()
        if self._scheduler_comm is not None:
            self._scheduler_comm.close()
        self.peers.close()
        for event in list(self._resume.values()):  # seceded tasks waiting to rejoin go on
            event.set()
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close(timeout=2.0)
        self.control.cleanup()  # a temporary directory it made for uploads
        self.preloads.teardown(self)
        if self.spill_buffer is not None:
            self.spill_buffer.close()
        self._close_done.set()
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> Worker:
        return self.start() if not self.address else self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ================================================================ the loop
    def _process(self, items: list) -> None:
        state = self.state
        assert state is not None  # the loop runs once start() made it
        now = time.time()
        out: list = []
        for source, payload in items:
            if source == "scheduler":
                if payload is CLOSED and not self._close_asked and self.reconnect_timeout > 0 \
                        and self.scheduler_journaled and not self._closed.is_set():
                    self._lose_scheduler()
                    continue
                if payload is CLOSED:
                    # after a "close" it asked for, the scheduler's exit code stands
                    code = None if self._close_asked else EXIT_SCHEDULER_LOST
                    if code is not None:
                        logger.warning(
                            "worker %s: the connection to the scheduler at %s is gone (the "
                            "scheduler ended, or dropped this worker after hearing nothing "
                            "from it for scheduler.worker-ttl, as across a network outage); "
                            "exiting with status %d", self.address, self.scheduler_address,
                            code)
                    threading.Thread(target=self.close, args=("scheduler connection lost",
                                                              code), daemon=True).start()
                    return
                out += self._from_scheduler(payload, now)
                if self._close_asked:
                    return
            elif source == "control":  # a Client.run / upload_file reply
                self._outbox.append(payload)
            elif source == "ranges":  # finished elements of bulk maps
                self.ranges.deliver(payload)
            elif type(source) is tuple:  # (PEER, comm): a peer's messages
                out += self._handle_all(self.peers.handle(source[1], payload))
            else:  # our own events: task results, transfers
                if type(payload) in _FROM_RANGE_THREADS:  # counted there: stale by now
                    payload = self.ranges.as_of_now(payload)
                out += state.handle(payload)
        self._carry_out(out)

    def _from_scheduler(self, msgs: list, now: float) -> list:
        """The scheduler's messages, each decoded to its record and given to its handler
        (:attr:`handlers`); the commands they cause. A message that is not a known op
        with the right fields is logged and skipped: the one error path."""
        out: list = []
        table, stimulus = self._table, self._stimulus
        for msg in msgs:
            try:
                record = receive(SCHEDULER_TO_WORKER, msg, stimulus, now=now)
                handler = table.get(type(record))
                if handler is None:
                    raise MalformedMessage(f"{type(record).__name__}: the worker has no "
                                           "handler for it")
            except MalformedMessage as e:
                logger.error("worker %s ignores a message from the scheduler: %s",
                             self.address, e)
                continue
            out += handler(record)
        return out

    def _stimulus(self, op: str) -> str:
        return f"{op}-{next(self._stimuli)}"

    # the scheduler's records (see handlers), on the loop
    @handlers.on(*sorted((WorkerState.handlers.table.keys() & SCHEDULER_TO_WORKER.values())
                         - {UpdateData}, key=lambda t: t.__name__))
    def _state_event(self, event: Any) -> list:
        assert self.state is not None
        return self.state.handle(event)

    @handlers.on(UpdateData)
    def _update_data(self, record: UpdateData) -> list:
        # the values travel serialized (each its own blob, so that one bad value errs alone);
        # the state machine's event holds them deserialized
        assert self.state is not None
        return self.state.handle(records.replace(
            record, data={k: deserialize(v) for k, v in record.data.items()}))

    @handlers.on(ComputeRange)
    def _compute_range(self, record: ComputeRange) -> list:
        assert self.state is not None
        return self.state.handle(self.ranges.submit(record))

    @handlers.on(ReleaseRange)
    def _release_range(self, record: ReleaseRange) -> list:
        assert self.state is not None
        return self.state.handle(self.ranges.answer_release(record.count))

    @handlers.on(GetData)
    def _get_data(self, request: GetData) -> tuple:
        self.peers.serve(None, request)
        return ()

    @handlers.on(Close)
    def _scheduler_closes(self, request: Close) -> tuple:
        self._close_asked = True  # _process carries out nothing from here on
        self.exit_code = int(request.exit_code or 0)
        threading.Thread(target=self.close, args=(request.reason,), daemon=True).start()
        return ()

    @handlers.on(*WorkerControl.handlers.table)
    def _control(self, request: Any) -> tuple:
        self.control.handle(request)
        return ()

    @handlers.on(HeartbeatInterval)
    def _heartbeat_interval(self, record: HeartbeatInterval) -> tuple:
        self._set_heartbeat_interval(record.interval)
        return ()

    def _set_heartbeat_interval(self, interval: float) -> None:
        """Heartbeat every ``interval`` seconds, as the scheduler asks: the next one at most
        that far away (the scheduler's TTL counts from the last one it had)."""
        if not interval > 0:
            return
        self.heartbeat_interval = interval
        self._next_heartbeat = min(self._next_heartbeat, time.monotonic() + interval * 0.95)
        self.loop.tick_interval = min(self.loop.tick_interval, interval)

    @handlers.on(Registered, RegisterError)
    def _nothing(self, record: Any) -> tuple:
        """What needs no action once the worker runs (its registration's answer)."""
        return ()

    def _handle_all(self, events: list) -> list:
        assert self.state is not None
        out: list = []
        for e in events:
            out += self.state.handle(e)
        return out

    def send_to_scheduler(self, record: Any) -> None:
        """On the loop: protocol ``record`` leaves with this iteration's batch to the
        scheduler."""
        self._outbox.append(record)

    def _carry_out(self, commands: list) -> None:
        state = self.state
        assert state is not None
        work = [commands]
        while work:
            inline = []
            for cmd in work.pop():
                t = type(cmd)
                if t is ev.Send:
                    self._outbox.append(cmd.msg)
                elif t is ev.Execute:
                    ts = state.tasks.get(cmd.key)
                    # a gang's member waits for the others in a collective: never on the loop
                    if ts is not None and ts.duration < INLINE_TASK and not cmd.gang and not (
                            self._threaded_groups and key_split(cmd.key) in self._threaded_groups):
                        inline.append(cmd)
                    elif cmd.announced:
                        self._start_after_flush.append(
                            (self.executor.submit, self._execute, cmd.key, cmd.run_spec,
                             cmd.gang))
                    else:
                        self.executor.submit(self._execute, cmd.key, cmd.run_spec, cmd.gang)
                elif t is ev.GatherDep:
                    self.peers.gather(cmd.worker, cmd.keys)
                elif t is ev.RunRanges:
                    self._start_after_flush.append((self.ranges.start_thread,))
                elif t is ev.Resume:
                    event = self._resume.pop(cmd.key, None)
                    if event is not None:
                        event.set()
            for cmd in inline:
                # known to take well under a millisecond: run here, and handle the result
                # at once (its "task-finished" leaves with this batch): a thread hand-off
                # each way would cost more than the task itself
                result = self._run(cmd.key, cmd.run_spec, on_loop=True)
                if result is None:  # it asked for a client or seceded: it needs a thread
                    self._threaded_groups.add(key_split(cmd.key))
                    self.executor.submit(self._execute, cmd.key, cmd.run_spec)
                else:
                    work.append(state.handle(result))

    def _flush(self) -> None:
        if self._outbox and self._scheduler_comm is not None:
            msgs, self._outbox = self._outbox, []
            try:  # encoded once, here: records until they leave
                self._scheduler_comm.send([encode(m) for m in msgs])
            except (CommClosedError, OSError):
                pass
        if self._start_after_flush:
            starts, self._start_after_flush = self._start_after_flush, []
            for fn, *args in starts:
                fn(*args)

    def _tick(self, now: float) -> None:
        if self.memory.managed:
            self._monitor_memory(now)
        mono = time.monotonic()
        if mono < self._next_heartbeat:
            return
        self._next_heartbeat = mono + self.heartbeat_interval * 0.95
        self._carry_out(self._handle_all(self.peers.expire(mono, now)))
        # Where the transport needs heartbeats (TCP), they are how the scheduler detects
        # lost workers. Other transports (an MPI rank that dies ends the job) report when
        # there is news (a measured bandwidth, transfers, logs), and otherwise only every
        # IDLE_REPORT_EVERY intervals:
        # idle ranks stay nearly silent, yet the dashboard's workers table keeps their CPU
        # and memory current
        m = self.metrics()
        self._quiet_ticks += 1
        if self._uses_heartbeat or "bandwidth" in m or "transfers" in m or "logs" in m \
                or self._quiet_ticks >= IDLE_REPORT_EVERY:
            self._quiet_ticks = 0
            self._outbox.append(Heartbeat(self.address, m))
        if self.lifetime and not self._retire_asked and mono - self._started > self.lifetime:
            self._retire_asked = True
            logger.info("worker %s: lifetime of %.0fs is up, retiring", self.address,
                        self.lifetime)
            self._outbox.append(RetireMe())

    # ================================================================ memory
    def _monitor_memory(self, now: float) -> None:
        """One sample of process memory; a pause or resume goes through the state machine."""
        assert self.state is not None
        change = self.memory_monitor.sample(self.address, self.state.status == "paused")
        if change is not None:
            self._carry_out(self.state.handle(ev.PauseWorker(change, now=now)))

    def metrics(self) -> dict:
        """What the heartbeat reports: task counts, status, bandwidth, CPU, memory, logs."""
        st = self.state
        assert st is not None
        m: dict[str, Any] = {"executing": len(st.executing), "ready": len(st.ready), "in_memory": len(st.data),
             "in_flight": len(st.in_flight_workers), "time": time.time(),
             "status": st.status}
        bandwidth = self.peers.take_bandwidth()
        if bandwidth is not None:
            m["bandwidth"] = bandwidth
        self.telemetry.add_to(m)
        m.update(self.memory_monitor.metrics())
        return m

    # ================================================================ execution
    def _execute(self, key: Any, run_spec: Any, gang: tuple = ()) -> None:
        """In an executor thread: run the task, hand the result to the loop."""
        self.loop.put((None, self._run(key, run_spec, gang=gang)))

    def _run(self, key: Any, run_spec: Any, on_loop: bool = False, gang: tuple = ()) -> Any:
        """Run a task; its ExecuteSuccess / ExecuteFailure, or None if it ran on the loop
        thread and needs a task thread instead (see :mod:`~hpcsched.core.worker.context`).
        ``gang``: the members' addresses of a task holding many slots."""
        start = time.time()
        assert self.state is not None
        outer = enter_task(self, key, on_loop, start, gang)
        try:
            value = run_spec_call(run_spec, self.state.data)
        except BaseException as e:  # noqa: BLE001 - reported to the scheduler
            if on_loop and type(e) is TaskNeedsThread:
                return None
            stop = time.time()
            packed, tb_text, text = pack_exception(e, e.__traceback__)
            logger.warning("task %r failed: %s", key, text)  # as dask's "Compute Failed"
            return ev.ExecuteFailure(key, packed, tb_text, text, start, stop, now=stop)
        finally:
            leave_task(outer)
        stop = time.time()
        try:
            nbytes = sizeof(value)
        except Exception:
            nbytes = 64
        return ev.ExecuteSuccess(key, value, nbytes, type(value).__name__, start, stop, stop)

    # ================================================================ tasks' API
    def task_client(self, make: Callable[[], Any]) -> Any:
        """The client this worker's tasks share (``hpcsched.get_client``): made by ``make``
        on first use (and again if the one held lost its scheduler), closed with the
        worker."""
        with self._client_lock:
            if self._closed.is_set():
                raise RuntimeError(f"worker {self.address} is closed")
            client = self._client
            if client is None or client.status != "running":
                if client is not None:  # lost its scheduler: replaced, not leaked
                    client.close(timeout=1.0)
                client = self._client = make()
            return client

    def secede_task(self, key: Any, compute_duration: float) -> None:
        """The task ``key`` (on the calling thread) leaves the pool: see ``hpcsched.secede``."""
        if self.ranges.on_range_thread():  # an element of a bulk map
            self.ranges.secede()
            return
        self.loop.put((None, ev.Secede(key, compute_duration, now=time.time())))

    def rejoin_task(self, key: Any) -> None:
        """Block until the seceded task ``key`` has a thread slot again (or the worker
        closes): see ``hpcsched.rejoin``."""
        event = self._resume[key] = threading.Event()
        self.loop.put((None, ev.Rejoin(key, now=time.time())))
        while not event.wait(1.0):
            if self._closed.is_set():
                break
        self._resume.pop(key, None)

