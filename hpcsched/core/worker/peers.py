"""A worker's transfers with its peers: serving ``get-data`` from its data store, and
fetching dependencies from other workers (the state machine's ``GatherDep``).

Every backend hands a peer comm's messages to the worker's loop inbox
(:meth:`~hpcsched.core.comm.base.Comm.deliver_to`), so both directions are
handled where the worker's state lives, on the loop (or on the transport's thread
running the loop's iteration, see :meth:`~hpcsched.core.comm.loop.Loop.offer`):

* a ``get-data`` request is answered at once from the data store;
* a fetch sends ``get-data`` with a request id and returns: no thread waits
  for the answer. The ``data-reply`` carrying that id completes it
  (``GatherDepSuccess``); the peer's comm closing, or no answer within four
  connect timeouts, fails it (``GatherDepFailure``: the state machine asks
  another holder, or the scheduler).

Opening a comm to a peer not yet connected starts on the transport's thread where it
can (:func:`~hpcsched.core.comm.registry.connect_soon`: TCP to an address, not a
host name), which sends the request once connected: a worker of a large cluster
reaches a new peer for nearly every fetch, and a thread hand-off each way costs
more than the fetch. Elsewhere it blocks (a TCP connect to a host name, MPI), so
it runs in a fetch thread. The fetch threads of a process are
shared by its workers (:class:`FetchThreads`: ``worker.transfer-incoming-count-limit``
of them per worker, started when needed, at most :data:`MAX_FETCH_THREADS`):
a process running hundreds of workers reaches a new peer for nearly every
fetch, and starting a thread for each would cost more than the fetch. Comms to
peers are kept and reused, the ``worker.peer-connections`` most recently used
ones (the others are closed once no fetch waits on them).

A result is serialized only when it leaves the worker. One that cannot be does
not fail silently: the requester learns which keys failed (and does not report
them missing, which would recompute them), and the scheduler errs the task
with the real exception (``ServeFailed``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from hpcsched.core import config
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Comm, CommClosedError, Security
from hpcsched.core.comm.loop import Loop
from hpcsched.core.protocol import records
from hpcsched.core.protocol.directions import WORKER_TO_WORKER
from hpcsched.core.protocol.serialize import SerializationError, serialize, sizeof
from hpcsched.core.protocol.wire import MalformedMessage, decode, encode
from hpcsched.core.protocol.worker import DataReply, GetData
from hpcsched.core.settings import CommSettings, WorkerSettings
from hpcsched.core.state import events as ev
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.worker.execution import serialization_errors
from hpcsched.core.worker.parts.inbox import CommInbox, FromPeer, PeerGone, stimulus
from hpcsched.core.worker.telemetry import WorkerTelemetry

logger = logging.getLogger("hpcsched.worker")

SMALL_TRANSFER = 1_000_000  # bytes: below, a transfer measures latency rather than bandwidth
MAX_FETCH_THREADS = 64  # per process, whatever the number of its workers
FETCH_THREAD_IDLE = 10.0  # seconds a fetch thread waits for work before it ends


class FetchThreads:
    """The threads that open comms to peers, shared by the workers of a process.

    Each attached worker adds ``threads`` to the bound (at most
    :data:`MAX_FETCH_THREADS`); threads start when work waits and none is idle, and
    end after :data:`FETCH_THREAD_IDLE` seconds without work or when the last worker
    detaches. A connect that waits on a dead peer holds its thread for the connect
    timeout: the bound grows with the workers, so one worker's dead peers do not stall
    the others' fetches in the meantime.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._work: deque[tuple[Callable[..., None], tuple]] = deque()
        self._limit = 0
        self._threads = 0
        self._idle = 0

    def attach(self, threads: int) -> None:
        with self._cond:
            self._limit += max(1, threads)

    def detach(self, threads: int) -> None:
        """A worker is closing: its share goes; with the last, every thread ends."""
        with self._cond:
            self._limit -= max(1, threads)
            if self._limit <= 0:
                self._limit = 0
                self._work.clear()
            self._cond.notify_all()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._cond:
            if self._limit <= 0:
                return  # every worker is closing: nobody waits for the answer
            self._work.append((fn, args))
            if self._idle >= len(self._work):  # an idle thread is there for each item
                self._cond.notify()
            elif self._threads < min(self._limit, MAX_FETCH_THREADS):
                self._threads += 1
                threading.Thread(target=self._run, name="hpcsched-fetch", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._work:
                    if self._limit <= 0 or self._threads > min(self._limit, MAX_FETCH_THREADS):
                        self._threads -= 1
                        return
                    self._idle += 1
                    woken = self._cond.wait(FETCH_THREAD_IDLE)
                    self._idle -= 1
                    if not woken and not self._work:
                        self._threads -= 1
                        return
                fn, args = self._work.popleft()
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - a bug in one fetch must not end the thread
                logger.exception("a fetch thread's work failed")

    @property
    def threads(self) -> int:
        """Threads running now (for tests)."""
        return self._threads


#: this process's fetch threads
FETCH_THREADS = FetchThreads()


class PeerHost(Protocol):
    """What the peer side uses of its worker (the
    :class:`~hpcsched.core.worker.server.Worker`, which imports this module)."""

    address: str
    security: Security | None
    loop: Loop
    comms: CommInbox  # where its comms deliver
    state: WorkerState | None
    telemetry: WorkerTelemetry

    def send_to_scheduler(self, record: Any) -> None:
        """On the loop: ``record`` leaves with this iteration's batch to the scheduler."""


class PeerTransfers:
    """The peer side of a :class:`~hpcsched.core.worker.server.Worker`; every method but
    :meth:`on_connect` and :meth:`close` runs on the worker's loop."""

    def __init__(self, worker: PeerHost, fetchers: FetchThreads = FETCH_THREADS):
        self.worker = worker
        # settings read once: a worker opens a comm for nearly every fetch in a large cluster
        settings = config.read(WorkerSettings)
        self._connect_timeout = float(config.read(CommSettings).connect_timeout)
        self._max_peers = max(1, int(settings.peer_connections))
        self._threads = int(settings.transfer_incoming_count_limit)
        self.fetcher = fetchers
        fetchers.attach(self._threads)
        self._closed = False
        # peer worker address -> comm we opened to it, least recently used first
        self._peers: OrderedDict[str, Comm] = OrderedDict()
        self._lock = threading.Lock()
        # request id -> (peer worker, keys, comm, monotonic start): fetches under way
        self._fetches: dict[str, tuple[str, list, Comm, float]] = {}
        self._ids = itertools.count()
        self._bytes = 0  # fetched since the last bandwidth report ...
        self._seconds = 0.0  # ... and the time it took

    # ---------------------------------------------------------------- comms
    def on_connect(self, comm: Comm) -> None:
        """A comm a peer opened to us, or one we opened: its messages go to the loop."""
        self.worker.comms.take_from(comm, partial(FromPeer, comm), PeerGone(comm))

    def _open_comm(self, address: str) -> Comm | None:
        """The open comm to ``address``, if any, now the most recently used (under the lock)."""
        comm = self._peers.get(address)
        if comm is None or comm.closed:
            return None
        self._peers.move_to_end(address)
        return comm

    def _connect(self, address: str) -> Comm:
        """In a fetch thread: the comm to ``address``, opened (and attached) if need be."""
        return self._keep(address, registry.connect(address, timeout=self._connect_timeout,
                                                    security=self.worker.security))

    def _keep(self, address: str, comm: Comm) -> Comm:
        """A comm just opened to ``address``: kept (and attached), or closed for one another
        fetch opened first."""
        with self._lock:
            existing = self._open_comm(address)
            if existing is not None:  # another fetch connected first
                comm.close()
                return existing
            if self._closed:
                comm.close()
                raise CommClosedError("the worker is closing")
            self._peers[address] = comm
            idle = self._least_used() if len(self._peers) > self._max_peers else None
        self.on_connect(comm)
        if idle is not None:
            idle.close()
        return comm

    def _least_used(self) -> Comm | None:
        """Under the lock: the least recently used comm no fetch waits on, taken out of
        the kept ones (to be closed); never the newest, opened for a fetch about to start."""
        waited = {id(c) for _, _, c, _ in list(self._fetches.values())}
        for address, comm in itertools.islice(self._peers.items(), len(self._peers) - 1):
            if id(comm) not in waited:
                del self._peers[address]
                return comm
        return None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.fetcher.detach(self._threads)
        with self._lock:
            peers = list(self._peers.values())
            self._peers.clear()
        for c in peers:
            c.close()

    # ---------------------------------------------------------------- fetching
    def gather(self, worker: str, keys: list) -> None:
        """Start fetching ``keys`` from ``worker`` (a ``GatherDep`` command)."""
        with self._lock:
            comm = self._open_comm(worker)
        if comm is not None:
            self._request(comm, worker, keys)
        elif not registry.connect_soon(
                worker, lambda c, e: self._connected(worker, keys, c, e),
                timeout=self._connect_timeout, security=self.worker.security):
            self.fetcher.submit(self._connect_then_request, worker, keys)

    def _connected(self, worker: str, keys: list, comm: Comm | None,
                   error: BaseException | None) -> None:
        """On the transport's thread: the comm :meth:`gather` asked for is open (or not)."""
        if comm is not None:
            try:
                comm = self._keep(worker, comm)
            except CommClosedError as e:
                error = e
            else:
                self._request(comm, worker, keys)
                return
        if not self._closed:
            self.worker.loop.put(_failed(worker, keys, str(error)))

    def _connect_then_request(self, worker: str, keys: list) -> None:
        if self._closed:
            return
        try:
            comm = self._connect(worker)
        except (CommClosedError, OSError, TimeoutError) as e:
            self.worker.loop.put(_failed(worker, keys, str(e)))
            return
        self._request(comm, worker, keys)

    def _request(self, comm: Comm, worker: str, keys: list) -> None:
        """Send ``get-data``; the answer comes to :meth:`handle`. A fetch thread may call this:
        one dict store or pop at a time, atomic in CPython, as the loop's."""
        rid = f"{self.worker.address}/{next(self._ids)}"
        self._fetches[rid] = (worker, keys, comm, time.monotonic())
        try:
            comm.send([encode(GetData(keys, rid))])
        except (CommClosedError, OSError) as e:
            if self._fetches.pop(rid, None) is not None:
                self.worker.loop.put(_failed(worker, keys, str(e)))

    def expire(self, mono: float, now: float) -> list:
        """Fetches without an answer for four connect timeouts fail: ``GatherDepFailure``s."""
        limit = self._connect_timeout * 4
        return [_failed(worker, keys, f"no answer within {limit:.0f}s", now)
                for rid, (worker, keys, _, started) in list(self._fetches.items())
                if mono - started > limit and self._fetches.pop(rid, None) is not None]

    def take_bandwidth(self) -> float | None:
        """Bytes per second fetched since the last call, if that measures bandwidth."""
        if self._seconds <= 0 or self._bytes < SMALL_TRANSFER:
            return None
        bandwidth = self._bytes / self._seconds
        self._bytes, self._seconds = 0, 0.0
        return bandwidth

    # ---------------------------------------------------------------- messages
    def handle(self, item: FromPeer | PeerGone) -> list:
        """Messages from a peer comm, or its end; returns state-machine events."""
        comm = item.comm
        if isinstance(item, PeerGone):
            with self._lock:
                for a, c in list(self._peers.items()):
                    if c is comm:
                        del self._peers[a]
            now = time.time()
            return [_failed(worker, keys, "connection lost", now)
                    for rid, (worker, keys, c, _) in list(self._fetches.items())
                    if c is comm and self._fetches.pop(rid, None) is not None]
        payload = item.msgs
        out: list = []
        for msg in payload if type(payload) is list else [payload]:
            try:
                record = decode(WORKER_TO_WORKER, msg)
            except MalformedMessage as e:
                # a peer that speaks nonsense is dropped; its fetches fail when the comm's
                # end arrives (PeerGone), and are asked of another holder
                logger.warning("dropping peer %s: %s", comm.peer_address, e)
                comm.close()
                break
            if type(record) is DataReply:
                entry = self._fetches.pop(record.request_id, None)
                if entry is not None:
                    out.append(self._received(entry, record))
            else:  # GetData, the only other op between workers
                self.serve(comm, record)
        return out

    def _received(self, entry: tuple, reply: DataReply) -> ev.GatherDepSuccess:
        worker, _, _, started = entry
        data = reply.data
        nbytes = sum(sizeof(v) for v in data.values())
        self._bytes += nbytes
        self._seconds += time.monotonic() - started
        self.worker.telemetry.transfer(worker, started, nbytes)
        return ev.GatherDepSuccess(worker, data, reply.missing or [], dict(reply.errors),
                                   time.time(), stimulus("gather-dep-success"))

    # ---------------------------------------------------------------- serving
    def serve(self, comm: Comm | None, request: GetData) -> None:
        """Answer ``get-data``: to ``comm``, or, with ``None`` (the scheduler asked: a
        gather relayed for a client), in the loop's next batch to the scheduler."""
        w = self.worker
        assert w.state is not None
        data = w.state.data
        out: dict = {}
        missing: list = []
        peek_many = getattr(data, "peek_many", None)
        if peek_many is not None:  # a spill buffer: values read back from disk are not kept
            peek_many(request.keys, out, missing)
        else:
            for key in request.keys:
                try:
                    out[key] = data[key]
                except KeyError:
                    missing.append(key)
        errors: dict = {}
        if request.serialized:  # for a relay (the scheduler): one opaque blob for all
            try:
                blob = serialize(out)
            except SerializationError:
                errors = serialization_errors(out, w.address)
                blob = serialize({k: v for k, v in out.items() if k not in errors})
                for key in request.optional:  # fetched ahead: left out, not reported
                    errors.pop(key, None)
            reply = DataReply(request.request_id, missing, blob=blob, errors=errors)
        else:
            reply = DataReply(request.request_id, missing, data=out, errors=errors)
        if comm is None:
            w.send_to_scheduler(reply)
        else:
            try:
                comm.send([encode(reply)])
            except SerializationError:  # a value the transport must pickle refuses to be
                errors = serialization_errors(out, w.address)
                reply = records.replace(reply, errors=errors,
                                        data={k: v for k, v in out.items() if k not in errors})
                try:
                    comm.send([encode(reply)])
                except (CommClosedError, OSError, SerializationError):
                    pass
            except (CommClosedError, OSError):
                pass
        for key, (packed, tb_text, text) in errors.items():
            logger.warning("the result of %r cannot leave worker %s: %s", key, w.address, text)
            w.loop.put(ev.ServeFailed(key, packed, tb_text, text, now=time.time(),
                                      stimulus_id=stimulus("serve-failed")))


def _failed(worker: str, keys: list, error: str, now: float | None = None
            ) -> ev.GatherDepFailure:
    """The fetch of ``keys`` from ``worker`` failed with ``error``: the event saying so."""
    return ev.GatherDepFailure(worker, keys, error, now=time.time() if now is None else now,
                               stimulus_id=stimulus("gather-dep-failure"))
