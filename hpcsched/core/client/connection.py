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
- one **reader** thread hands each batch of scheduler messages to the client's
  ``on_messages`` (which decodes them) and routes replies to the requests
  waiting for them. For a scheduler in this process (``direct``) there is none:
  the scheduler's own thread hands each batch over as it sends it (a thread
  wake-up fewer per batch: one per finished task of a ``map``);
- a :class:`~hpcsched.core.client.heartbeat.SchedulerWatch` pings a silent
  scheduler and gives it up after ``client.scheduler-timeout``.

When the connection ends (closed, or the scheduler lost) ``on_lost`` is called
once with the reason, and every waiting request fails with ``ConnectionError``.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from hpcsched.core import seams
from hpcsched.core.client.heartbeat import SchedulerWatch
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Comm, CommClosedError, Inbox, Security, unparse_address
from hpcsched.core.comm.scheduler_file import (
    looks_like_scheduler_file,
    read_scheduler_file,
    wait_for_scheduler_file,
)
from hpcsched.core.protocol.messages import (
    ClientReleasesKeys,
    RegisterClient,
    SchedulerInfo,
    encode,
)

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
    from hpcsched.core.client.worker_client import task_scheduler

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

    A queued dict is sent as it is (a request given as a dict was checked when it was
    decoded into its record; tests send deliberately malformed ones)."""
    out: list = []
    run: list | None = None  # keys of the release message being built
    for m in msgs:
        cls = m.__class__
        if cls is ClientReleasesKeys:
            if run is None:
                run = list(m.keys)
                out.append({"op": ClientReleasesKeys.op, "keys": run})  # type: ignore[attr-defined]
            else:
                run.extend(m.keys)
        else:
            run = None
            out.append(m if cls is dict else encode(m))
    return out


_CLOSED = object()  # what a direct connection's inbox gets once the scheduler closes it


class _Direct(Inbox):
    """A direct connection's inbox: the batch is handled in the scheduler's thread, as it
    is sent. The client's handlers only update futures, set events and queue callbacks
    (:meth:`Client._handle`): short, never blocking, safe in any thread."""

    __slots__ = ("conn",)
    any_thread = True

    def __init__(self, conn: SchedulerConnection):
        self.conn = conn

    def put(self, item: Any) -> None:  # pragma: no cover - inproc offers (any_thread)
        raise RuntimeError("a direct connection's inbox is offered its items")

    def offer(self, item: Any) -> None:
        msgs = item[1]
        if msgs is _CLOSED:
            self.conn.lost()
        else:
            self.conn._on_messages(msgs if isinstance(msgs, list) else [msgs])

    def offer_batch(self, items: list) -> None:
        for item in items:
            self.offer(item)


class SchedulerConnection:
    """The threads and request bookkeeping of one client's connection (module docstring).

    ``on_messages(msgs)`` runs for every batch the scheduler sends (on the reader thread,
    or, ``direct``, on the scheduler's);
    ``on_lost(reason)`` once when the scheduler is lost (not after :meth:`close`).
    ``watch=False`` for a scheduler in this process, which cannot hang apart from us;
    ``direct=True`` (an ``inproc://`` comm) to have its thread hand messages over.
    """

    def __init__(self, comm: Comm, name: str, address: str,
                 on_messages: Callable[[list], None], on_lost: Callable[[str], None],
                 watch: bool = True, direct: bool = False):
        self.comm = comm
        self.address = address
        self.closed = False
        self._outq: queue.SimpleQueue = queue.SimpleQueue()
        #: queue a record without the closed check (``Future.__del__``'s releases)
        self.post: Callable[[Any], None] = self._outq.put
        self._requests: dict[str, tuple[threading.Event, list]] = {}
        self._ids = itertools.count()
        self._name = name
        self._on_messages = on_messages
        self._on_lost = on_lost
        self._lost_reason = ""
        self._watch = SchedulerWatch(name, self._ping, self._unresponsive) if watch else None
        self._reader = None if direct else threading.Thread(
            target=self._read_loop, name=f"{name}-reader", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name=f"{name}-sender",
                                        daemon=True)

    def start(self) -> None:
        """Start the reader (or have the scheduler's thread deliver) and the sender."""
        if self._reader is not None:
            self._reader.start()
        else:
            self.comm.deliver_to(_Direct(self), None, _CLOSED)
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
        return f"{self._name}-{what}-{next(self._ids)}"

    def request(self, msg: Any, rid: str, timeout: float | None) -> Any:
        """Send the record ``msg`` and wait for the reply record carrying ``rid``
        (``TimeoutError`` after ``timeout`` seconds, ``ConnectionError`` if the scheduler is
        lost meanwhile)."""
        event = threading.Event()
        box: list = []
        self._requests[rid] = (event, box)
        try:
            self.send(msg)
            if not event.wait(timeout):
                raise TimeoutError(f"no answer from the scheduler to {msg.op} within "
                                   f"{timeout}s")
        finally:
            self._requests.pop(rid, None)
        if box[0] is None:
            raise ConnectionError(f"lost the scheduler at {self.address}")
        return box[0]

    def deliver_reply(self, msg: Any) -> None:
        """Hand a reply record to the request waiting for it (a reply nobody waits for -- a
        ping's, a timed-out request's -- is dropped)."""
        rid = getattr(msg, "request_id", None) or getattr(msg, "scatter_id", None) or msg.op
        entry = self._requests.get(rid)
        if entry is not None:
            entry[1].append(msg)
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
        try:
            self.comm.send(msgs)
        except (CommClosedError, OSError) as e:
            logger.debug("client send failed: %s", e)

    # ---------------------------------------------------------------- receiving
    def _read_loop(self) -> None:
        watch = self._watch
        try:
            while True:
                msgs = self.comm.recv()
                if watch is not None:
                    watch.heard()
                self._on_messages(msgs if isinstance(msgs, list) else [msgs])
        except (CommClosedError, OSError, EOFError):
            pass
        except Exception:
            logger.exception("client reader failed")
        finally:
            self.lost()

    def _ping(self) -> None:
        if not self.closed:  # any answer will do: the reader hears it
            self._outq.put(SchedulerInfo(self.new_id("ping")))

    def _unresponsive(self, reason: str) -> None:
        logger.error("client %s: %s at %s: giving up on it", self._name, reason, self.address)
        self._lost_reason = f": {reason}"
        self.comm.close()  # the reader sees it closed and errs what waits

    def lost(self) -> None:
        """The scheduler is gone (or closing): tell the client, fail waiting requests."""
        if self.closed:
            return
        if self._watch is not None:
            self._watch.stop()
        self._on_lost(f"lost the scheduler at {self.address}{self._lost_reason}")
        for event, box in list(self._requests.values()):
            box.append(None)
            event.set()

    def close(self, timeout: float | None) -> None:
        """Stop the threads (what is queued is sent first) and close the connection."""
        self.closed = True
        if self._watch is not None:
            self._watch.stop()
        self._outq.put(None)
        self.comm.close()
        self._sender.join(timeout)
        if self._reader is not None:
            self._reader.join(timeout)
