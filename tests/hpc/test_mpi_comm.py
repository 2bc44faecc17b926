"""The mpi:// transport between real MPI ranks (run under mpiexec with pytest-mpi): what
only it does (zero-copy receives, several ranks at once, channels and their listener,
addresses, thread level, idle CPU, doorbells, draining, watching ranks).

What every transport promises (order, intact frames, close, timeouts, deliver_to) is
checked between two ranks by the conformance suite: tests/hpc/test_mpi_comm_conformance.py.

    mpiexec -n 4 python -m pytest --with-mpi -q tests/hpc/test_mpi_comm.py

Without ``--with-mpi`` these tests are skipped; tests/hpc/test_mpi_launch.py
runs them under mpiexec as part of the plain suite.

Every rank runs every test, in the same order. A test opens fresh channels:
the initiator connects and first sends the test's name; the other side takes
the next channel its listener accepted from that rank and checks the name, so
a failure in one test cannot leak messages into the next. No test uses a
blocking MPI collective (MPICH spins in them); every wait has a timeout, so a
failure on one rank makes its peers fail within seconds instead of hanging.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]

WAIT = 20.0  # seconds any rank waits for a peer


class Accepted:
    """Channels accepted by this rank's listener, one queue per peer rank."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[int, queue.SimpleQueue] = {}
        self.count = 0

    def _q(self, rank: int) -> queue.SimpleQueue:
        with self._lock:
            return self._queues.setdefault(rank, queue.SimpleQueue())

    def on_connect(self, comm) -> None:
        self.count += 1
        self._q(comm.peer).put(comm)

    def get(self, rank: int, name: str):
        """The channel ``rank`` opened for test ``name`` (stale ones are closed)."""
        deadline = time.monotonic() + WAIT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"rank {rank} did not open a channel for {name}")
            try:
                comm = self._q(rank).get(timeout=left)
            except queue.Empty:
                continue
            first = comm.recv(timeout=WAIT)
            if first == name:
                return comm
            comm.close()  # left over from a test that failed on the other rank


@pytest.fixture(scope="module")
def net():
    from hpcsched.core.comm import registry
    from hpcsched.hpc import mpi

    ep = mpi.init_endpoint(timeout=WAIT)
    accepted = Accepted()
    listener = registry.listen("mpi://", accepted.on_connect)
    try:
        yield ep, accepted, listener
    finally:
        listener.stop()
        mpi.shutdown_endpoint()


def open_channel(net, peer: int, name: str):
    from hpcsched.core.comm import registry

    comm = registry.connect(f"mpi://{peer}", timeout=WAIT)
    comm.send(name)
    return comm


def channel_pair(net, name: str, a: int = 0, b: int = 1):
    """On rank a: a channel to b; on rank b: its other end; elsewhere None."""
    ep, accepted, _ = net
    if ep.rank == a:
        return open_channel(net, b, name)
    if ep.rank == b:
        return accepted.get(a, name)
    return None


def base_chain(obj):
    """The objects behind an array's memory: arr.base, memoryview.obj, ..."""
    chain = []
    while obj is not None:
        chain.append(obj)
        obj = obj.base if isinstance(obj, np.ndarray) else getattr(obj, "obj", None)
    return chain


def test_64mib_array_is_received_without_copy(net, request):
    comm = channel_pair(net, request.node.name)
    if comm is None:
        return
    n = 8 * 2**20  # 64 MiB of float64
    if net[0].rank == 0:
        arr = np.arange(n, dtype=np.float64)
        comm.send({"x": arr, "meta": "big"})
        echo = comm.recv(timeout=WAIT)
        assert np.array_equal(echo, arr)
    else:
        msg = comm.recv(timeout=WAIT)
        arr = msg["x"]
        assert msg["meta"] == "big"
        assert arr.dtype == np.float64 and arr.shape == (n,)
        assert arr[0] == 0 and arr[-1] == n - 1 and arr[12345] == 12345
        # zero-copy: the array does not own its memory; it sits on the uint8 buffer the
        # frame was received into, which is writeable (tasks may modify inputs in place)
        assert not arr.flags.owndata
        assert arr.flags.writeable
        chain = base_chain(arr)
        buffers = [o for o in chain[1:] if isinstance(o, np.ndarray)]
        assert buffers, f"no receive buffer behind the array: {chain!r}"
        recv_buffer = buffers[-1]
        assert recv_buffer.dtype == np.uint8 and recv_buffer.nbytes == arr.nbytes
        assert recv_buffer.flags.owndata
        assert np.shares_memory(arr, recv_buffer)
        comm.send(arr)  # and back, from the other side
    comm.close()


