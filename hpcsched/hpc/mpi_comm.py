"""The two ends an :class:`~hpcsched.hpc.mpi.Endpoint` hands out: :class:`MPIComm`, one
channel between this rank and a peer, and :class:`MPIListener`.

The endpoint's progress thread calls :meth:`MPIComm.deliver` with each complete
message and :meth:`MPIComm.on_peer_closed` when the peer says bye; a comm sends
with :meth:`Endpoint.send_frames` (which never blocks: MPI ``Isend``). See the
module docstring of :mod:`hpcsched.hpc.mpi` for the wire format and threads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hpcsched.core.comm.base import Comm, CommClosedError, Inbox, Listener
from hpcsched.core.protocol import serialize

logger = logging.getLogger("hpcsched.hpc.mpi")

KIND_HELLO, KIND_MSG, KIND_BYE = 1, 2, 3  # what a control message carries on a channel
KIND_BEAT = 4  # on no channel: the sending rank is alive (or, flagged, leaving)
CLOSE_ITEM = object()  # queued for recv once the channel is closed


class Endpoint(Protocol):
    """What a comm and a listener need of the :class:`hpcsched.hpc.mpi.Endpoint` that
    made them: the endpoint knows its ends, the ends know only this."""

    rank: int

    def send_frames(self, dest: int, kind: int, key: tuple[int, int, int, bool],
                    frames: Sequence[serialize.Frame]) -> None: ...

    def forget(self, comm: MPIComm) -> None: ...

    def unlisten(self, lst: MPIListener) -> None: ...


class MPIComm(Comm):
    """One channel between this rank and ``peer``; see the module docstring."""

    def __init__(self, endpoint: Endpoint, peer: int, key: tuple[int, int, int, bool]):
        self._ep = endpoint
        self.peer = peer
        self.key = key  # (peer, initiator rank, channel number, this side initiated?)
        self.local_address = f"mpi://{endpoint.rank}"
        self.peer_address = f"mpi://{peer}"
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._peer_closed = False
        self._reason = "peer closed"
        self._target: tuple[Any, Any, Any] | None = None  # deliver_to: (inbox, source, marker)
        self._target_lock = threading.Lock()

    @property
    def channel(self) -> tuple[int, int]:
        """(initiator rank, number): the same on both ends of the channel."""
        return self.key[1], self.key[2]

    def send(self, msg: Any) -> None:
        if self._closed:
            raise CommClosedError(f"{self!r} is closed")
        if self._peer_closed:
            raise CommClosedError(f"{self!r}: {self._reason}")
        self._ep.send_frames(self.peer, KIND_MSG, self.key, serialize.dumps(msg))

    def recv(self, timeout: float | None = None) -> Any:
        if self._closed:
            raise CommClosedError(f"{self!r} is closed")
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no message on {self!r} within {timeout}s") from None
        if item is CLOSE_ITEM:
            self._closed = True
            self._queue.put(CLOSE_ITEM)  # later recv calls fail too
            raise CommClosedError(f"{self!r}: {self._reason}")
        return serialize.loads(item)

    def deliver_to(self, inbox: Inbox, source: Any, closed_marker: Any) -> None:
        """The progress thread unpickles each message and offers it to ``inbox`` itself
        (MPI sends never block it, so an idle loop may run its iteration there): one
        thread hand-off per message at most, instead of two."""
        with self._target_lock:
            while True:  # what arrived before goes first, in order
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                self._push(inbox, source, closed_marker, item)
                if item is CLOSE_ITEM:
                    return  # closed: nothing more to deliver (see on_peer_closed)
            if not self._closed:
                self._target = (inbox, source, closed_marker)

    def _push(self, inbox: Inbox, source: Any, marker: Any, item: Any) -> None:
        if item is CLOSE_ITEM:
            inbox.put((source, marker))
            return
        try:
            msg = serialize.loads(item)
        except serialize.SerializationError as e:
            logger.warning("closing %r: undecodable message: %s", self, e)
            inbox.put((source, marker))
            return
        inbox.offer((source, msg))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._peer_closed:
            try:
                self._ep.send_frames(self.peer, KIND_BYE, self.key, ())
            except CommClosedError:
                pass  # the endpoint is shut down: the peer learns nothing more from us anyway
        self._ep.forget(self)
        self._queue.put(CLOSE_ITEM)
        with self._target_lock:
            # nothing is delivered any more: let go of the inbox and the source, which name
            # this comm as a rule (a worker's inbox for a peer does); kept, the cycle would
            # hold every closed comm until the collector's next full pass
            self._target = None

    @property
    def closed(self) -> bool:
        # the peer's bye closes it too (sends already fail): a server holding the comm,
        # told by the closed marker, must not see it as open and pick it again
        return self._closed or self._peer_closed

    # called by the progress thread
    def deliver(self, frames: list[Any]) -> None:
        if self._closed:
            return
        target = self._target
        if target is None:
            with self._target_lock:
                target = self._target
                if target is None:
                    self._queue.put(frames)
                    return
        self._push(*target, frames)

    def on_peer_closed(self, reason: str = "peer closed") -> None:
        if not self._peer_closed:
            self._reason = reason
            self._peer_closed = True
            with self._target_lock:
                target, self._target = self._target, None  # the marker is the last item
                if target is None:
                    self._queue.put(CLOSE_ITEM)
            if target is not None:
                target[0].put((target[1], target[2]))


class MPIListener(Listener):
    def __init__(self, endpoint: Endpoint, on_connect: Callable[[Comm], None]):
        self._ep = endpoint
        self.on_connect = on_connect
        self.address = f"mpi://{endpoint.rank}"

    def stop(self) -> None:
        self._ep.unlisten(self)
