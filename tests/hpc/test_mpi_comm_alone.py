"""An mpi:// comm's own bookkeeping, with a stand-in for its endpoint: no MPI needed.

The transport between real ranks is tested in ``test_mpi_comm.py`` (under mpiexec).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from hpcsched.core.comm.base import Inbox
from hpcsched.hpc.mpi_comm import MPIComm


class _Endpoint:
    rank = 0

    def __init__(self) -> None:
        self.sent: list = []
        self.forgotten: list = []

    def send_frames(self, dest: int, kind: int, key: Any, frames: Any) -> None:
        self.sent.append((dest, kind))

    def forget(self, comm: MPIComm) -> None:
        self.forgotten.append(comm.key)

    def unlisten(self, lst: Any) -> None:
        pass


class _Inbox(Inbox):
    def __init__(self) -> None:
        self.got: list = []

    def put(self, item: Any) -> None:
        self.got.append(item)

    def offer(self, item: Any) -> None:
        self.got.append(item)


@pytest.mark.parametrize("closed_by", ["peer", "us", "peer-before-deliver_to"])
def test_a_closed_comm_goes_with_its_last_user_not_with_the_collector(closed_by):
    """A worker receives a peer comm's messages with the comm named where it
    delivers) and closes peer comms all the time: once closed, the comm is freed with its
    last user, not kept by a reference cycle through its own source until the cyclic
    collector's next full pass (rare in a server: admin.gc-threshold)."""
    comm = MPIComm(_Endpoint(), 1, (1, 0, 7, True))
    inbox = _Inbox()
    if closed_by == "peer-before-deliver_to":
        comm.on_peer_closed()
        comm.deliver_to(inbox, ("peer", comm), "CLOSED")
        assert inbox.got[-1][1] == "CLOSED"
    else:
        comm.deliver_to(inbox, ("peer", comm), "CLOSED")
        if closed_by == "peer":
            comm.on_peer_closed()
            assert inbox.got[-1][1] == "CLOSED"
        else:
            comm.close()  # the worker that closes it needs no marker
    freed = weakref.ref(comm)
    gc.disable()
    try:
        inbox.got.clear()
        del comm
        assert freed() is None
    finally:
        gc.enable()