def test_concurrent_senders(net, request):
    """Every rank > 0 sends from 3 threads over one channel; rank 0 checks every stream
    (the conformance suite's senders share one channel between two ranks: here the
    streams of several ranks arrive at once)."""
    ep, accepted, _ = net
    name = request.node.name
    per_thread, nthreads = 150, 3
    if ep.rank == 0:
        comms = [accepted.get(r, name) for r in range(1, ep.size)]
        results: dict[int, list] = {}

        def drain(comm):
            results[comm.peer] = [comm.recv(timeout=WAIT) for _ in range(per_thread * nthreads)]

        readers = [threading.Thread(target=drain, args=(c,)) for c in comms]
        for t in readers:
            t.start()
        for t in readers:
            t.join(WAIT * 2)
        assert sorted(results) == list(range(1, ep.size))
        for rank, msgs in results.items():
            for thread in range(nthreads):
                mine = [m for m in msgs if m[0] == thread]
                assert [m[1] for m in mine] == list(range(per_thread)), (rank, thread)
                for _, i, payload in mine:
                    # a message's large frame never gets mixed up with another's
                    assert payload.shape == (10_000,) and (payload == rank * 1000 + i).all()
        for c in comms:
            c.send("ok")
            c.close()
    else:
        comm = open_channel(net, 0, name)
        errors: list[BaseException] = []

        def send_many(thread: int) -> None:
            try:
                for i in range(per_thread):
                    comm.send((thread, i, np.full(10_000, ep.rank * 1000 + i, dtype=np.int64)))
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        senders = [threading.Thread(target=send_many, args=(k,)) for k in range(nthreads)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(WAIT)
        assert not errors
        assert comm.recv(timeout=WAIT) == "ok"
        comm.close()


def test_on_connect_is_called_with_the_peers_channel(net, request):
    """Also for a hello that arrived while nobody was listening."""
    from hpcsched.core.comm import registry

    ep, accepted, listener = net
    name = request.node.name
    comm = channel_pair(net, name)
    if comm is None:
        return
    assert comm.peer == 1 - ep.rank
    if ep.rank == 1:
        listener.stop()
        comm.send("stopped")
        # rank 0 opened a channel while we were not listening; its hello came before "sent"
        assert comm.recv(timeout=WAIT) == "sent"
        got: queue.SimpleQueue = queue.SimpleQueue()
        temp = registry.listen(f"mpi://{ep.rank}", got.put)
        try:
            early = got.get(timeout=WAIT)  # handed over at once: it was waiting
            assert early.peer_address == "mpi://0" and early.local_address == "mpi://1"
            assert early.channel[0] == 0  # opened by rank 0
            assert early.recv(timeout=WAIT) == "early"
            early.send("answer")
        finally:
            temp.stop()
        # put the module's listener back (only one listener per endpoint)
        net_listener = registry.listen("mpi://", accepted.on_connect)
        assert net_listener.address == "mpi://1"
        comm.send("listening again")
        assert comm.recv(timeout=WAIT) == "bye"
        comm.close()
    else:
        assert comm.recv(timeout=WAIT) == "stopped"
        early = registry.connect("mpi://1", timeout=WAIT)
        early.send("early")
        comm.send("sent")
        assert early.recv(timeout=WAIT) == "answer"
        early.close()
        assert comm.recv(timeout=WAIT) == "listening again"
        comm.send("bye")
        comm.close()


def test_two_channels_between_the_same_ranks_are_independent(net, request):
    name = request.node.name
    first = channel_pair(net, name + "-a")
    if first is None:
        return
    second = channel_pair(net, name + "-b", a=1, b=0)  # opened the other way round
    assert first.channel != second.channel
    if net[0].rank == 0:
        second.send("on second")
        first.send("on first")
    else:
        assert first.recv(timeout=WAIT) == "on first"
        assert second.recv(timeout=WAIT) == "on second"
    first.close()
    # closing one channel leaves the other open
    if net[0].rank == 0:
        second.send("still open")
    else:
        assert second.recv(timeout=WAIT) == "still open"
    second.close()


def test_channel_to_self(net, request):
    from hpcsched.core.comm import registry

    ep, accepted, _ = net
    me = registry.connect(f"mpi://{ep.rank}", timeout=WAIT)
    me.send(request.node.name)
    other = accepted.get(ep.rank, request.node.name)
    me.send(np.ones(100_000))
    assert other.recv(timeout=WAIT).sum() == 100_000
    other.send("back")
    assert me.recv(timeout=WAIT) == "back"
    me.close()
    other.close()


def test_bad_addresses(net):
    from hpcsched.core.comm import registry

    ep = net[0]
    with pytest.raises(ValueError, match="ranks 0..") as info:
        registry.connect(f"mpi://{ep.size}", timeout=1)
    assert f"mpi://{ep.size}" in str(info.value)
    with pytest.raises(ValueError, match="expected mpi://<rank>"):
        registry.connect("mpi://zero", timeout=1)
    with pytest.raises(ValueError, match="rank must be >= 0"):
        registry.connect("mpi://-1", timeout=1)
    with pytest.raises(ValueError, match=f"this process is MPI rank {ep.rank}"):
        registry.listen(f"mpi://{(ep.rank + 1) % ep.size}", lambda comm: None)
    with pytest.raises(OSError, match="already being listened on"):
        registry.listen("mpi://", lambda comm: None)


def test_mpi_thread_level_is_multiple(net):
    from mpi4py import MPI

    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE


@pytest.mark.timeout(30)
def test_idle_ranks_use_almost_no_cpu(net):
    """All ranks idle at once: each process stays well under 5% of a core."""
    import psutil

    ep = net[0]
    proc = psutil.Process()
    # Wait until the fast polling period after the last traffic is over; then measure
    # over 2 s. The bound is lax (measured: ~0.5% over 10 s per rank) so an
    # oversubscribed, busy CI machine does not make it flaky.
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        time.sleep(0.1)
    before, t0 = proc.cpu_times(), time.monotonic()
    deadline = t0 + 2.0
    while time.monotonic() < deadline:
        time.sleep(0.1)
    after, elapsed = proc.cpu_times(), time.monotonic() - t0
    used = (after.user + after.system) - (before.user + before.system)
    assert used / elapsed < 0.05, f"rank {ep.rank} used {100 * used / elapsed:.1f}% CPU while idle"


@pytest.mark.timeout(60)
def test_doorbell_wakes_a_rank_that_would_poll_only_every_30_s(net):
    """A second endpoint whose progress threads poll only every 30 s: rank 1 still
    gets rank 0's message within seconds, so the ring (not a poll) delivered it."""
    from mpi4py import MPI

    from hpcsched.core import config
    from hpcsched.core.comm.base import CommClosedError
    from hpcsched.hpc.backoff import Backoff
    from hpcsched.hpc.doorbell import Doorbell
    from hpcsched.hpc.mpi import Endpoint

    if not config.get("mpi.doorbell", None, default=True):
        pytest.skip("doorbells are disabled (HPCSCHED_MPI__DOORBELL=false)")
    rank = MPI.COMM_WORLD.Get_rank()
    dup, request = MPI.COMM_WORLD.Idup()
    wait = Backoff(min=1e-4, fast_max=1e-2, max=1e-2)
    deadline = time.monotonic() + WAIT
    while not request.Test():  # not a blocking collective: it would spin
        assert time.monotonic() < deadline, "the other ranks did not create their communicator"
        wait.sleep()
    bell = Doorbell.exchange(dup, wait.sleep)
    assert bell is not None, "every rank of this test runs on one Linux node: bells must work"
    assert bell.all_local and sorted(bell.peers) == [r for r in range(dup.Get_size()) if r != rank]
    slow = {"mpi.poll-min": 30.0, "mpi.poll-fast-max": 30.0, "mpi.poll-max": 30.0,
            "mpi.poll-hold": 0.0, "mpi.doorbell-poll": 30.0}
    with config.set(slow):
        ep = Endpoint(dup, bell)
        got: queue.SimpleQueue = queue.SimpleQueue()
        ep.listen(got.put)
        try:
            if rank == 0:
                time.sleep(0.5)  # let rank 1's progress thread start its 30 s nap
                comm = ep.connect(1)
                comm.send("ring")
                assert comm.recv(timeout=10) == "rang"
            elif rank == 1:
                comm = got.get(timeout=10)
                t0 = time.monotonic()
                assert comm.recv(timeout=10) == "ring"
                comm.send("rang")
                assert time.monotonic() - t0 < 10
                assert bell.rings >= 1
                with pytest.raises(CommClosedError):  # rank 0 shuts down: its bye rings too
                    comm.recv(timeout=10)
        finally:
            ep.shutdown(timeout=5)
    assert not ep._thread.is_alive()


def _dup_and_fence():
    """A fresh duplicate of COMM_WORLD and a barrier over it, both without spinning."""
    from mpi4py import MPI

    from hpcsched.hpc.backoff import Backoff

    wait = Backoff(min=1e-4, fast_max=1e-2, max=1e-2)

    def poll(request, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not request.Test():
            assert time.monotonic() < deadline, f"the other ranks did not {what}"
            wait.sleep()

    dup, request = MPI.COMM_WORLD.Idup()
    poll(request, "create their communicator")
    fence, request = MPI.COMM_WORLD.Idup()
    poll(request, "create their communicator")
    return dup, lambda: poll(fence.Ibarrier(), "reach the barrier")


@pytest.mark.timeout(60)
def test_drain_takes_in_what_was_sent_after_the_endpoint_stopped(net):
    """Rank 1 sends rank 0 a small and a large frame after rank 0's endpoint has stopped,
    as a last heartbeat would: ``drain()`` on every rank receives both, lets rank 1's large
    send complete and frees the communicator, so MPI_Finalize finds nothing unmatched."""
    from mpi4py import MPI

    from hpcsched.hpc.mpi import Endpoint
    from hpcsched.hpc.mpi_comm import KIND_MSG

    dup, barrier = _dup_and_fence()
    rank = dup.Get_rank()
    ep = Endpoint(dup, None)
    got: queue.SimpleQueue = queue.SimpleQueue()
    ep.listen(got.put)
    try:
        if rank == 1:
            comm = ep.connect(0)
            comm.send("hello")
        elif rank == 0:
            assert got.get(timeout=WAIT).recv(timeout=WAIT) == "hello"
            ep.shutdown(timeout=5, free=False)
        barrier()  # rank 0 no longer receives
        if rank == 1:
            large = np.ones(4 * ep.data_threshold, dtype=np.uint8)
            ep.send_frames(0, KIND_MSG, comm.key, [b"late", large])
        ep.shutdown(timeout=1, free=False)
        dropped = ep.drain(timeout=WAIT)
        if rank == 0:
            assert dropped >= 2, dropped  # the control message and the large frame
        assert ep.pending_sends() == 0
        assert ep.comm == MPI.COMM_NULL  # freed
    finally:
        ep.shutdown(timeout=1)


@pytest.mark.timeout(60)
def test_watch_reports_a_rank_gone_silent_but_not_one_that_left(net):
    """Rank 0 watches every rank with a 1 s timeout. Rank 1's progress thread stops dead
    (as when its node loses power); rank 2, if there is one, shuts down and says so. Rank 0
    is told of rank 1 alone, once, a second or so later; the others, watching rank 0,
    hear its beats and report nothing."""
    from hpcsched.hpc.mpi import Endpoint

    dup, barrier = _dup_and_fence()
    rank, size = dup.Get_rank(), dup.Get_size()
    ep = Endpoint(dup, None)
    lost: queue.SimpleQueue = queue.SimpleQueue()
    try:
        ep.watch(range(1, size) if rank == 0 else [0], 1.0,
                 lambda ranks, seconds: lost.put((ranks, seconds)))
        barrier()
        t0 = time.monotonic()
        if rank == 1:
            ep._stop.set()  # silent from now on: no beat, no bye
            ep._thread.join(5)
        elif rank == 2:
            ep.shutdown(timeout=5)
        if rank == 0:
            ranks, seconds = lost.get(timeout=10)
            assert ranks == [1] and 1.0 < seconds < 2.0, (ranks, seconds)
            # its last beat came up to a quarter of the timeout before it fell silent
            assert 0.7 < time.monotonic() - t0 < 3.0
            ep.unwatch()
        time.sleep(2.0)  # time for anything else to be reported, wrongly
        assert lost.empty()
        barrier()
    finally:
        ep.shutdown(timeout=1)
