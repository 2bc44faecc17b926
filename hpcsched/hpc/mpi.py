"""``mpi://<rank>``: the MPI point-to-point transport.

One :class:`Endpoint` per process owns a private communicator (a nonblocking
``Idup`` of ``COMM_WORLD``, so the user's own MPI traffic can never match ours)
and ONE progress thread. Everything else is plain Python:

* **Channels.** ``connect("mpi://3")`` opens a new channel to rank 3 and sends
  it a small *hello*; rank 3's endpoint then hands a fresh :class:`MPIComm` to
  the ``on_connect`` of its listener (``listen("mpi://")``), like an accepted
  TCP connection. Several channels may link the same pair of ranks (a worker's
  stream to the scheduler, a peer's data fetch, ...); each is ordered on its
  own. A hello that arrives before anyone listens waits for the listener.
  ``close()`` sends a *bye*: the peer's ``recv`` raises CommClosedError once it
  has read everything sent before. No authentication: the MPI job is the
  trust boundary.
* **Receiving never spins.** MPICH's blocking calls busy-wait, so the
  progress thread polls ``Improbe(ANY_SOURCE, TAG_CONTROL)`` and sleeps with
  a :class:`~hpcsched.hpc.backoff.Backoff` between polls (idle rank: ~0% CPU).
  Ranks on the same node also ring each other's
  :class:`~hpcsched.hpc.doorbell.Doorbell` after each send, so the progress
  thread sleeps until something arrives instead of polling every few
  microseconds for a reply; when every rank is on this node it then polls
  only as a fallback while idle, less often as idleness lasts (how long it
  naps between polls: :mod:`hpcsched.hpc.pace`).
  It puts each complete message on its channel's ``queue.SimpleQueue``;
  ``MPIComm.recv(timeout)`` waits on that queue, and unpickles there.
* **Wire format.** ``frames = serialize.dumps(msg)``. One control message
  (tag :data:`TAG_CONTROL`) carries a header (kind, channel, frame lengths) and
  every frame smaller than ``mpi.data-threshold`` (64 KiB). Each larger frame
  follows as its own message (tag :data:`TAG_DATA`), sent from the frame's
  memory with no copy. The receiver reads the header, then, once ``Improbe``
  shows the data message has arrived, receives it straight into fresh memory
  (``numpy.empty(n, uint8)``, or an anonymous ``mmap`` while numpy is not
  loaded) on top of which the array unpickles (zero-copy).
  MPI's non-overtaking rule (per source, tag and communicator) plus a
  per-destination send lock keep every message's data after its own header.
* **Sending never blocks.** ``send`` posts ``Isend`` requests and returns;
  the progress thread tests them and drops the references to the frames once
  MPI is done with them.

MPI must run with ``MPI_THREAD_MULTIPLE`` (several threads send while the
progress thread receives); MPICH provides it and :func:`init_endpoint` checks.
Creating the endpoint is collective over ``COMM_WORLD``: every rank calls
:func:`init_endpoint` (or uses the transport, which calls it); ``shutdown`` is
local (no barrier: a blocking collective would spin).

**Lost ranks.** A rank whose node crashes or drops off the network may leave
the launcher unaware for minutes (its ssh connection or slurmstepd silent, not
closed) and every other rank waiting for it. Once the cluster is up,
:meth:`Endpoint.watch` makes each rank send a *beat* (a control message on no
channel) to the ranks it watches -- rank 0 watches the workers, each worker
rank 0 -- every quarter of ``mpi.rank-timeout``, from the progress thread;
any message counts as a sign of life. A watched rank not heard from for
``mpi.rank-timeout`` seconds is reported to the watcher's ``on_lost``, which
ends the job naming it (:mod:`hpcsched.hpc.bootstrap`). Beats neither ring a
doorbell nor count as traffic for the back-off, so watching costs an idle
rank a message every few seconds. A silence this rank did not watch (its own
progress thread stalled, the process stopped) proves nothing and restarts
the count; a rank that shuts down sends a last beat saying it leaves, and is
watched no more.

**Leaving no message behind.** A rank that has stopped its progress thread may
still be sent something by a rank that has not (a last heartbeat, a *bye*):
MPI keeps it as an unexpected message, and the transport under MPI (UCX) warns
at ``MPI_Finalize`` that it was never matched. So each endpoint counts the MPI
messages it sends to and receives from every rank; when a whole job ends
(:mod:`hpcsched.hpc.bootstrap`), every rank shuts its endpoint down without
freeing the communicator, and :meth:`Endpoint.drain` -- collective -- exchanges
the counts (a nonblocking ``Ialltoall`` polled with back-off), receives and
drops what was sent to this rank and not received yet, waits for this rank's
own sends, and only then frees the communicator.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import itertools
import logging
import mmap
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hpcsched.core import config
from hpcsched.core.comm.base import (
    Backend,
    Comm,
    CommClosedError,
    Listener,
    Security,
    parse_address,
)
from hpcsched.core.protocol import serialize
from hpcsched.core.settings import CommSettings, MPISettings
from hpcsched.hpc.backoff import Backoff
from hpcsched.hpc.doorbell import Doorbell
from hpcsched.hpc.mpi_comm import (
    KIND_BEAT,
    KIND_BYE,
    KIND_HELLO,
    KIND_MSG,
    MPIComm,
    MPIListener,
)
from hpcsched.hpc.mpi_init import mpi_module
from hpcsched.hpc.pace import Pace

logger = logging.getLogger(__name__)

TAG_CONTROL = 7301
TAG_DATA = 7302

WIRE_VERSION = 1
# version, kind, sent by the channel's initiator?, initiator rank, channel number, frame count
_HEAD = struct.Struct("<BBBiQI")
_FRAME = struct.Struct("<QB")  # frame length, 1 if the frame is inside the control message
_SEND_BUSY_WINDOW = 2.0  # seconds; see Endpoint._test_sends
_MAX_CONTROL_PER_POLL = 256  # let data and send completion interleave with a flood of small messages


def _as_bytes_view(frame: serialize.Frame) -> memoryview:
    mv = memoryview(frame)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _fresh_buffer(nbytes: int) -> Any:
    """Writable memory for a received frame, not touched before MPI writes it.

    ``numpy.empty`` if numpy is loaded already; else an anonymous ``mmap`` (also
    untouched zero pages): importing numpy here would stall this thread the first
    time a large pickle (say, a gather of thousands of small results) arrives.
    """
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        return numpy.empty(nbytes, dtype=numpy.uint8)
    return mmap.mmap(-1, nbytes) if nbytes else bytearray()


class _Incoming:
    """A control message whose large frames may still be on their way."""

    __slots__ = ("kind", "key", "frames", "missing")

    def __init__(self, kind: int, key: tuple[int, int, int, bool], frames: list[Any],
                 missing: deque[tuple[int, int]]):
        self.kind = kind
        self.key = key
        self.frames = frames
        self.missing = missing  # (frame index, nbytes) of frames that follow as data messages


class Endpoint:
    """This process's MPI endpoint: the private communicator and the progress thread."""

    def __init__(self, comm: Any, bell: Doorbell | None = None):
        self.comm = comm
        self.bell = bell
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.data_threshold = int(config.read(MPISettings).data_threshold)
        self._MPI = mpi_module()
        self._lock = threading.Lock()  # channels, listener, unaccepted
        self._channels: dict[tuple[int, int, int, bool], MPIComm] = {}
        self._numbers = itertools.count()
        self._listener: MPIListener | None = None
        self._unaccepted: deque[MPIComm] = deque()
        self._send_locks: dict[int, threading.Lock] = {}
        self._sends_lock = threading.Lock()
        self._send_reqs: list[Any] = []
        self._send_keep: list[Any] = []  # frames referenced until their Isend completes
        self._send_activity = 0.0  # monotonic time a send was last posted or completed
        # MPI messages (control and data) sent to / received from each rank: drain() compares
        self._sent = [0] * self.size
        self._received = [0] * self.size
        # the watch (watch()): ranks beaten to, ranks watched and when each was last heard
        self._beat_to: frozenset[int] = frozenset()
        self._watched: frozenset[int] = frozenset()
        self._heard = [0.0] * self.size
        self._watch_timeout = 0.0
        self._next_beat = 0.0
        self._last_turn = time.monotonic()
        self._on_lost: Callable[[list[int], float], None] | None = None
        # progress-thread state: per source, messages in arrival order
        self._incoming: dict[int, deque[_Incoming]] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by senders: a reply is likely soon, poll now
        self._poked = False
        self._rung = False  # the last nap ended with a ring
        self._pace = Pace(self._nap, self._until_beat,
                          rung_by_all=bell is not None and bell.all_local)
        self._shut = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"hpcsched-mpi-progress-{self.rank}")
        self._thread.start()

    def __repr__(self) -> str:
        return f"<Endpoint rank {self.rank}/{self.size}, {len(self._channels)} channels>"

    @property
    def address(self) -> str:
        return f"mpi://{self.rank}"

    # ------------------------------------------------------------ public
    def connect(self, rank: int) -> MPIComm:
        """Open a new channel to ``rank`` (its listener's on_connect gets the other end)."""
        if not 0 <= rank < self.size:
            raise ValueError(f"cannot connect to mpi://{rank}: the MPI job has ranks 0..{self.size - 1}")
        key = (rank, self.rank, next(self._numbers), True)
        comm = MPIComm(self, rank, key)
        with self._lock:
            if self._shut:
                raise CommClosedError(f"the MPI endpoint of rank {self.rank} is shut down")
            self._channels[key] = comm
        self.send_frames(rank, KIND_HELLO, key, ())
        return comm

    def listen(self, on_connect: Callable[[Comm], None]) -> MPIListener:
        """Hand every channel a peer opens to us (also ones opened earlier) to ``on_connect``."""
        with self._lock:
            if self._shut:
                raise CommClosedError(f"the MPI endpoint of rank {self.rank} is shut down")
            if self._listener is not None:
                raise OSError(f"{self.address} is already being listened on")
            self._listener = lst = MPIListener(self, on_connect)
            waiting = list(self._unaccepted)
            self._unaccepted.clear()
        for comm in waiting:
            self._accept(lst, comm)
        return lst

    def watch(self, ranks: Iterable[int], timeout: float,
              on_lost: Callable[[list[int], float], None] | None) -> None:
        """Beat to ``ranks`` every ``timeout / 4`` seconds and call ``on_lost(silent,
        seconds)`` once, from the progress thread, when one of them has not been heard from
        for ``timeout`` seconds: ``silent`` are it and those that missed three beats too,
        ``seconds`` the longest silence (module docstring, *Lost ranks*). With ``on_lost``
        None, only beat (they watch us; we cannot watch them yet)."""
        if timeout <= 0:
            raise ValueError(f"watch() needs a timeout > 0, got {timeout}")
        ranks = frozenset(ranks) - {self.rank}
        now = time.monotonic()
        for r in ranks:
            self._heard[r] = now
        self._watch_timeout = timeout
        self._next_beat = now
        self._on_lost = on_lost
        self._watched = self._beat_to = ranks

    def unwatch(self) -> None:
        """Report no lost rank any more (this rank is closing the job); beats go on, so that
        the others do not take this rank for lost."""
        self._on_lost = None
        self._watched = frozenset()

    def shutdown(self, timeout: float = 5.0, free: bool = True) -> None:
        """Close every channel, let pending sends finish (up to ``timeout``), stop the thread.

        Local: no collective, so ranks may shut down at different times. ``free=False``
        keeps the communicator for :meth:`drain`, which frees it.
        """
        with self._lock:
            if self._shut:
                return
            comms = list(self._channels.values())
        for comm in comms:
            comm.close()
        self.unwatch()
        beat_to, self._beat_to = self._beat_to, frozenset()
        for rank in beat_to:  # they watch us: say we leave
            self._beat(rank, leaving=True)
        with self._lock:
            self._shut = True
            self._listener = None
        deadline = time.monotonic() + timeout
        wait = Backoff(min=1e-4, fast_max=1e-2, max=1e-2)
        while self.pending_sends() and self._thread.is_alive() and time.monotonic() < deadline:
            wait.sleep()
        self._stop.set()
        self._poke()
        self._thread.join(max(0.1, deadline - time.monotonic()))
        if self.bell is not None and not self._thread.is_alive():
            self.bell.close()
        left = self.pending_sends()
        if left and free:
            logger.warning("MPI endpoint of rank %d shut down with %d sends not completed "
                           "(receiver gone or not progressing)", self.rank, left)
        elif free and not self._thread.is_alive():
            try:
                self.comm.Free()
            except Exception:  # best effort: the job is ending anyway
                logger.debug("freeing the endpoint communicator failed", exc_info=True)
        for comm in list(self._unaccepted):
            comm.on_peer_closed("MPI endpoint shut down")
        self._unaccepted.clear()

    def drain(self, timeout: float = 5.0) -> int:
        """After :meth:`shutdown` with ``free=False`` on every rank: receive and drop what
        was sent to this rank that it has not received, wait for its own sends, free the
        communicator. Collective over the endpoint's communicator (module docstring).

        Returns the number of messages dropped; gives up after ``timeout`` seconds (logged:
        the job is ending anyway, MPI may then say what was left).
        """
        if self._thread.is_alive() or not self._stop.is_set():
            raise RuntimeError("drain() needs the endpoint shut down first")
        MPI = self._MPI
        with contextlib.ExitStack() as held:  # no send is being posted while we count
            for lock in list(self._send_locks.values()):
                held.enter_context(lock)
            sent = array.array("q", self._sent)
        expected = array.array("q", bytes(8 * self.size))
        deadline = time.monotonic() + timeout
        wait = Backoff(min=1e-4, fast_max=5e-3, max=2e-2)
        request = self.comm.Ialltoall([sent, MPI.INT64_T], [expected, MPI.INT64_T])
        while not request.Test():
            if time.monotonic() > deadline:
                logger.debug("rank %d: the other ranks did not drain within %gs", self.rank,
                             timeout)
                return 0
            wait.sleep()
        status = MPI.Status()
        dropped = 0
        what: list[int] = []
        missing = {r: n - self._received[r] for r, n in enumerate(expected)
                   if n > self._received[r]}
        while missing or self.pending_sends():
            progressed = False
            for source in list(missing):
                message = self.comm.Improbe(source, MPI.ANY_TAG, status)
                if message is None:
                    continue
                buf = _fresh_buffer(status.Get_count(MPI.BYTE))
                message.Recv([buf, MPI.BYTE])
                if status.Get_tag() == TAG_CONTROL:
                    what.append(self._parse(source, bytearray(buf)).kind)
                dropped += 1
                progressed = True
                missing[source] -= 1
                if not missing[source]:
                    del missing[source]
            progressed |= self._test_sends()
            if time.monotonic() > deadline:
                logger.debug("rank %d: %d messages not received, %d sends not completed "
                             "after %gs of draining", self.rank, sum(missing.values()),
                             self.pending_sends(), timeout)
                return dropped
            if progressed:
                wait.reset()
            else:
                wait.sleep()
        try:
            self.comm.Free()
        except Exception:  # best effort: the job is ending anyway
            logger.debug("freeing the endpoint communicator failed", exc_info=True)
        if dropped:
            logger.debug("rank %d dropped %d messages sent after its endpoint stopped "
                         "(control messages of kinds %s)", self.rank, dropped, what)
        return dropped

    def pending_sends(self) -> int:
        with self._sends_lock:
            return len(self._send_reqs)

    # ------------------------------------------------------------ sending
    def _send_lock(self, dest: int) -> threading.Lock:
        lock = self._send_locks.get(dest)
        if lock is None:
            with self._lock:
                lock = self._send_locks.setdefault(dest, threading.Lock())
        return lock

    def send_frames(self, dest: int, kind: int, key: tuple[int, int, int, bool],
              frames: Sequence[serialize.Frame]) -> None:
        if self.error is not None:
            raise CommClosedError(f"the MPI endpoint of rank {self.rank} failed: {self.error!r}")
        _, initiator, number, initiated = key
        views = [_as_bytes_view(f) for f in frames]
        descs = [_HEAD.pack(WIRE_VERSION, kind, initiated, initiator, number, len(views))]
        inline: list[memoryview] = []
        large: list[memoryview] = []
        for mv in views:
            small = mv.nbytes < self.data_threshold
            descs.append(_FRAME.pack(mv.nbytes, small))
            (inline if small else large).append(mv)
        control = b"".join([*descs, *inline])
        MPI = self._MPI
        with self._send_lock(dest):
            if self._stop.is_set():
                raise CommClosedError(f"the MPI endpoint of rank {self.rank} is shut down")
            reqs = [self.comm.Isend([control, MPI.BYTE], dest, TAG_CONTROL)]
            for mv in large:
                reqs.append(self.comm.Isend([mv, MPI.BYTE], dest, TAG_DATA))
            self._sent[dest] += len(reqs)
        with self._sends_lock:
            self._send_activity = time.monotonic()
            self._send_reqs.extend(reqs)
            self._send_keep.append(control)
            self._send_keep.extend(large)
        bell = self.bell
        if bell is not None and dest in bell.peers:
            bell.ring(dest)
            if not large and bell.listening:
                return  # its reply rings us: no need to poll eagerly for it
        # A request usually draws a reply soon: poll eagerly from now on. Without this, in a
        # ping-pong each side's back-off grows while it waits and the latency creeps up to
        # the fast cap on every hop. (Large frames move only while this rank's MPI
        # progresses: poll eagerly for them too.)
        self._poked = True
        self._poke()

    def _beat(self, dest: int, leaving: bool = False) -> None:
        """A beat to ``dest``: no doorbell, no eager polling, not counted as traffic."""
        control = _HEAD.pack(WIRE_VERSION, KIND_BEAT, 0, self.rank, int(leaving), 0)
        with self._send_lock(dest):
            if self._stop.is_set():
                return
            request = self.comm.Isend([control, self._MPI.BYTE], dest, TAG_CONTROL)
            self._sent[dest] += 1
        with self._sends_lock:
            self._send_reqs.append(request)
            self._send_keep.append(control)

    def _keep_watch(self) -> None:
        """The progress thread's turn at the watch: beat when due, report silent ranks."""
        now = time.monotonic()
        if now - self._last_turn > self._watch_timeout / 2:
            # this thread did not run for a while (the process stalled): a silence it did
            # not watch proves nothing
            for r in self._watched:
                self._heard[r] = max(self._heard[r], now)
        self._last_turn = now
        if now >= self._next_beat:
            self._next_beat = now + self._watch_timeout / 4
            for r in self._beat_to:
                self._beat(r)
        on_lost = self._on_lost
        if on_lost is not None:
            longest = max((now - self._heard[r] for r in self._watched), default=0.0)
            if longest > self._watch_timeout:
                # with it, those that went silent at about the same time (a node's ranks):
                # missing three beats, they will not be heard from either
                self._on_lost = None
                on_lost(sorted(r for r in self._watched
                               if now - self._heard[r] > 0.75 * self._watch_timeout), longest)

    def _test_sends(self) -> bool:
        """Test pending sends; True while some are pending and moved recently.

        A large send advances only when this rank's MPI progresses (a large
        worker-to-worker transfer slows to a fraction of its speed while the
        sender's poll interval backs off), so pending sends count as
        traffic -- for up to :data:`_SEND_BUSY_WINDOW` seconds without any
        completion, so that a send to a rank that never receives cannot keep
        this thread polling at full rate.
        """
        with self._sends_lock:
            if not self._send_reqs:
                return False
            done = self._MPI.Request.Testsome(self._send_reqs)
            now = time.monotonic()
            if done:
                gone = set(done)
                self._send_reqs = [r for i, r in enumerate(self._send_reqs) if i not in gone]
                self._send_keep = [b for i, b in enumerate(self._send_keep) if i not in gone]
                self._send_activity = now
            return bool(self._send_reqs) and now - self._send_activity < _SEND_BUSY_WINDOW

    # ------------------------------------------------------------ receiving
    def _run(self) -> None:
        pace = self._pace
        try:
            while not self._stop.is_set():
                if self._beat_to:
                    self._keep_watch()
                busy = self._poll_control()
                partial = False
                for source in [s for s, dq in self._incoming.items() if dq]:
                    busy |= self._advance(source)
                    partial = True
                sending = self._test_sends()
                busy |= sending
                if pace.turn(busy, partial or sending, self._poked, self._rung):
                    self._poked = False
        except BaseException as e:  # never die silently: fail every channel loudly
            logger.exception("MPI progress thread of rank %d failed", self.rank)
            self.error = e
            with self._lock:
                comms = list(self._channels.values()) + list(self._unaccepted)
            for comm in comms:
                comm.on_peer_closed(f"MPI endpoint failed: {e!r}")

    def quiet(self, delta: int) -> None:
        """One gang member more (``+1``) or fewer (``-1``) computing on this rank: while
        one does, the progress thread naps ``mpi.gang-poll`` between polls
        (:mod:`hpcsched.hpc.pace`; why: :mod:`hpcsched.hpc.gang`)."""
        self._pace.quiet(delta)

    def _until_beat(self, nap: float) -> float:
        """``nap`` seconds, or less when a beat is due sooner."""
        if self._beat_to:
            nap = min(nap, max(self._next_beat - time.monotonic(), 1e-3))
        return nap

    def _poke(self) -> None:
        """Wake the progress thread now (from another thread)."""
        self._wake.set()
        if self.bell is not None:
            self.bell.ring_self()  # (a no-op unless it listens)

    def _nap(self, seconds: float) -> None:
        self._rung = False
        if self.bell is None or not self.bell.listening:
            self._wake.wait(seconds)
        elif not self._wake.is_set():
            self._rung = self.bell.wait(seconds)
        self._wake.clear()

    def _poll_control(self) -> bool:
        MPI = self._MPI
        status = MPI.Status()
        got = False
        for _ in range(_MAX_CONTROL_PER_POLL):
            message = self.comm.Improbe(MPI.ANY_SOURCE, TAG_CONTROL, status)
            if message is None:
                # MPICH's Improbe matches first and makes progress after: a message that
                # progress pulled in shows only on the next call. Ask again at once
                # instead of a back-off nap later, which every ping-pong would pay.
                message = self.comm.Improbe(MPI.ANY_SOURCE, TAG_CONTROL, status)
            if message is None:
                break
            buf = bytearray(status.Get_count(MPI.BYTE))
            source = status.Get_source()
            message.Recv([buf, MPI.BYTE])
            self._received[source] += 1
            self._heard[source] = time.monotonic()
            item = self._parse(source, buf)
            self._incoming.setdefault(source, deque()).append(item)
            self._advance(source)
            got |= item.kind != KIND_BEAT  # a beat is no traffic: no eager polling after it
        return got

    def _parse(self, source: int, buf: bytearray) -> _Incoming:
        view = memoryview(buf)
        try:
            version, kind, from_initiator, initiator, number, nframes = _HEAD.unpack_from(view)
            if version != WIRE_VERSION or kind not in (KIND_HELLO, KIND_MSG, KIND_BYE,
                                                       KIND_BEAT):
                raise ValueError(f"version {version}, kind {kind}")
            pos = _HEAD.size
            sizes: list[tuple[int, bool]] = []
            for _ in range(nframes):
                n, inline = _FRAME.unpack_from(view, pos)
                sizes.append((n, bool(inline)))
                pos += _FRAME.size
            frames: list[Any] = []
            missing: deque[tuple[int, int]] = deque()
            for i, (n, inline) in enumerate(sizes):
                if inline:
                    if pos + n > len(view):
                        raise ValueError("frame runs past the end of the message")
                    frames.append(view[pos:pos + n])
                    pos += n
                else:
                    frames.append(None)
                    missing.append((i, n))
        except (struct.error, ValueError) as e:
            # both ends run this very code: garbage here means a bug or a stray sender
            raise RuntimeError(f"malformed hpcsched control message from MPI rank {source}: {e}") from e
        key = (source, initiator, number, not from_initiator)
        return _Incoming(kind, key, frames, missing)

    def _advance(self, source: int) -> bool:
        """Receive arrived data for ``source`` and deliver its complete messages, in order."""
        MPI = self._MPI
        pending = self._incoming[source]
        status = MPI.Status()
        progressed = False
        while pending:
            head = pending[0]
            while head.missing:
                index, nbytes = head.missing[0]
                message = self.comm.Improbe(source, TAG_DATA, status)
                if message is None:  # see _poll_control
                    message = self.comm.Improbe(source, TAG_DATA, status)
                if message is None:
                    return progressed
                if status.Get_count(MPI.BYTE) != nbytes:
                    raise RuntimeError(
                        f"MPI rank {source} sent a data frame of {status.Get_count(MPI.BYTE)} "
                        f"bytes where its header announced {nbytes}"
                    )
                buf = _fresh_buffer(nbytes)
                message.Recv([buf, MPI.BYTE])  # has arrived: completes at memory speed
                self._received[source] += 1
                head.frames[index] = buf
                head.missing.popleft()
                progressed = True
            pending.popleft()
            self._dispatch(source, head)
            progressed = True
        return progressed

    def _dispatch(self, source: int, item: _Incoming) -> None:
        if item.kind == KIND_BEAT:
            if item.key[2]:  # the rank leaves: no longer watched, nor beaten to
                self._watched = self._watched - {source}
                self._beat_to = self._beat_to - {source}
            return
        if item.kind == KIND_HELLO:
            comm = MPIComm(self, source, item.key)
            with self._lock:
                self._channels[item.key] = comm
                lst = self._listener
                if lst is None:
                    self._unaccepted.append(comm)
            if lst is not None:
                self._accept(lst, comm)
            return
        with self._lock:
            channel = self._channels.get(item.key)
        if channel is None:  # we closed this channel already; the peer had not heard yet
            logger.debug("rank %d drops a message for closed channel %s", self.rank, item.key)
            return
        if item.kind == KIND_MSG:
            channel.deliver(item.frames)
        else:  # KIND_BYE
            channel.on_peer_closed()
            self.forget(channel)

    def _accept(self, lst: MPIListener, comm: MPIComm) -> None:
        # in a thread of its own: on_connect may block on comm.recv, which needs this thread
        threading.Thread(target=lst.on_connect, args=(comm,), daemon=True,
                         name=f"mpi-accept {comm.peer_address}").start()

    def forget(self, comm: MPIComm) -> None:
        with self._lock:
            if self._channels.get(comm.key) is comm:
                del self._channels[comm.key]

    def unlisten(self, lst: MPIListener) -> None:
        with self._lock:
            if self._listener is lst:
                self._listener = None


