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

Only opening a comm to a peer not yet connected may block (a TCP connect and
handshake), so that runs in a fetch thread, one of
``worker.transfer-incoming-count-limit``.

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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Comm, CommClosedError
from hpcsched.core.comm.loop import CLOSED
from hpcsched.core.protocol.messages import (
    WORKER_TO_WORKER,
    DataReply,
    GetData,
    MalformedMessage,
    decode,
    encode,
)
from hpcsched.core.protocol.serialize import SerializationError, serialize, sizeof
from hpcsched.core.state import events as ev
from hpcsched.core.worker.execution import serialization_errors

logger = logging.getLogger("hpcsched.worker")

PEER = "peer"  # first item of the inbox source of a peer comm: (PEER, comm)
SMALL_TRANSFER = 1_000_000  # bytes: below, a transfer measures latency rather than bandwidth


class PeerTransfers:
    """The peer side of a :class:`~hpcsched.core.worker.server.Worker`; every method but
    :meth:`on_connect` and :meth:`close` runs on the worker's loop."""

    def __init__(self, worker: Any):
        self.worker = worker
        self.fetcher = ThreadPoolExecutor(config.get("worker.transfer-incoming-count-limit"),
                                          thread_name_prefix="hpcsched-fetch")
        self._peers: dict[str, Comm] = {}  # peer worker address -> comm we opened to it
        self._lock = threading.Lock()
        # request id -> (peer worker, keys, comm, monotonic start): fetches under way
        self._fetches: dict[str, tuple[str, list, Comm, float]] = {}
        self._ids = itertools.count()
        self._bytes = 0  # fetched since the last bandwidth report ...
        self._seconds = 0.0  # ... and the time it took

    # ---------------------------------------------------------------- comms
    def on_connect(self, comm: Comm) -> None:
        """A comm a peer opened to us, or one we opened: its messages go to the loop."""
        comm.deliver_to(self.worker.loop, (PEER, comm), CLOSED)

    def _open_comm(self, address: str) -> Comm | None:
        comm = self._peers.get(address)
        return comm if comm is not None and not comm.closed else None

    def _connect(self, address: str) -> Comm:
        """In a fetch thread: the comm to ``address``, opened (and attached) if need be."""
        comm = registry.connect(address, timeout=config.get("comm.timeouts.connect"),
                                security=self.worker.security)
        with self._lock:
            existing = self._open_comm(address)
            if existing is not None:  # another fetch thread connected first
                comm.close()
                return existing
            self._peers[address] = comm
        self.on_connect(comm)
        return comm

    def close(self) -> None:
        self.fetcher.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            peers = list(self._peers.values())
            self._peers.clear()
        for c in peers:
            c.close()

    # ---------------------------------------------------------------- fetching
    def gather(self, worker: str, keys: list) -> None:
        """Start fetching ``keys`` from ``worker`` (a ``GatherDep`` command)."""
        comm = self._open_comm(worker)
        if comm is not None:
            self._request(comm, worker, keys)
        else:
            self.fetcher.submit(self._connect_then_request, worker, keys)

    def _connect_then_request(self, worker: str, keys: list) -> None:
        try:
            comm = self._connect(worker)
        except (CommClosedError, OSError, TimeoutError) as e:
            self.worker.loop.put((None, ev.GatherDepFailure(worker, keys, str(e), now=time.time())))
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
                self.worker.loop.put((None, ev.GatherDepFailure(worker, keys, str(e),
                                                                now=time.time())))

    def expire(self, mono: float, now: float) -> list:
        """Fetches without an answer for four connect timeouts fail: ``GatherDepFailure``s."""
        limit = config.get("comm.timeouts.connect") * 4
        return [ev.GatherDepFailure(worker, keys, f"no answer within {limit:.0f}s", now=now)
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
    def handle(self, comm: Comm, payload: Any) -> list:
        """Messages from a peer comm (or its ``CLOSED`` marker); returns state-machine events."""
        if payload is CLOSED:
            with self._lock:
                for a, c in list(self._peers.items()):
                    if c is comm:
                        del self._peers[a]
            now = time.time()
            return [ev.GatherDepFailure(worker, keys, "connection lost", now=now)
                    for rid, (worker, keys, c, _) in list(self._fetches.items())
                    if c is comm and self._fetches.pop(rid, None) is not None]
        out: list = []
        for msg in payload if type(payload) is list else [payload]:
            try:
                record = decode(WORKER_TO_WORKER, msg)
            except MalformedMessage as e:
                # a peer that speaks nonsense is dropped; its fetches fail when the comm's
                # CLOSED arrives, and are asked of another holder
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
                                   time.time())

    # ---------------------------------------------------------------- serving
    def serve(self, comm: Comm | None, request: GetData) -> None:
        """Answer ``get-data``: to ``comm``, or, with ``None`` (the scheduler asked: a
        gather relayed for a client), in the loop's next batch to the scheduler."""
        w = self.worker
        data = w.state.data
        get = data.peek if w.spill_buffer is not None else data.__getitem__
        out: dict = {}
        missing = []
        for key in request.keys:
            try:
                out[key] = get(key)
            except KeyError:
                missing.append(key)
        reply = DataReply(request.request_id, missing)
        errors: dict = {}
        if request.serialized:  # for a relay (the scheduler): one opaque blob for all
            try:
                reply.blob = serialize(out)
            except SerializationError:
                errors = serialization_errors(out, w.address)
                reply.blob = serialize({k: v for k, v in out.items() if k not in errors})
        else:
            reply.data = out
        reply.errors = errors
        if comm is None:
            w.send_to_scheduler(reply)
        else:
            try:
                comm.send([encode(reply)])
            except SerializationError:  # a value the transport must pickle refuses to be
                errors = serialization_errors(out, w.address)
                reply.data = {k: v for k, v in out.items() if k not in errors}
                reply.errors = errors
                try:
                    comm.send([encode(reply)])
                except (CommClosedError, OSError, SerializationError):
                    pass
            except (CommClosedError, OSError):
                pass
        for key, (packed, tb_text, text) in errors.items():
            logger.warning("the result of %r cannot leave worker %s: %s", key, w.address, text)
            w.loop.put((None, ev.ServeFailed(key, packed, tb_text, text, now=time.time())))
