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

The server is a thin shell over parts that own their data, each reached through its
own interface: the link to the scheduler (:mod:`.parts.link`: connection,
registration, the outgoing batch, reconnecting), the running tasks
(:mod:`.parts.running`), the heartbeats (:mod:`.parts.heartbeats`), memory
(:mod:`.memory_monitor`), the peers (:mod:`.peers`), the ranges of bulk maps
(:mod:`.ranges`) and cluster control (:mod:`.control`). What the loop handles is
one typed record per item (:mod:`.parts.inbox`), dispatched through the table
:attr:`Worker.inbox`; the worker's own events carry a ``stimulus_id`` of their own.

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

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Listener, Security
from hpcsched.core.comm.loop import Loop
from hpcsched.core.protocol import records
from hpcsched.core.protocol.directions import SCHEDULER_TO_WORKER
from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.serialize import deserialize
from hpcsched.core.protocol.wire import MalformedMessage, receive
from hpcsched.core.protocol.worker import (
    Close,
    ComputeRange,
    GetData,
    HeartbeatInterval,
    Registered,
    RegisterError,
    RegisterWorker,
    ReleaseRange,
    UpdateData,
)
from hpcsched.core.settings import WorkerSettings
from hpcsched.core.state import events as ev
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.units import parse_interval
from hpcsched.core.worker.context import interrupt
from hpcsched.core.worker.control import WorkerControl
from hpcsched.core.worker.memory import MemoryLimits
from hpcsched.core.worker.memory_monitor import MemoryMonitor
from hpcsched.core.worker.parts.heartbeats import Heartbeats
from hpcsched.core.worker.parts.inbox import (
    CommInbox,
    FromPeer,
    FromScheduler,
    PeerGone,
    RangesDone,
    SchedulerGone,
    ToScheduler,
    stimulus,
)
from hpcsched.core.worker.parts.link import LinkOwner, SchedulerLink, inventory
from hpcsched.core.worker.parts.running import TaskRunner
from hpcsched.core.worker.peers import PeerTransfers
from hpcsched.core.worker.preload import Preloads
from hpcsched.core.worker.ranges import RangeRunner
from hpcsched.core.worker.tasks.gpus import Gpus, offer_gpus
from hpcsched.core.worker.telemetry import WorkerTelemetry, batch_job_id

logger = logging.getLogger("hpcsched.worker")

EXIT_SCHEDULER_LOST = 1  # exit status of a worker whose scheduler went away unannounced
CLOSE_WAIT = 15.0  # seconds: each step of close() is bounded; the whole is waited for so long

#: the worker's own events, made on its threads and handed to its state machine as they
#: are (those of the ranges' threads are brought up to date first: RangeRunner.as_of_now)
OWN_EVENTS = (
    ev.ExecuteSuccess,
    ev.ExecuteFailure,
    ev.GatherDepSuccess,
    ev.GatherDepFailure,
    ev.ServeFailed,
    ev.Secede,
    ev.Rejoin,
)


