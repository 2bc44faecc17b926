"""A client's link to its scheduler: finding it, connecting, and the threads that talk.

:func:`locate_scheduler` turns what ``Client(...)`` was given (an address, a
scheduler file, a cluster object, nothing) into a scheduler address, as
dask.distributed's ``Client`` does; :func:`open_comm` connects and registers
the client. A :class:`SchedulerConnection` then owns the connection:

- one **sender** thread sends everything the client queues, in batches (a
  ``Future.__del__`` only puts a message on a queue, never blocks on a socket;
  runs of ``client-releases-keys`` are merged into one message, see
  :func:`coalesce`); what is queued are protocol records
  (:mod:`hpcsched.core.protocol.client`), encoded once, there, as they are sent;
- what the scheduler sends reaches the client as it reaches a server: the comm
  delivers it (``Comm.deliver_to``) to a :class:`~hpcsched.core.comm.loop.Loop`,
  which hands each message to the client's ``on_message`` (which decodes and
  dispatches it) and calls ``on_batch`` once per batch. The client's handlers
  are short and never block (``any_thread``), so the transport's own thread runs
  them when the loop is idle: the TCP I/O thread, MPI's progress thread, or, for
  a scheduler in this process, the scheduler's thread as it sends (a thread
  wake-up fewer per batch: one per finished task of a ``map``);
- a :class:`SchedulerWatch` pings a silent
  scheduler and gives it up after ``client.scheduler-timeout``.

When the connection ends (closed, or the scheduler lost) ``on_lost`` is called
once with the reason, and every waiting request fails with ``ConnectionError``.
A scheduler that keeps a journal (it says so at registration) and vanishes
without saying it closes may be restarted from it: for
``client.scheduler-reconnect-timeout`` seconds the connection looks for it again
(:func:`~hpcsched.core.comm.scheduler_file.find_again`); meanwhile futures stay pending, and what is sent
waits. Reconnected under the same client id, it sends again the requests still
waiting for an answer, and ``on_reconnected`` runs (the client says again which
keys it wants). Only past the timeout is the scheduler lost.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from hpcsched.core import config, seams
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Comm, CommClosedError, Security, unparse_address
from hpcsched.core.comm.loop import CLOSED, Loop
from hpcsched.core.comm.scheduler_file import (
    find_again,
    looks_like_scheduler_file,
    read_scheduler_file,
    wait_for_scheduler_file,
)
from hpcsched.core.protocol import records
from hpcsched.core.protocol.messages import (
    ClientReleasesKeys,
    RegisterClient,
    SchedulerInfo,
    encode,
)
from hpcsched.core.settings import ClientSettings
from hpcsched.core.worker.context import task_scheduler

logger = logging.getLogger("hpcsched.client")

#: the scheme of an address given without one (``host:port``), as distributed's
#: ``distributed.comm.default-scheme``
DEFAULT_SCHEME = "tcp"
MAX_SEND_BATCH = 10_000  # messages per send at most


class Located:
    """Where a client's scheduler is, and the cluster the client started for it (if any)."""

    __slots__ = ("address", "security", "cluster", "owns_cluster")

    def __init__(self, address: str, security: Security | None, cluster: Any = None,
                 owns_cluster: bool = False):
        self.address = address
        self.security = security
        self.cluster = cluster
        self.owns_cluster = owns_cluster


