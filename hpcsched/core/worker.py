"""The worker server: runs :class:`WorkerState`, executes tasks, serves its data.

Threads of a worker:

* the loop (owns the state machine): scheduler messages, task results and
  transfer results come in through one inbox, batched messages go out;
* ``nthreads`` task threads (:class:`~hpcsched.core.task_pool.TaskPool`), one
  more for each task that seceded while it runs (``hpcsched.secede()``);
* a reader per peer comm, serving ``get-data`` requests straight from the data
  store (the loop is not involved, so a large transfer does not stall it) and
  handing ``data-reply`` answers to the fetch waiting for them;
* up to ``transfer-incoming-count-limit`` fetch threads.

Tasks reach their cluster through :mod:`hpcsched.core.worker_client`
(``get_client()``): one client per worker, made on first use with the
worker's address and credentials, closed with the worker.

A result is serialized only when it leaves the worker (for a peer, or the
client through the scheduler). One that cannot be does not fail silently: the
requester learns which keys failed (and does not report them missing, which
would recompute them), and the scheduler errs the task with the real
exception and its traceback, so that ``result()`` raises instead of waiting.

A worker that cannot reach its scheduler for ``death_timeout`` seconds exits
with a message naming the address it tried; one that loses its scheduler
closes at once with :data:`EXIT_SCHEDULER_LOST`, whatever its tasks are doing
(the CLI then leaves without waiting for task threads, so that a batch job
ends with its scheduler). ``lifetime`` (a batch job's walltime) makes it ask
the scheduler to retire it gracefully in time.

Memory (:mod:`hpcsched.core.memory`): with a ``memory_limit``, results live in
a :class:`~hpcsched.core.spill.SpillBuffer` under ``local_directory``, and the
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
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from hpcsched.core import config
from hpcsched.core import events as ev
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Comm, CommClosedError, Security, parse_address
from hpcsched.core.execution import pack_exception, run_spec_call, serialization_errors
from hpcsched.core.graph import key_split
from hpcsched.core.loop import CLOSED, Loop, start_reader
from hpcsched.core.memory import MemoryLimits
from hpcsched.core.serialize import SerializationError, deserialize, serialize, sizeof
from hpcsched.core.spill import SpillBuffer, local_directory
from hpcsched.core.task_pool import TaskPool
from hpcsched.core.telemetry import WorkerTelemetry
from hpcsched.core.worker_client import TaskNeedsThread, enter_task, leave_task
from hpcsched.core.worker_control import OPS as CONTROL_OPS
from hpcsched.core.worker_control import WorkerControl
from hpcsched.core.worker_memory import MemoryMonitor
from hpcsched.core.worker_state import WorkerState

if TYPE_CHECKING:
    from hpcsched.core.client import Client

logger = logging.getLogger("hpcsched.worker")

INLINE_TASK = 0.0005  # seconds: tasks of a group averaging less run on the loop thread
IDLE_REPORT_EVERY = 10  # heartbeat intervals between reports of a worker without news
EXIT_SCHEDULER_LOST = 1  # exit status of a worker whose scheduler went away unannounced


class Worker:
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
    ):
        self.scheduler_address = scheduler_address
        # this worker's own directory for files (dask's local_directory); made on demand
        self.local_directory = local_directory
        if local_directory is not None:
            os.makedirs(local_directory, exist_ok=True)
        self.nthreads = nthreads or os.cpu_count() or 1
        self.memory_limit = memory_limit or 0
        self.name = name
        self.resources = dict(resources or {})
        self.security = security
        scheme, _ = parse_address(scheduler_address)
        if listen_address is None:
            listen_address = {"tcp": "tcp://0.0.0.0:0", "tls": "tls://0.0.0.0:0",
                              "mpi": "mpi://"}.get(scheme, "inproc://")
            if scheme in ("tcp", "tls") and host:
                listen_address = f"{scheme}://{host}:0"
        self.listen_address = listen_address
        self.death_timeout = config.get("worker.death-timeout", death_timeout)
        self.lifetime = lifetime
        if lifetime and lifetime_stagger:
            self.lifetime = max(lifetime + random.uniform(-lifetime_stagger, lifetime_stagger),
                                1.0)
        self.heartbeat_interval = config.get("worker.heartbeat-interval", heartbeat_interval)
        self.host = host or socket.gethostname()
        self.address = ""
        self.state: WorkerState | None = None
        self.memory = MemoryLimits.from_config(
            int(self.memory_limit), target=memory_target_fraction, spill=memory_spill_fraction,
            pause=memory_pause_fraction, terminate=memory_terminate_fraction)
        self.spill_buffer: SpillBuffer | None = None
        self.memory_monitor = MemoryMonitor(self.memory, on_memory_terminate, restartable)
        self._close_asked = False  # the scheduler said "close" (its exit code stands)
        tick = self.heartbeat_interval
        if self.memory.managed:
            tick = min(tick, float(config.get("worker.memory.monitor-interval")))
        self._next_heartbeat = 0.0
        self.loop = Loop("hpcsched-worker", self._process, self._flush, self._tick, tick)
        self.executor = TaskPool(self.nthreads, "hpcsched-task")
        self.fetcher = ThreadPoolExecutor(config.get("worker.transfer-incoming-count-limit"),
                                          thread_name_prefix="hpcsched-fetch")
        self._scheduler_comm: Comm | None = None
        self._outbox: list = []
        self._listener = None
        self._peers: dict[str, Comm] = {}
        self._peer_lock = threading.Lock()
        self._reading: set[int] = set()
        self._direct: set[int] = set()  # peer comms delivering onto the loop's inbox
        # request id -> (worker, keys, comm, started): fetches answered on the loop
        self._direct_fetches: dict[str, tuple[str, list, Comm, float]] = {}
        self._pending: dict[str, tuple[threading.Event, list, Any]] = {}
        self._ids = itertools.count()
        self._closed = threading.Event()
        self._close_done = threading.Event()
        self._close_lock = threading.Lock()
        self.close_reason = ""
        self.exit_code = 0  # what the scheduler asked us to exit with (MPI jobs)
        self._started = 0.0
        self._retire_asked = False
        self._on_close = on_close
        self._transfers = (0, 0.0)  # bytes fetched from peers, seconds spent: bandwidth
        self._uses_heartbeat = scheme in ("tcp", "tls")
        self._quiet_ticks = IDLE_REPORT_EVERY  # intervals without a report: the first is due
        self._client: Client | None = None  # for tasks: get_client()
        self._client_lock = threading.Lock()
        self._resume: dict[Any, threading.Event] = {}  # seceded tasks waiting to rejoin
        # task groups that must not run on the loop thread: one of theirs asked for a client
        self._threaded_groups: set[str] = set()
        self.telemetry = WorkerTelemetry()  # CPU, job id, transfers, logs: sent with heartbeats
        # Client.run and upload_file; replies reach the scheduler through the loop
        self.control = WorkerControl(self, lambda reply: self.loop.put(("control", reply)))

    # ================================================================ lifecycle
    def start(self) -> Worker:
        self._listener = registry.listen(self.listen_address, self._on_peer, self.security)
        self.address = self._listener.address
        if self.memory.managed and (self.memory.target or self.memory.spill):
            try:
                self.spill_buffer = SpillBuffer(local_directory(self.local_directory),
                                                self.memory.bytes_at("target"))
                self.memory_monitor.spill_buffer = self.spill_buffer
            except OSError as e:
                self._listener.stop()
                raise OSError(f"worker cannot spill to local_directory "
                              f"{local_directory(self.local_directory)!r}: {e}") from e
        self.state = WorkerState(self.address, self.nthreads, self.resources,
                                 config.get("worker.transfer-incoming-count-limit"),
                                 data=self.spill_buffer)
        comm = self._connect_scheduler()
        comm.send([{"op": "register-worker", "address": self.address, "nthreads": self.nthreads,
                    "memory_limit": self.memory_limit, "name": self.name or self.address,
                    "host": self.host, "resources": self.resources, "pid": os.getpid(),
                    "keys": {}}])
        try:
            reply = comm.recv(timeout=self.death_timeout)
        except (CommClosedError, TimeoutError) as e:
            comm.close()
            self._listener.stop()
            raise ConnectionError(f"scheduler at {self.scheduler_address} did not answer our "
                                  f"registration: {e}") from e
        first = reply[0] if isinstance(reply, list) and reply else reply
        if not isinstance(first, dict) or first.get("op") != "registered":
            comm.close()
            self._listener.stop()
            msg = first.get("message") if isinstance(first, dict) else repr(first)
            raise ConnectionError(f"scheduler at {self.scheduler_address} refused us: {msg}")
        self._scheduler_comm = comm
        self._started = time.monotonic()
        if isinstance(reply, list) and len(reply) > 1:
            # tasks assigned at registration travel in the same batch as "registered"
            self.loop.inbox.put(("scheduler", reply[1:]))
        self.loop.start()
        start_reader(comm, "scheduler", self.loop.inbox, "worker-scheduler-reader")
        logger.info("worker %s (%s) connected to %s", self.address, self.name,
                    self.scheduler_address)
        return self

    def _connect_scheduler(self) -> Comm:
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
                return registry.connect(self.scheduler_address, timeout=left,
                                        security=self.security)
            except (TimeoutError, OSError) as e:
                if isinstance(e, ConnectionError) and "refused our credentials" in str(e):
                    self._listener.stop()
                    raise
                last = e
                time.sleep(min(0.2, max(left, 0)))

    def run(self) -> None:
        """Start and block until closed, and the close is over (the CLI's main loop)."""
        if not self.address:
            self.start()
        while not self._closed.wait(1.0):
            pass
        if not self._close_done.wait(15.0):  # each step of close() is bounded
            logger.warning("worker %s: closing took over 15s; leaving anyway", self.address)

    def wait_closed(self, timeout: float | None = None) -> bool:
        return self._closed.wait(timeout)

    def close(self, reason: str = "closed", exit_code: int | None = None) -> None:
        with self._close_lock:
            if self._closed.is_set():
                return
            self.close_reason = reason
            if exit_code is not None:
                self.exit_code = exit_code
            self._closed.set()
        logger.info("worker %s closing: %s", self.address, reason)
        if self._listener is not None:
            self._listener.stop()
        self.loop.stop(join=True)
        self.telemetry.close()
        if self.state is not None:
            self.state.closing = True
        self.executor.shutdown()
        self.fetcher.shutdown(wait=False, cancel_futures=True)
        if self._scheduler_comm is not None:
            self._scheduler_comm.close()
        with self._peer_lock:
            peers = list(self._peers.values())
            self._peers.clear()
        for c in peers:
            c.close()
        for event, box, _ in list(self._pending.values()):
            box.append(None)
            event.set()
        for event in list(self._resume.values()):  # seceded tasks waiting to rejoin go on
            event.set()
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close(timeout=2.0)
        self.control.cleanup()  # a temporary directory it made for uploads
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
        now = time.time()
        out: list = []
        for source, payload in items:
            if source == "scheduler":
                if payload is CLOSED:
                    # after a "close" it asked for, the scheduler's exit code stands
                    code = None if self._close_asked else EXIT_SCHEDULER_LOST
                    threading.Thread(target=self.close, args=("scheduler connection lost",
                                                              code), daemon=True).start()
                    return
                for msg in payload:
                    op = msg.get("op")
                    if op in ev.WORKER_OPS:
                        out += state.handle(ev.from_message(ev.WORKER_OPS, msg, now=now))
                    elif op == "update-data":
                        data = {k: deserialize(v) for k, v in msg["data"].items()}
                        out += state.handle(ev.UpdateData(data, msg.get("scatter_id"), now))
                    elif op == "get-data":
                        self._serve(self._scheduler_comm, msg)
                    elif op == "close":
                        self._close_asked = True
                        self.exit_code = int(msg.get("exit_code") or 0)
                        threading.Thread(target=self.close, args=(msg.get("reason", "closed"),),
                                         daemon=True).start()
                        return
                    elif op in CONTROL_OPS:
                        self.control.handle(msg)
                    elif op == "registered":
                        pass
                    else:
                        logger.warning("unknown op from scheduler: %r", op)
            elif source == "control":  # a Client.run / upload_file reply
                self._outbox.append(payload)
            elif type(source) is tuple:  # ("peer", comm): a direct peer comm
                out += self._peer_message(source[1], payload)
            else:  # our own events: task results, transfers
                out += state.handle(payload)
        self._carry_out(out)

    def _carry_out(self, commands: list) -> None:
        work = [commands]
        while work:
            inline = []
            for cmd in work.pop():
                t = type(cmd)
                if t is ev.Send:
                    self._outbox.append(cmd.msg)
                elif t is ev.Execute:
                    ts = self.state.tasks.get(cmd.key)
                    if ts is not None and ts.duration < INLINE_TASK and not (
                            self._threaded_groups and key_split(cmd.key) in self._threaded_groups):
                        inline.append(cmd)
                    else:
                        # "task-started" goes out when the loop flushes after this batch;
                        # should the task kill the process first, the scheduler blames all
                        # it had assigned here
                        self.executor.submit(self._execute, cmd.key, cmd.run_spec)
                elif t is ev.GatherDep:
                    comm = self._direct_peer(cmd.worker)
                    if comm is not None:  # no thread needed: the reply comes to the loop
                        self._send_fetch(comm, cmd.worker, cmd.keys)
                    else:
                        self.fetcher.submit(self._fetch, cmd.worker, cmd.keys)
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
                    work.append(self.state.handle(result))

    def _flush(self) -> None:
        if self._outbox and self._scheduler_comm is not None:
            msgs, self._outbox = self._outbox, []
            try:
                self._scheduler_comm.send(msgs)
            except (CommClosedError, OSError):
                pass

    def _tick(self, now: float) -> None:
        if self.memory.managed:
            self._monitor_memory(now)
        mono = time.monotonic()
        if mono < self._next_heartbeat:
            return
        self._next_heartbeat = mono + self.heartbeat_interval * 0.95
        limit = config.get("comm.timeouts.connect") * 4
        for rid, (worker, keys, _, started) in list(self._direct_fetches.items()):
            if mono - started > limit:
                del self._direct_fetches[rid]
                self._carry_out(self.state.handle(ev.GatherDepFailure(
                    worker, keys, f"no answer within {limit:.0f}s", now)))
        # TCP: the heartbeat is how the scheduler detects lost workers. Other transports
        # (an MPI rank that dies ends the job) report when there is news (a measured
        # bandwidth, transfers, logs), and otherwise only every IDLE_REPORT_EVERY intervals:
        # idle ranks stay nearly silent, yet the dashboard's workers table keeps their CPU
        # and memory current
        m = self.metrics()
        self._quiet_ticks += 1
        if self._uses_heartbeat or "bandwidth" in m or "transfers" in m or "logs" in m \
                or self._quiet_ticks >= IDLE_REPORT_EVERY:
            self._quiet_ticks = 0
            self._outbox.append({"op": "heartbeat", "metrics": m})
        if self.lifetime and not self._retire_asked and mono - self._started > self.lifetime:
            self._retire_asked = True
            logger.info("worker %s: lifetime of %.0fs is up, retiring", self.address,
                        self.lifetime)
            self._outbox.append({"op": "retire-me"})

    # ================================================================ memory
    def _monitor_memory(self, now: float) -> None:
        """One sample of process memory; a pause or resume goes through the state machine."""
        change = self.memory_monitor.sample(self.address, self.state.status == "paused")
        if change is not None:
            self._carry_out(self.state.handle(ev.PauseWorker(change, now)))

    def metrics(self) -> dict:
        st = self.state
        m = {"executing": len(st.executing), "ready": len(st.ready), "in_memory": len(st.data),
             "in_flight": len(st.in_flight_workers), "time": time.time(),
             "status": st.status}
        nbytes, seconds = self._transfers
        if seconds > 0 and nbytes >= 1_000_000:  # small transfers measure latency, not speed
            m["bandwidth"] = nbytes / seconds
            self._transfers = (0, 0.0)
        self.telemetry.add_to(m)
        m.update(self.memory_monitor.metrics())
        return m

    # ================================================================ execution
    def _execute(self, key: Any, run_spec: Any) -> None:
        """In an executor thread: run the task, hand the result to the loop."""
        self.loop.put((None, self._run(key, run_spec)))

    def _run(self, key: Any, run_spec: Any, on_loop: bool = False) -> Any:
        """Run a task; its ExecuteSuccess / ExecuteFailure, or None if it ran on the loop
        thread and needs a task thread instead (see :mod:`~hpcsched.core.worker_client`)."""
        start = time.time()
        outer = enter_task(self, key, on_loop, start)
        try:
            value = run_spec_call(run_spec, self.state.data)
        except BaseException as e:  # noqa: BLE001 - reported to the scheduler
            if on_loop and type(e) is TaskNeedsThread:
                return None
            stop = time.time()
            packed, tb_text, text = pack_exception(e, e.__traceback__)
            logger.warning("task %r failed: %s", key, text)  # as dask's "Compute Failed"
            return ev.ExecuteFailure(key, packed, tb_text, text, start, stop, stop)
        finally:
            leave_task(outer)
        stop = time.time()
        try:
            nbytes = sizeof(value)
        except Exception:
            nbytes = 64
        return ev.ExecuteSuccess(key, value, nbytes, type(value).__name__, start, stop, stop)

    # ================================================================ tasks' API
    def get_client(self, timeout: float | None = None) -> Client:
        """This worker's client (made on first use): connected to its scheduler with its
        credentials, shared by its tasks, closed with it. See ``hpcsched.get_client``."""
        with self._client_lock:
            if self._closed.is_set():
                raise RuntimeError(f"worker {self.address} is closed")
            client = self._client
            if client is None or client.status != "running":
                from hpcsched.core.client import Client

                if client is not None:  # lost its scheduler: replaced, not leaked
                    client.close(timeout=1.0)
                client = self._client = Client(
                    self.scheduler_address, security=self.security, timeout=timeout,
                    set_as_default=False, name=f"worker-{self.name or 'w'}")
            return client

    def secede_task(self, key: Any, compute_duration: float) -> None:
        """The task ``key`` (on the calling thread) leaves the pool: see ``hpcsched.secede``."""
        self.loop.put((None, ev.Secede(key, compute_duration, time.time())))

    def rejoin_task(self, key: Any) -> None:
        """Block until the seceded task ``key`` has a thread slot again (or the worker
        closes): see ``hpcsched.rejoin``."""
        event = self._resume[key] = threading.Event()
        self.loop.put((None, ev.Rejoin(key, time.time())))
        while not event.wait(1.0):
            if self._closed.is_set():
                break
        self._resume.pop(key, None)

    # ================================================================ peers
    def _on_peer(self, comm: Comm) -> None:
        self._attach(comm)

    def _attach(self, comm: Comm) -> bool:
        """Route a peer comm's messages: straight onto the loop's inbox where the backend
        can (MPI, inproc: returns True), else through a reader thread."""
        with self._peer_lock:
            if id(comm) in self._reading:
                return id(comm) in self._direct
            self._reading.add(id(comm))
        if comm.deliver_to(self.loop.inbox, ("peer", comm), CLOSED):
            with self._peer_lock:
                self._direct.add(id(comm))
            return True
        threading.Thread(target=self._peer_reader, args=(comm,), daemon=True,
                         name=f"worker-peer {comm.peer_address}").start()
        return False

    def _peer_comm(self, address: str) -> Comm:
        with self._peer_lock:
            comm = self._peers.get(address)
            if comm is not None and not comm.closed:
                return comm
        comm = registry.connect(address, timeout=config.get("comm.timeouts.connect"),
                                security=self.security)
        with self._peer_lock:
            existing = self._peers.get(address)
            if existing is not None and not existing.closed and existing is not comm:
                comm.close()
                return existing
            self._peers[address] = comm
        self._attach(comm)
        return comm

    def _direct_peer(self, address: str) -> Comm | None:
        """The open peer comm to ``address`` whose messages reach the loop directly."""
        with self._peer_lock:
            comm = self._peers.get(address)
            if comm is not None and not comm.closed and id(comm) in self._direct:
                return comm
        return None

    def _send_fetch(self, comm: Comm, worker: str, keys: list) -> None:
        """Ask ``worker`` for ``keys`` over a direct comm: the reply is handled on the loop."""
        rid = f"{self.address}/{next(self._ids)}"
        self._direct_fetches[rid] = (worker, keys, comm, time.monotonic())
        try:
            comm.send([{"op": "get-data", "keys": keys, "request_id": rid}])
        except (CommClosedError, OSError) as e:
            if self._direct_fetches.pop(rid, None) is not None:
                self.loop.put((None, ev.GatherDepFailure(worker, keys, str(e), time.time())))

    def _peer_message(self, comm: Comm, payload: Any) -> list:
        """A message from a direct peer comm, on the loop thread; returns state commands."""
        now = time.time()
        if payload is CLOSED:
            with self._peer_lock:
                self._reading.discard(id(comm))
                self._direct.discard(id(comm))
                for a, c in list(self._peers.items()):
                    if c is comm:
                        del self._peers[a]
            out: list = []
            for rid, (worker, keys, c, _) in list(self._direct_fetches.items()):
                if c is comm:
                    del self._direct_fetches[rid]
                    out += self.state.handle(ev.GatherDepFailure(worker, keys,
                                                                 "connection lost", now))
            return out
        out = []
        for msg in payload if isinstance(payload, list) else [payload]:
            op = msg.get("op") if isinstance(msg, dict) else None
            if op == "get-data":
                self._serve(comm, msg)
            elif op == "data-reply":
                entry = self._direct_fetches.pop(msg.get("request_id"), None)
                if entry is None:
                    continue
                worker, _, _, started = entry
                data = msg.get("data") or {}
                b, t = self._transfers
                self._transfers = (b + sum(sizeof(v) for v in data.values()),
                                   t + time.monotonic() - started)
                self.telemetry.transfer(worker, started, self._transfers[0] - b)
                out += self.state.handle(ev.GatherDepSuccess(
                    worker, data, msg.get("missing") or [], dict(msg.get("errors") or {}), now))
            else:
                logger.warning("dropping peer %s: unexpected op %r", comm.peer_address, op)
                comm.close()
                break
        return out

    def _peer_reader(self, comm: Comm) -> None:
        try:
            while not self._closed.is_set():
                msgs = comm.recv()
                for msg in msgs if isinstance(msgs, list) else [msgs]:
                    op = msg.get("op") if isinstance(msg, dict) else None
                    if op == "get-data":
                        self._serve(comm, msg)
                    elif op == "data-reply":
                        entry = self._pending.get(msg.get("request_id"))
                        if entry is not None:
                            entry[1].append(msg)
                            entry[0].set()
                    else:
                        logger.warning("dropping peer %s: unexpected op %r", comm.peer_address,
                                       op)
                        comm.close()
                        return
        except (CommClosedError, OSError, EOFError):
            pass
        finally:
            with self._peer_lock:
                self._reading.discard(id(comm))
                for a, c in list(self._peers.items()):
                    if c is comm:
                        del self._peers[a]
            for event, box, c in list(self._pending.values()):
                if c is comm:  # fetches waiting on this peer fail now, not at a timeout
                    box.append(None)
                    event.set()

    def _serve(self, comm: Comm | None, msg: dict) -> None:
        data = self.state.data
        get = data.peek if self.spill_buffer is not None else data.__getitem__
        out: dict = {}
        missing = []
        wrap = bool(msg.get("serialized"))
        for key in msg.get("keys", ()):
            try:
                value = get(key)
            except KeyError:
                missing.append(key)
                continue
            out[key] = value
        reply = {"op": "data-reply", "request_id": msg.get("request_id"), "missing": missing}
        errors: dict = {}
        if wrap:  # for a relay (the scheduler): one opaque blob for all the values
            try:
                reply["blob"] = serialize(out)
            except SerializationError:
                errors = serialization_errors(out, self.address)
                reply["blob"] = serialize({k: v for k, v in out.items() if k not in errors})
        else:
            reply["data"] = out
        if errors:
            reply["errors"] = errors
        if comm is self._scheduler_comm:
            self._outbox.append(reply)  # on the loop thread: goes out with this batch
        else:
            try:
                comm.send([reply])
            except SerializationError:  # a value the transport must pickle refuses to be
                errors = serialization_errors(out, self.address)
                reply["data"] = {k: v for k, v in out.items() if k not in errors}
                reply["errors"] = errors
                try:
                    comm.send([reply])
                except (CommClosedError, OSError, SerializationError):
                    pass
            except (CommClosedError, OSError):
                pass
        for key, (packed, tb_text, text) in errors.items():
            logger.warning("the result of %r cannot leave worker %s: %s", key, self.address, text)
            self.loop.put((None, ev.ServeFailed(key, packed, tb_text, text, time.time())))

    def _fetch(self, worker: str, keys: list) -> None:
        rid = f"{self.address}/{next(self._ids)}"
        event = threading.Event()
        box: list = []
        started = time.monotonic()
        try:
            comm = self._peer_comm(worker)
            if id(comm) in self._direct:
                self._send_fetch(comm, worker, keys)
                return
            self._pending[rid] = (event, box, comm)
            comm.send([{"op": "get-data", "keys": keys, "request_id": rid}])
            timeout = config.get("comm.timeouts.connect") * 4
            while not event.wait(1.0):
                timeout -= 1.0
                if self._closed.is_set() or comm.closed or timeout <= 0:
                    raise CommClosedError(f"no answer from {worker}")
            reply = box[0]
            if reply is None:
                raise CommClosedError(f"connection to {worker} lost")
            data = reply.get("data") or {}
            nbytes = sum(sizeof(v) for v in data.values())
            b, t = self._transfers
            self._transfers = (b + nbytes, t + time.monotonic() - started)
            self.telemetry.transfer(worker, started, nbytes)
            result = ev.GatherDepSuccess(worker, reply.get("data") or {},
                                         reply.get("missing") or [],
                                         dict(reply.get("errors") or {}), time.time())
        except (CommClosedError, OSError, TimeoutError) as e:
            result = ev.GatherDepFailure(worker, keys, str(e), time.time())
        finally:
            self._pending.pop(rid, None)
        if not self._closed.is_set():
            self.loop.put((None, result))