class Worker:
    """A worker process's server: connects to the scheduler at ``scheduler_address``,
    runs the tasks it is given and serves their results to its peers (see the module's
    documentation for the threads and the parameters' meaning)."""

    #: record type -> handler(record) returning state-machine commands: every record the
    #: scheduler sends
    handlers = Handlers("worker")
    #: item type -> handler(item) returning state-machine commands: every item of the
    #: worker's inbox (:mod:`hpcsched.core.worker.parts.inbox`)
    inbox = Handlers("worker inbox")

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
        death_timeout: float | str | None = None,
        lifetime: float | str | None = None,
        lifetime_stagger: float | str = 0.0,
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
        gpus: Gpus | None = None,
        walltime_end: float | None = None,
        resources_only: bool = False,
    ):
        #: modules or ``.py`` files loaded at start, their ``dask_setup(worker)`` called
        self.preloads = Preloads(preload)
        # this worker's own directory for files (dask's local_directory); made on demand
        self.local_directory = local_directory
        if local_directory is not None:
            os.makedirs(local_directory, exist_ok=True)
        self.nthreads = nthreads or os.cpu_count() or 1
        self.memory_limit = memory_limit or 0
        self.name = name
        self.resources = dict(resources or {})
        #: only tasks that ask for one of its resources are placed here (a GPU job's)
        self.resources_only = resources_only
        #: the GPUs this worker gives its tasks as devices (tasks/gpus.py), None: none known
        self.gpus = offer_gpus(gpus, self.resources, name)
        self.security = security
        #: the ``worker.*`` configuration, keyword arguments winning
        self.settings = settings = config.read(
            WorkerSettings,
            death_timeout=death_timeout,
            heartbeat_interval=heartbeat_interval,
            scheduler_reconnect_timeout=scheduler_reconnect_timeout,
            memory_target=memory_target_fraction,
            memory_spill=memory_spill_fraction,
            memory_pause=memory_pause_fraction,
            memory_terminate=memory_terminate_fraction,
        )
        backend = registry.backend_for(scheduler_address)
        self.listen_address = listen_address or backend.worker_listen_address(
            scheduler_address, host
        )
        # durations as dask writes them ("55m", "4m") or seconds
        lifetime = None if lifetime is None else parse_interval(lifetime, "lifetime")
        lifetime_stagger = parse_interval(lifetime_stagger, "lifetime_stagger", zero=True)
        #: when its batch job's walltime ends (epoch seconds), if it runs in one
        self.walltime_end = walltime_end
        if lifetime and lifetime_stagger:
            import random  # here: a worker without a lifetime (every MPI rank) never needs it

            lifetime = max(lifetime + random.uniform(-lifetime_stagger, lifetime_stagger), 1.0)
        self.host = host or socket.gethostname()
        self.address = ""
        self.state: WorkerState | None = None
        #: memory limits, the spill buffer, the monitor sampling process memory
        self.memory = MemoryMonitor(
            MemoryLimits.from_settings(int(self.memory_limit), settings),
            on_memory_terminate,
            restartable,
        )
        # the scheduler notices this worker died only by missing heartbeats (TCP): send them
        self.heartbeats = Heartbeats(
            settings.heartbeat_interval, needs_heartbeat=backend.needs_heartbeat, lifetime=lifetime
        )
        tick = self.heartbeats.interval
        if self.memory.limits.managed:
            tick = min(tick, float(settings.memory_monitor_interval))
        self.loop = Loop(
            "hpcsched-worker", self._process, lambda: self.link.flush(), self._tick, tick
        )
        self.comms = CommInbox(self.loop)  # where its comms deliver, as typed records
        self._closed = threading.Event()
        #: the connection to the scheduler and what waits to leave on it
        self.link = SchedulerLink(
            scheduler_address,
            security,
            scheduler_file,
            settings.death_timeout,
            float(settings.scheduler_reconnect_timeout) if backend.reconnectable else 0.0,
            LinkOwner(
                self.loop,
                self.comms,
                lambda: inventory(self.state),
                self._heartbeat_interval,
                lambda wanted: self.tasks.want_usage(wanted),
                lambda why: self.close(why, EXIT_SCHEDULER_LOST),
                self._closed,
            ),
        )
        #: on the loop: a protocol record leaves with this iteration's batch to the scheduler
        self.send_to_scheduler: Callable[[Any], None] = self.link.send
        # while a gang member runs here, memory is sampled seldom: each of the loop's ticks
        # takes Python's lock from the member (hpcsched/hpc/gang.py says why that counts)
        gang_tick = float(settings.memory_gang_monitor_interval)
        self.tasks = TaskRunner(
            self, self.nthreads, self.loop, self.link.after_flush, self._closed,
            on_gang=lambda on: self.loop.quiet_ticks(
                min(gang_tick, self.heartbeats.interval) if on else None),
            rss=self.memory.latest_rss,
        )
        self.executor = self.tasks.executor  # the runner's task threads, which ranges share
        self.peers = PeerTransfers(self)  # get-data served, dependencies fetched
        self.ranges = RangeRunner(self)  # the elements of bulk maps given to this worker
        self._listener: Listener | None = None
        self._close_done = threading.Event()
        self._close_lock = threading.Lock()
        self._closer = 0  # the thread running close()
        self._halted = False  # the scheduler closed us, or is gone: nothing more is done
        self.close_reason = ""
        self.exit_code = 0  # what the scheduler asked us to exit with (MPI jobs)
        self._on_close = on_close
        self._client: Any = None  # the tasks' client (task_client), closed with the worker
        self._client_lock = threading.Lock()
        self.telemetry = WorkerTelemetry()  # CPU, job id, transfers, logs: sent with heartbeats
        # Client.run and upload_file; replies reach the scheduler through the loop
        self.control = WorkerControl(self, lambda reply: self.loop.put(ToScheduler(reply)))
        self._table = self.handlers.bind(self)
        self._inbox = self.inbox.bind(self)

    @property
    def scheduler_address(self) -> str:
        """The scheduler's address (a restarted one's, once the worker found it again)."""
        return self.link.address

    # ================================================================ lifecycle
    def start(self) -> Worker:
        self._listener = registry.listen(self.listen_address, self.peers.on_connect, self.security)
        self.address = self._listener.address
        try:
            data = self.memory.open(self.local_directory)
            self.state = WorkerState(
                self.address,
                self.nthreads,
                self.resources,
                self.settings.transfer_incoming_count_limit,
                data=data,
                devices={"GPU": self.gpus.ids} if self.gpus else None,
            )
            self.tasks.use(self.state)
            # before any connection to the scheduler, as dask's: no task runs before it
            self.preloads.setup(self)
            self.link.open(
                RegisterWorker(
                    self.address,
                    self.nthreads,
                    self.memory_limit,
                    self.name or self.address,
                    self.host,
                    self.resources,
                    {},
                    os.getpid(),
                    None,
                    # when it leaves: the scheduler keeps tasks that would outlast it off it
                    leaving_at(self.heartbeats.lifetime, self.walltime_end),
                    list(self.gpus.ids) if self.gpus else None,
                    self.resources_only,
                    batch_job_id(),  # a gang's slots come from one job
                )
            )
        except BaseException:  # spill directory, preloads, scheduler: nothing is left open
            self._listener.stop()
            self.memory.close()
            raise
        self.heartbeats.start(time.monotonic())
        self.loop.start()
        logger.info(
            "worker %s (%s) connected to %s", self.address, self.name, self.scheduler_address
        )
        return self

    def run(self) -> None:
        """Start and block until closed, and the close is over (the CLI's main loop)."""
        if not self.address:
            self.start()
        while not self._closed.wait(1.0):
            pass
        if not self._close_done.wait(CLOSE_WAIT):
            logger.warning(
                "worker %s: closing took over %ss; leaving anyway", self.address, CLOSE_WAIT
            )

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
        self.tasks.close()
        self.link.close()
        self.peers.close()
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close(timeout=2.0)
        self.control.cleanup()  # a temporary directory it made for uploads
        self.preloads.teardown(self)
        self.memory.close()
        self._close_done.set()
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> Worker:
        return self.start() if not self.address else self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ================================================================ the loop
    def _process(self, items: list) -> None:
        """One iteration's items, each handed to its handler (:attr:`inbox`); then the
        commands they caused are carried out, unless the scheduler closed us meanwhile."""
        out: list = []
        table = self._inbox
        for item in items:
            out += table[type(item)](item)
            if self._halted:
                return
        self._carry_out(out)

    @inbox.on(FromScheduler)
    def _from_scheduler(self, item: FromScheduler) -> list:
        """The scheduler's messages, each decoded to its record and given to its handler
        (:attr:`handlers`); the commands they cause. A message that is not a known op
        with the right fields is logged and skipped: the one error path."""
        out: list = []
        table, now = self._table, time.time()
        for msg in item.msgs:
            try:
                # the scheduler sends no stimulus ids; each event decoded here is given one
                # ("<op>-<n>"), so that a state change can be traced to its message
                record = receive(SCHEDULER_TO_WORKER, msg, stimulus, now=now)
                handler = table.get(type(record))
                if handler is None:
                    raise MalformedMessage(
                        f"{type(record).__name__}: the worker has no handler for it"
                    )
            except MalformedMessage as e:
                logger.error("worker %s ignores a message from the scheduler: %s", self.address, e)
                continue
            out += handler(record)
        return out

    @inbox.on(SchedulerGone)
    def _scheduler_gone(self, item: SchedulerGone) -> tuple:
        if self.link.reconnects():
            self.link.lose(self.address)
            return ()
        self._halted = True
        # after a "close" it asked for, the scheduler's exit code stands
        code = None if self.link.close_asked else EXIT_SCHEDULER_LOST
        if code is not None:
            logger.warning(
                "worker %s: the connection to the scheduler at %s is gone (the scheduler "
                "ended, or dropped this worker after hearing nothing from it for "
                "scheduler.worker-ttl, as across a network outage); exiting with status %d",
                self.address,
                self.scheduler_address,
                code,
            )
        threading.Thread(
            target=self.close, args=("scheduler connection lost", code), daemon=True
        ).start()
        return ()

    @inbox.on(FromPeer, PeerGone)
    def _peer(self, item: FromPeer | PeerGone) -> list:
        return self._handle_all(self.peers.handle(item))

    @inbox.on(ToScheduler)
    def _to_scheduler(self, item: ToScheduler) -> tuple:
        self.link.send(item.record)
        return ()

    @inbox.on(RangesDone)
    def _ranges_done(self, item: RangesDone) -> tuple:
        self.ranges.deliver(item.batch)
        return ()

    @inbox.on(ev.RangeThreadDone, ev.RangesWaiting)
    def _range_thread_event(self, event: ev.RangeThreadDone | ev.RangesWaiting) -> list:
        assert self.state is not None
        return self.state.handle(self.ranges.as_of_now(event))  # counted there: stale now

    # the scheduler's records (see handlers) and the worker's own events, on the loop
    @inbox.on(*OWN_EVENTS)
    @handlers.on(
        *sorted(
            (WorkerState.handlers.table.keys() & SCHEDULER_TO_WORKER.values()) - {UpdateData},
            key=lambda t: t.__name__,
        )
    )
    def _state_event(self, event: Any) -> list:
        assert self.state is not None
        return self.state.handle(event)

    @handlers.on(UpdateData)
    def _update_data(self, record: UpdateData) -> list:
        # the values travel serialized (each its own blob, so that one bad value errs alone);
        # the state machine's event holds them deserialized
        assert self.state is not None
        return self.state.handle(
            records.replace(record, data={k: deserialize(v) for k, v in record.data.items()})
        )

    @handlers.on(ComputeRange)
    def _compute_range(self, record: ComputeRange) -> list:
        assert self.state is not None
        return self.state.handle(self.ranges.submit(record))

    @handlers.on(ReleaseRange)
    def _release_range(self, record: ReleaseRange) -> list:
        assert self.state is not None
        return self.state.handle(self.ranges.answer_release(record))

    @handlers.on(GetData)
    def _get_data(self, request: GetData) -> tuple:
        self.peers.serve(None, request)
        return ()

    @handlers.on(Close)
    def _scheduler_closes(self, request: Close) -> tuple:
        self.link.close_asked = True
        self._halted = True  # _process carries out nothing from here on
        self.exit_code = int(request.exit_code or 0)
        threading.Thread(target=self.close, args=(request.reason,), daemon=True).start()
        return ()

    @handlers.on(*WorkerControl.handlers.table)
    def _control(self, request: Any) -> tuple:
        self.control.handle(request)
        return ()

    @handlers.on(HeartbeatInterval)
    def _heartbeat_interval(self, record: HeartbeatInterval) -> tuple:
        """Heartbeat as often as the scheduler asks (its registration's answer says it
        first), the loop ticking at least that often."""
        self.heartbeats.set_interval(record.interval, time.monotonic())
        self.loop.tick_interval = min(self.loop.tick_interval, self.heartbeats.interval)
        return ()

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

    def _carry_out(self, commands: list) -> None:
        state = self.state
        assert state is not None
        send, tasks = self.link.send, self.tasks
        work = [commands]
        while work:
            inline = []
            for cmd in work.pop():
                t = type(cmd)
                if t is ev.Send:
                    send(cmd.msg)
                elif t is ev.Execute:
                    if tasks.place(cmd):
                        inline.append(cmd)
                elif t is ev.GatherDep:
                    self.peers.gather(cmd.worker, cmd.keys)
                elif t is ev.RunRanges:
                    self.link.after_flush((self.ranges.start_thread,))
                elif t is ev.Resume:
                    tasks.resume(cmd.key)
                elif t is ev.Interrupt:
                    interrupt(cmd.keys)
                    self.ranges.drop(cmd.keys)
            for cmd in inline:
                # known to take well under a millisecond: run here, and handle the result
                # at once (its "task-finished" leaves with this batch)
                result = tasks.run_inline(cmd)
                if result is not None:
                    work.append(state.handle(result))

    def _tick(self, now: float) -> None:
        state = self.state
        assert state is not None
        if self.memory.limits.managed:  # one sample; a pause or resume is the state's
            change = self.memory.sample(self.address, state.status == "paused")
            if change is not None:
                self._carry_out(
                    state.handle(
                        ev.PauseWorker(change, now=now, stimulus_id=stimulus("pause-worker"))
                    )
                )
        mono = time.monotonic()
        if not self.heartbeats.due(mono):
            return
        self._carry_out(self._handle_all(self.peers.expire(mono, now)))
        # what the heartbeat reports: task counts, status, bandwidth, CPU, memory, logs
        m: dict[str, Any] = {
            "executing": len(state.executing),
            "ready": len(state.ready),
            "in_memory": len(state.data),
            "in_flight": len(state.in_flight_workers),
            "time": time.time(),
            "status": state.status,
        }
        bandwidth = self.peers.take_bandwidth()
        if bandwidth is not None:
            m["bandwidth"] = bandwidth
        self.telemetry.add_to(m)
        m.update(self.memory.metrics())
        for record in self.heartbeats.reports(self.address, m, mono):
            self.link.send(record)

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
        self.tasks.secede(key, compute_duration)

    def rejoin_task(self, key: Any) -> None:
        """Block until the seceded task ``key`` has a thread slot again (or the worker
        closes): see ``hpcsched.rejoin``."""
        self.tasks.rejoin(key)


def leaving_at(lifetime: float | None, walltime_end: float | None) -> float | None:
    """When a worker starting now will leave (epoch seconds): its lifetime's end, or its
    job's walltime's, whichever comes first; None: not known.

    >>> leaving_at(None, None), leaving_at(None, 5.0)
    (None, 5.0)
    """
    ends = [] if walltime_end is None else [walltime_end]
    if lifetime:
        ends.append(time.time() + lifetime)
    return min(ends) if ends else None