def locate_scheduler(address: Any, scheduler_file: str | None, security: Security | None,
                     timeout: float | None, cluster_kwargs: dict,
                     default: tuple[str | None, Security | None]) -> Located:
    """The scheduler ``Client(address, scheduler_file=..., **cluster_kwargs)`` connects to.

    ``address`` may be an address (``host:port`` means TCP), a scheduler file's path, a
    cluster object (anything with ``scheduler_address``) or None: then, in order, the
    cluster a task runs on, ``default`` (set by ``python -m hpcsched`` on rank 0),
    ``HPCSCHED_SCHEDULER_ADDRESS``, ``HPCSCHED_SCHEDULER_FILE``, or a new LocalCluster
    made of ``cluster_kwargs``.
    """
    cluster = None
    if scheduler_file is not None:
        if address is not None:
            raise ValueError("give an address or a scheduler_file, not both")
        address = wait_for_scheduler_file(scheduler_file, timeout, security)
    if address is None:
        found = _find_running(security, default)
        if found is None:
            cluster = seams.resolve("local-cluster")(**cluster_kwargs)
            return Located(cluster.scheduler_address, cluster.security, cluster, True)
        if cluster_kwargs:
            # the same script runs on a laptop (a LocalCluster of this shape) and under
            # python -m hpcsched (the job's ranks): say what is not used, once
            logger.warning("Client(%s): connecting to the existing scheduler at %s; "
                           "these LocalCluster settings are not used",
                           ", ".join(f"{k}={v!r}" for k, v in cluster_kwargs.items()),
                           found[0])
        address, security = found
    elif hasattr(address, "scheduler_address"):
        cluster = address
        security = security or getattr(address, "security", None)
        address = address.scheduler_address
    elif isinstance(address, tuple):  # from wait_for_scheduler_file
        address, security = address
    elif isinstance(address, str) and "://" not in address:
        if looks_like_scheduler_file(address):
            address, security = wait_for_scheduler_file(address, timeout, security)
        else:
            address = unparse_address(DEFAULT_SCHEME, address)
    return Located(address, security, cluster)


def _find_running(security: Security | None, default: tuple[str | None, Security | None]
                  ) -> tuple[str, Security | None] | None:
    in_task = task_scheduler()  # inside a task: the cluster it runs on, with its worker's
    if in_task is not None:  # credentials (never a new cluster per task)
        return in_task[0], security or in_task[1]
    if default[0] is not None:
        return default[0], security or default[1]
    if os.environ.get("HPCSCHED_SCHEDULER_ADDRESS"):
        return os.environ["HPCSCHED_SCHEDULER_ADDRESS"], security
    if os.environ.get("HPCSCHED_SCHEDULER_FILE"):
        return read_scheduler_file(os.environ["HPCSCHED_SCHEDULER_FILE"], security)
    return None


def open_comm(address: str, client_id: str, security: Security | None,
              timeout: float | None) -> tuple[Comm, Any, bool]:
    """Connect to the scheduler and register as ``client_id``: (comm, the scheduler's first
    answer, whether the scheduler lives in this process)."""
    from hpcsched.core.scheduler.server import LOCAL_SCHEDULERS

    # the scheduler lives in this process: no sockets, no pickling between us (for a
    # client holding its secret: a wrong one must be refused as over the network)
    connect_address = address
    local = LOCAL_SCHEDULERS.get(address)
    if local is not None and local[1] == (security.secret if security else None):
        connect_address = local[0]
    comm = registry.connect(connect_address, timeout=timeout, security=security)
    comm.send([encode(RegisterClient(client_id))])
    try:
        reply = comm.recv(timeout=timeout)
    except (CommClosedError, TimeoutError) as e:
        comm.close()
        raise ConnectionError(f"scheduler at {address} did not accept this client: {e}") \
            from e
    return comm, reply, registry.backend_for(connect_address).same_process


def coalesce(msgs: list) -> list:
    """The wire dicts of the queued records ``msgs``, runs of adjacent
    ``client-releases-keys`` (one per dropped future) merged into one message: the
    scheduler then handles one event for a whole map's worth of releases.

    A queued dict is sent as it is (tests send deliberately malformed messages)."""
    out: list = []
    run: ClientReleasesKeys | None = None  # the release message being built
    for m in msgs:
        cls = m.__class__
        if cls is ClientReleasesKeys:
            if run is None:
                run = ClientReleasesKeys(m.client, list(m.keys))
                out.append(run)
            else:
                run.keys.extend(m.keys)
        else:
            run = None
            out.append(m if cls is dict else encode(m))
    return [encode(x) if x.__class__ is ClientReleasesKeys else x for x in out]