# ---------------------------------------------------------------- the singleton
_endpoint: Endpoint | None = None
_endpoint_lock = threading.Lock()


def init_endpoint(comm: Any = None, timeout: float | None = None) -> Endpoint:
    """This process's endpoint, created on first call by a nonblocking dup of ``comm``.

    Collective over ``comm`` (default ``COMM_WORLD``) on first use: every rank
    must call it (or use ``mpi://``) within ``timeout`` (config
    ``comm.timeouts.connect``). Waiting polls with back-off instead of spinning.
    """
    global _endpoint
    with _endpoint_lock:
        if _endpoint is not None:
            return _endpoint
        MPI = mpi_module()
        base = MPI.COMM_WORLD if comm is None else comm
        timeout = float(config.read(CommSettings, connect_timeout=timeout).connect_timeout)
        dup, request = base.Idup()
        deadline = time.monotonic() + timeout
        wait = Backoff()
        while not request.Test():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"MPI rank {base.Get_rank()}: not every rank of the communicator created "
                    f"its hpcsched endpoint within {timeout}s (init_endpoint is collective)"
                )
            wait.sleep()
        # collective on every rank, whatever its mpi.doorbell: one that does not listen
        # still rings the peers that do
        bell = Doorbell.exchange(dup, wait.sleep,
                                 listen=bool(config.read(MPISettings).doorbell),
                                 timeout=timeout)
        _endpoint = Endpoint(dup, bell)
        # registered after mpi4py's own exit hook (made at import), and atexit runs the
        # last-registered first: the progress thread stops before MPI_Finalize
        atexit.unregister(shutdown_endpoint)
        atexit.register(shutdown_endpoint)
        return _endpoint


