"""``inproc://name``: comms between threads of one process, passing objects as they are.

Used for the client and scheduler living in one process (notebooks, rank 0
under MPI, ``LocalCluster(processes=False)``) and in tests. No serialization:
what the sender puts in, the receiver gets out (like dask's inproc).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from hpcsched.core.comm.base import (
    Backend,
    Comm,
    CommClosedError,
    Inbox,
    Listener,
    Security,
    parse_address,
)

_CLOSE = object()
_listeners: dict[str, InprocListener] = {}
_lock = threading.Lock()
_listener_added = threading.Condition(_lock)  # wakes connect() waiting for a listener
_ids = itertools.count()


def new_address(name: str = "") -> str:
    return f"inproc://{os.getpid()}/{name or 'srv'}-{next(_ids)}"


class _Pipe:
    """One direction of an inproc comm: a queue, or, once the receiver asked for it
    (``deliver_to``), straight into the receiver's inbox."""

    __slots__ = ("queue", "target", "lock", "closed")

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.target: tuple[Any, Any, Any] | None = None  # (inbox, source, closed marker)
        self.lock = threading.Lock()
        self.closed = False  # either end closed: set before the receiver can learn of it

    def put(self, msg: Any) -> None:
        if msg is _CLOSE:
            self.closed = True
        target = self.target
        if target is None:
            with self.lock:
                target = self.target
                if target is None:
                    self.queue.put(msg)
                    return
        inbox, source, marker = target
        if msg is _CLOSE:
            # nothing is delivered after the marker: let go of the source, which names the
            # receiving comm as a rule (a reference cycle otherwise, through this pipe)
            self.target = None
        if inbox.any_thread:
            inbox.offer((source, marker if msg is _CLOSE else msg))
        else:
            inbox.put((source, marker if msg is _CLOSE else msg))

    def get(self, timeout: float | None = None) -> Any:
        return self.queue.get(timeout=timeout)

    def redirect(self, inbox: Any, source: Any, marker: Any) -> None:
        with self.lock:
            while True:  # what arrived before goes first, in order
                try:
                    msg = self.queue.get_nowait()
                except queue.Empty:
                    break
                item = (source, marker if msg is _CLOSE else msg)
                inbox.offer(item) if inbox.any_thread else inbox.put(item)
                if msg is _CLOSE:
                    return  # closed: nothing more to deliver (see put)
            self.target = (inbox, source, marker)


class InprocComm(Comm):
    def __init__(self, inbox: _Pipe, outbox: _Pipe, local: str, peer: str):
        self._in = inbox
        self._out = outbox
        self.local_address = local
        self.peer_address = peer
        self._closed = False
        self._peer: InprocComm | None = None

    def send(self, msg: Any) -> None:
        if self._closed:
            raise CommClosedError(f"{self!r} is closed")
        if self._out.closed:  # as over a socket: what the closed peer would never read
            raise CommClosedError(f"{self!r}: peer closed")
        self._out.put(msg)

    def recv(self, timeout: float | None = None) -> Any:
        if self._closed:
            raise CommClosedError(f"{self!r} is closed")
        try:
            msg = self._in.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no message on {self!r} within {timeout}s") from None
        if msg is _CLOSE:
            self._closed = True
            self._in.put(_CLOSE)  # later recv calls fail too
            raise CommClosedError(f"{self!r}: peer closed")
        return msg

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._out.put(_CLOSE)
        self._in.put(_CLOSE)

    @property
    def closed(self) -> bool:
        # closed by either end (Comm.closed); recv still hands over what came before
        return self._closed or self._in.closed

    def deliver_to(self, inbox: Inbox, source: Any, closed_marker: Any) -> None:
        """Later messages go straight into ``inbox`` with ``put``: the sender's thread
        (a server's loop, a task) must not run the receiver's code -- unless the inbox
        says it may (``Inbox.any_thread``: a client's handling of its scheduler's
        messages), then with ``offer``."""
        self._in.redirect(inbox, source, closed_marker)


def pipe(a_address: str = "inproc://a", b_address: str = "inproc://b") -> tuple[InprocComm, InprocComm]:
    """Two connected comms (for tests and same-process wiring)."""
    q1, q2 = _Pipe(), _Pipe()
    a = InprocComm(q1, q2, a_address, b_address)
    b = InprocComm(q2, q1, b_address, a_address)
    return a, b


class InprocListener(Listener):
    def __init__(self, address: str, on_connect: Callable[[Comm], None]):
        self.address = address
        self.on_connect = on_connect
        self._n = itertools.count()

    def accept(self) -> InprocComm:
        client_addr = f"{self.address}/client-{next(self._n)}"
        client, server = pipe(client_addr, self.address)
        threading.Thread(target=self.on_connect, args=(server,), daemon=True,
                         name=f"inproc-accept {self.address}").start()
        return client

    def stop(self) -> None:
        with _lock:
            if _listeners.get(self.address) is self:
                del _listeners[self.address]


def _listen(address: str, on_connect: Callable[[Comm], None], security: Security | None) -> Listener:
    _, loc = parse_address(address)
    if not loc:
        address = new_address()
    with _lock:
        if address in _listeners:
            raise OSError(f"inproc address {address} is already in use")
        lst = _listeners[address] = InprocListener(address, on_connect)
        _listener_added.notify_all()
    return lst


def _connect(address: str, timeout: float | None, security: Security | None) -> Comm:
    """Connect to the listener at ``address``, waiting up to ``timeout`` for it to appear."""
    with _lock:
        # like tcp://, wait for a server that is not up yet instead of failing at once
        found = _listener_added.wait_for(lambda: address in _listeners, timeout=timeout)
        lst = _listeners.get(address)
    if not found or lst is None:
        raise ConnectionRefusedError(f"no inproc listener at {address} (waited {timeout}s)")
    return lst.accept()


BACKEND = Backend(connect=_connect, listen=_listen, same_process=True)