#: the id of the one ``close-client`` request (its reply carries none)
CLOSE_REQUEST = "close-client"


class PendingReply:
    """A request sent to the scheduler (:meth:`SchedulerConnection.send_request`): its
    reply, once it comes."""

    __slots__ = ("conn", "rid", "msg", "event", "box")

    def __init__(self, conn: SchedulerConnection, rid: str, msg: Any):
        self.conn, self.rid, self.msg = conn, rid, msg
        self.event = threading.Event()
        self.box: list = []  # the reply; None if the scheduler was lost

    def reply(self, timeout: float | None = None) -> Any:
        """The reply record; ``TimeoutError`` after ``timeout`` seconds (None: no limit),
        ``ConnectionError`` if the scheduler is lost meanwhile. Once only."""
        try:
            if not self.event.wait(timeout):
                raise TimeoutError(f"no answer from the scheduler to {type(self.msg).__name__} "
                                   f"within {timeout}s")
        finally:
            self.forget()
        if self.box[0] is None:
            raise ConnectionError(f"lost the scheduler at {self.conn.address}")
        return self.box[0]

    def forget(self) -> None:
        """Not waited for any more: a reply that still comes is dropped."""
        self.conn._requests.pop(self.rid, None)


class SchedulerConnection:
    """The threads and request bookkeeping of one client's connection (module docstring).

    ``on_message(msg)`` runs for every message the scheduler sends, ``on_batch()`` after
    each batch of them; ``on_lost(reason)`` once when the scheduler is lost (not after
    :meth:`close`). ``watch=False`` for a scheduler in this process, which cannot hang
    apart from us.
    """

    def __init__(self, comm: Comm, client_id: str, address: str,
                 on_message: Callable[[Any], None], on_batch: Callable[[], None],
                 on_lost: Callable[[str], None], watch: bool = True,
                 reconnect_timeout: float = 0.0, security: Security | None = None,
                 scheduler_file: str | None = None,
                 on_reconnected: Callable[[], None] | None = None):
        self.comm = comm
        self.client_id = client_id
        self.address = address
        self.closed = False
        self._outq: queue.SimpleQueue = queue.SimpleQueue()
        #: queue a record without the closed check (``Future.__del__``'s releases)
        self.post: Callable[[Any], None] = self._outq.put
        # request id -> (answered, [the answer], the request: sent again after a reconnect)
        self._requests: dict[str, tuple[threading.Event, list, Any]] = {}
        self._ids = itertools.count()
        self._on_message = on_message
        self._on_lost = on_lost
        self._lost_reason = ""
        self._watch = SchedulerWatch(client_id, self._ping, self._unresponsive) \
            if watch else None
        self._loop = Loop(f"{client_id}-receive", self._receive, on_batch, any_thread=True,
                          raise_gc=False)
        self._sender = threading.Thread(target=self._send_loop, name=f"{client_id}-sender",
                                        daemon=True)
        self.reconnect_timeout = reconnect_timeout
        self._security, self._scheduler_file = security, scheduler_file
        self._on_reconnected = on_reconnected
        self._connected = threading.Event()  # clear while looking for a vanished scheduler
        self._connected.set()
        self._closing_announced = False  # the scheduler said it closes: no reconnecting
        self._stopped = threading.Event()  # closed: a search for the scheduler ends

    def start(self, first: Any) -> None:
        """Receive: ``first`` (the scheduler's answer to the registration, read before)
        then everything the comm delivers; start the sender."""
        self._loop.put(("scheduler", first))
        self.comm.deliver_to(self._loop, "scheduler", CLOSED)
        self._loop.start()
        self._sender.start()

    def start_watch(self) -> None:
        """Start watching the scheduler (once the client is registered and running)."""
        if self._watch is not None:
            self._watch.start()

    # ---------------------------------------------------------------- sending
    def send(self, msg: Any) -> None:
        """Queue the record ``msg`` for the scheduler (``RuntimeError`` once the client is
        closed); it is encoded when the sender thread sends it."""
        if self.closed:
            raise RuntimeError("this client is closed")
        self._outq.put(msg)

    def new_id(self, what: str) -> str:
        """A request id unique in this client."""
        return f"{self.client_id}-{what}-{next(self._ids)}"

    def request(self, msg: Any, timeout: float | None = None) -> Any:
        """Send the request record ``msg`` and return the scheduler's reply record.

        An empty ``request_id`` is given a fresh one (the reply carries it back): the record
        sent is a copy, ``msg`` is left as it is. ``TimeoutError`` after ``timeout`` seconds
        (None: no limit), ``ConnectionError`` if the scheduler is lost meanwhile."""
        return self.send_request(msg).reply(timeout)

    def send_request(self, msg: Any) -> PendingReply:
        """:meth:`request` in two steps: ``msg`` is sent now, the reply is awaited with the
        returned :class:`PendingReply` (several requests may then be in flight at once)."""
        if not isinstance(msg, records.Record):
            raise TypeError(f"a request is a protocol record, not {type(msg).__name__}")
        if hasattr(msg, "request_id"):
            rid = msg.request_id
            if not rid:
                rid = self.new_id(type(msg).__name__)
                msg = records.replace(msg, request_id=rid)
        elif hasattr(msg, "scatter_id"):
            rid = msg.scatter_id
        else:  # close-client: one per client, its reply carries no id
            rid = CLOSE_REQUEST
        pending = PendingReply(self, rid, msg)
        self._requests[rid] = (pending.event, pending.box, msg)
        try:
            self.send(msg)
        except BaseException:
            pending.forget()
            raise
        return pending

    def deliver_reply(self, rid: str | None, reply: Any) -> None:
        """Hand ``reply`` to the request ``rid`` waiting for it (a reply nobody waits for --
        a ping's, a timed-out request's -- is dropped)."""
        entry = self._requests.get(rid) if rid is not None else None
        if entry is not None:
            entry[1].append(reply)
            entry[0].set()

    def _send_loop(self) -> None:
        get = self._outq.get
        get_nowait = self._outq.get_nowait
        while True:
            msg = get()
            if msg is None:
                return
            msgs = [msg]
            try:
                while len(msgs) < MAX_SEND_BATCH:
                    m = get_nowait()
                    if m is None:
                        self._comm_send(coalesce(msgs))
                        return
                    msgs.append(m)
            except queue.Empty:
                pass
            self._comm_send(coalesce(msgs))

    def _comm_send(self, msgs: list) -> None:
        while True:
            if not self._connected.is_set():  # reconnecting: what is sent waits for it
                self._connected.wait(self.reconnect_timeout + 1.0)
            comm = self.comm
            try:
                comm.send(msgs)
                return
            except (CommClosedError, OSError) as e:
                logger.debug("client send failed: %s", e)
                if self.closed or self.reconnect_timeout <= 0 or self._closing_announced:
                    return
                # the loop sees the comm closed and starts reconnecting, or has: wait for
                # a new comm (none comes: the scheduler is lost and this batch with it)
                deadline = time.monotonic() + self.reconnect_timeout + 1.0
                while self.comm is comm and not self.closed and time.monotonic() < deadline:
                    self._connected.wait(0.1)
                if self.comm is comm:
                    return

    # ---------------------------------------------------------------- receiving
    def _receive(self, items: list) -> None:
        """The loop's ``process``: each ``(source, batch)`` the comm delivered."""
        on_message = self._on_message
        for _, msgs in items:
            if msgs is CLOSED:
                if self.reconnect_timeout > 0 and not self.closed \
                        and not self._closing_announced:
                    self._start_reconnect()
                else:
                    self.lost()
                continue
            if self._watch is not None:
                self._watch.heard()
            for msg in msgs if type(msgs) is list else (msgs,):
                on_message(msg)

    def _ping(self) -> None:
        if not self.closed:  # any answer will do: the loop hears it
            self._outq.put(SchedulerInfo(self.new_id("ping")))

    def _unresponsive(self, reason: str) -> None:
        logger.error("client %s: %s at %s: giving up on it", self.client_id, reason,
                     self.address)
        self._lost_reason = f": {reason}"
        self.comm.close()  # the loop sees it closed and errs what waits

    def lost(self) -> None:
        """The scheduler is gone (or closing): tell the client, fail waiting requests."""
        if self.closed:
            return
        self._closing_announced = True
        if self._watch is not None:
            self._watch.stop()
        self._on_lost(f"lost the scheduler at {self.address}{self._lost_reason}")
        for event, box, _ in list(self._requests.values()):
            box.append(None)
            event.set()
        self._connected.set()  # a sender waiting for a reconnect goes on (and drops)

    # ---------------------------------------------------------------- reconnecting
    def _start_reconnect(self) -> None:
        if not self._connected.is_set():
            return  # already looking
        self._connected.clear()
        logger.warning("client %s lost its scheduler at %s: reconnecting for up to %ss",
                       self.client_id, self.address, self.reconnect_timeout)
        threading.Thread(target=self._reconnect, name=f"{self.client_id}-reconnect",
                         daemon=True).start()

    def _reconnect(self) -> None:
        def attempt(address: str, security: Security | None, seconds: float) -> Any:
            return open_comm(address, self.client_id, security, seconds)

        try:
            found = find_again(self.address, self._security, self._scheduler_file,
                               self.reconnect_timeout, attempt,
                               (OSError, TimeoutError, CommClosedError), self._stopped)
        except TimeoutError as e:
            self._lost_reason = f": {e} (client.scheduler-reconnect-timeout)"
            self.lost()
            return
        if found is None:
            return  # closed meanwhile
        (comm, reply, _), address, security = found
        if self.closed:  # closed while the scheduler answered: nothing to resume
            comm.close()
            return
        logger.info("client %s reconnected to the scheduler at %s", self.client_id, address)
        self.address, self._security = address, security
        self.comm = comm
        self._loop.put(("scheduler", reply))
        comm.deliver_to(self._loop, "scheduler", CLOSED)
        if self._on_reconnected is not None:
            self._on_reconnected()
        for _, _, msg in list(self._requests.values()):
            self._outq.put(msg)
        self._connected.set()

    def close(self, timeout: float | None) -> None:
        """Stop the threads (what is queued is sent first) and close the connection."""
        self.closed = True
        self._stopped.set()
        if self._watch is not None:
            self._watch.stop()
        self._connected.set()  # a sender waiting for a reconnect gives up
        self._outq.put(None)
        self.comm.close()
        if self._sender.ident is not None:  # closed before it started: nothing to wait for
            self._sender.join(timeout)
        self._loop.stop(join=True, timeout=5.0 if timeout is None else timeout)

# ---------------------------------------------------------------- the watch
# A client's watch over its scheduler: an unresponsive scheduler is a lost one.
#
# A scheduler that died closes its connection and the client learns it at once.
# One that hangs -- stopped (SIGSTOP, a debugger), swapping, its host gone from
# the network -- leaves the connection open and silent, and without a watch
# ``gather()`` would wait forever. So the client pings: after
# ``client.heartbeat-interval`` seconds without a message from the scheduler it
# sends a cheap request, and after ``client.scheduler-timeout`` seconds without
# any message at all it declares the scheduler lost (its futures err with a
# ``ConnectionError`` naming the timeout), as dask.distributed's client does with
# its heartbeat and comm timeouts.
#
# Anything the scheduler sends counts as an answer, so a busy cluster costs no
# pings; the timeout must exceed the longest single message the client expects
# (a large ``gather`` reply is one message).


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