def get_endpoint(timeout: float | None = None) -> Endpoint:
    """The endpoint, created (collectively, see :func:`init_endpoint`) if need be."""
    return _endpoint if _endpoint is not None else init_endpoint(timeout=timeout)


def quiet(delta: int) -> None:
    """:meth:`Endpoint.quiet` on this process's endpoint, if it has one."""
    ep = _endpoint
    if ep is not None:
        ep.quiet(delta)


def shutdown_endpoint(timeout: float = 5.0, free: bool = True) -> Endpoint | None:
    """Shut the endpoint down (local, idempotent); a later use creates a new one.

    Returns the endpoint shut down (None if there was none): with ``free=False``, every
    rank then calls its :meth:`Endpoint.drain`."""
    global _endpoint
    with _endpoint_lock:
        ep, _endpoint = _endpoint, None
    if ep is not None:
        ep.shutdown(timeout, free=free)
    return ep


def _parse_rank(location: str, address: str) -> int:
    try:
        rank = int(location)
    except ValueError:
        raise ValueError(f"not an MPI address: {address!r} (expected mpi://<rank>, e.g. mpi://0)") from None
    if rank < 0:
        raise ValueError(f"not an MPI address: {address!r} (rank must be >= 0)")
    return rank


def _connect(address: str, timeout: float, security: Security | None) -> Comm:
    _, location = parse_address(address)
    rank = _parse_rank(location, address)
    return get_endpoint(timeout).connect(rank)


def _listen(address: str, on_connect: Callable[[Comm], None], security: Security | None) -> Listener:
    _, location = parse_address(address)
    ep = get_endpoint()
    if location not in ("", str(ep.rank)):
        raise ValueError(
            f"cannot listen on {address}: this process is MPI rank {ep.rank} "
            f"(listen on mpi:// or mpi://{ep.rank})"
        )
    return ep.listen(on_connect)


def _rank_of(address: str) -> int | None:
    location = parse_address(address)[1]
    return int(location) if location.isdigit() else None


# rank 0's node, where the scheduler and its dashboard run, is a compute node of the job:
# a dashboard there listens on every interface, and is reached through an ssh tunnel
BACKEND = Backend(connect=_connect, listen=_listen, service_host=lambda server_address: "0.0.0.0",
                  reached_by_tunnel=True, rank_of=_rank_of)
