"""Doorbells: let an MPI rank sleep until a rank on the same node has sent it something.

MPI has no call that waits for a message without spinning a core (MPICH's
blocking calls busy-wait), so the progress thread of :mod:`hpcsched.hpc.mpi`
polls and sleeps in between. Every wake-up costs CPU, so a rank that polls
often for a reply burns a good part of a core doing nothing -- and with more
ranks than cores (the normal case on a laptop or in CI) that CPU is taken from
the ranks doing the work.

A doorbell is a wake-up hint, not a message: every rank binds one Linux
*abstract* ``AF_UNIX`` datagram socket (no file to clean up; it vanishes with
the process) named after a random token of the job and its rank. After a rank
posts an MPI send to a peer on the same node, it sends an empty datagram to
that peer's doorbell; the peer's progress thread sleeps in ``select`` on its
doorbell and wakes at once. Messages and data still travel only over MPI. A
lost or early ring costs nothing but latency: the progress thread still polls
MPI, just rarely (``mpi.doorbell-poll``), so correctness never depends on it.

Which peers share a node is decided once, when the endpoint is created (a
nonblocking ``Iallgather`` polled with back-off, made on every rank whatever
its configuration): ranks whose hostname, kernel boot id and network
namespace agree can reach each other's abstract sockets. A rank with
``mpi.doorbell: false`` does not listen (it polls) but still rings its peers;
off Linux there are no doorbells and the transport polls as before.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import sys
import time
from collections.abc import Iterable
from typing import Any

from hpcsched.hpc.mpi_init import mpi_module

logger = logging.getLogger(__name__)

# bytes per rank in the exchange: the node's identity, 16 of job token, whether it listens
_NODE = 128
_RECORD = _NODE + 16 + 1
_ALREADY_RUNG = (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS)


def node_identity() -> bytes:
    """``_NODE`` bytes equal for exactly the processes that can reach each other's abstract
    sockets: the host's name, the kernel's boot id and the network namespace, side by side
    (not hashed: hashlib's import would cost every rank a few ms of its start)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
    except OSError:
        boot = b"?"
    try:
        namespace = str(os.stat("/proc/self/ns/net").st_ino).encode()
    except OSError:
        namespace = b"?"
    return (socket.gethostname().encode()[:64].ljust(64, b"\0") + boot[:40].ljust(40, b"\0")
            + namespace[:24].ljust(24, b"\0"))


def bell_name(token: bytes, rank: int) -> str:
    """The abstract socket address of ``rank``'s doorbell in the job ``token``."""
    return f"\0hpcsched-bell-{token.hex()}-{rank}"


class Doorbell:
    """This rank's doorbell and the addresses of the doorbells of its node's peers.

    ``peers``: the ranks on this node (this one may be among them); ``quiet``:
    those of them that do not listen (``mpi.doorbell: false`` there), which are
    not rung. With ``listen=False`` this rank only rings its peers and polls for
    its own messages.
    """

    def __init__(self, token: bytes, rank: int, peers: Iterable[int], size: int,
                 quiet: Iterable[int] = (), listen: bool = True):
        if not sys.platform.startswith("linux"):
            raise OSError(errno.EAFNOSUPPORT, "abstract AF_UNIX sockets are Linux-only")
        self.rank = rank
        self._name = bell_name(token, rank)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            if listen:
                self._sock.bind(self._name)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        self.listening = listen
        local = set(peers) - {rank}
        silent = set(quiet)
        self.peers: dict[int, str] = {r: bell_name(token, r) for r in sorted(local - silent)}
        #: every other rank is on this node and rings us: nothing needs fast polling
        self.all_local = listen and len(local) == size - 1
        self.rings = 0  # wake-ups caused by a ring (for tests and benchmarks)

    @classmethod
    def exchange(cls, comm: Any, wait: Any, listen: bool = True,
                 timeout: float = 30.0) -> Doorbell | None:
        """Collective over ``comm`` (whatever ``listen`` is on each rank): create this
        rank's doorbell and learn which ranks share its node and listen.

        ``wait()`` is called between tests of the nonblocking allgather (a
        back-off sleep); TimeoutError if the other ranks do not take part within
        ``timeout`` seconds. Returns None (and logs why) where doorbells cannot work.
        """
        MPI = mpi_module()
        rank, size = comm.Get_rank(), comm.Get_size()
        listen = bool(listen) and sys.platform.startswith("linux")
        mine = bytearray(node_identity() + os.urandom(16) + bytes([listen]))
        every = bytearray(_RECORD * size)
        request = comm.Iallgather([mine, MPI.BYTE], [every, MPI.BYTE])
        deadline = time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > deadline:
                raise TimeoutError(f"MPI rank {rank}: the other ranks did not exchange "
                                   f"doorbells within {timeout}s (the exchange is collective)")
            wait()
        token = bytes(every[_NODE:_NODE + 16])  # rank 0's: the same on every rank
        node = bytes(mine[:_NODE])
        records = [bytes(every[r * _RECORD:(r + 1) * _RECORD]) for r in range(size)]
        peers = [r for r, rec in enumerate(records) if rec[:_NODE] == node]
        quiet = [r for r in peers if not records[r][_NODE + 16]]
        try:
            return cls(token, rank, peers, size, quiet, listen)
        except OSError as e:
            if listen:
                try:  # we cannot be rung, but must still ring the peers that wait for it
                    bell = cls(token, rank, peers, size, quiet, listen=False)
                    logger.warning("MPI rank %d: no doorbell of its own (%s); it polls", rank, e)
                    return bell
                except OSError:
                    pass
            logger.info("MPI rank %d: no doorbells (%s); the transport polls instead", rank, e)
            return None

    def ring(self, rank: int) -> None:
        """Wake ``rank``'s progress thread (no-op if it is not on this node)."""
        name = self.peers.get(rank)
        if name is not None:
            self._ring(name)

    def ring_self(self) -> None:
        """Wake this rank's own progress thread (from another thread)."""
        if self.listening:
            self._ring(self._name)

    def _ring(self, name: str) -> None:
        try:
            self._sock.sendto(b"", name)
        except OSError as e:
            # full queue: the owner has rings waiting, it will wake anyway; refused or
            # absent: that rank has shut down (or not bound yet), nothing to wake
            if e.errno not in (*_ALREADY_RUNG, errno.ECONNREFUSED, errno.ENOENT):
                logger.debug("ringing %r failed: %s", name, e)

    def wait(self, timeout: float) -> bool:
        """Sleep until rung or ``timeout`` seconds passed; True if rung. Clears the rings."""
        try:
            ready, _, _ = select.select([self._sock], [], [], timeout)
        except (OSError, ValueError):  # closed under us: shutting down
            return False
        if not ready:
            return False
        try:
            while True:
                self._sock.recv(16)
        except OSError:
            pass
        self.rings += 1
        return True

    def close(self) -> None:
        self._sock.close()

    def __repr__(self) -> str:
        return f"<Doorbell rank {self.rank}, {len(self.peers)} peers on this node>"
