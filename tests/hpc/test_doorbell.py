"""Doorbells between the ranks of a node (no MPI needed: two bells in one process).

The MPI side (a rank that would poll only every 30 s wakes on a ring) is in
tests/hpc/test_mpi_comm.py.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

import pytest

from hpcsched.hpc.doorbell import _NODE, Doorbell, bell_name, node_identity

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets are Linux-only"),
]


@pytest.fixture
def bells():
    token = os.urandom(16)
    made = [Doorbell(token, r, peers=[0, 1, 2], size=3) for r in range(3)]
    try:
        yield made
    finally:
        for b in made:
            b.close()


def test_a_ring_wakes_the_rung_rank_only(bells):
    a, b, c = bells
    assert not b.wait(0)  # nothing rung yet
    a.ring(1)
    assert b.wait(5)
    assert b.rings == 1
    assert not c.wait(0)
    assert not b.wait(0)  # waiting cleared the ring


def test_many_rings_before_a_wait_make_one_wake_up(bells):
    a, b, _ = bells
    for _ in range(100):  # more than the socket queue holds: the extra rings are dropped
        a.ring(1)
    assert b.wait(5)
    assert not b.wait(0)


def test_a_ring_from_another_thread_wakes_a_waiting_thread(bells):
    _, b, _ = bells
    woke = []
    t = threading.Thread(target=lambda: woke.append(b.wait(20)))
    t.start()
    try:
        b.ring_self()
    finally:
        t.join(10)
    assert woke == [True]


def test_ringing_a_closed_or_foreign_rank_is_harmless(bells):
    a, b, _ = bells
    b.close()
    a.ring(1)  # its owner is gone: ECONNREFUSED, ignored
    a.ring(7)  # not a peer on this node: nothing to do
    assert not b.wait(0)  # a closed bell never reports a ring


def test_peers_and_all_local():
    token = os.urandom(16)
    alone = Doorbell(token, 0, peers=[0], size=4)  # three ranks on other nodes
    try:
        assert alone.peers == {} and not alone.all_local
        alone.ring(2)  # elsewhere: no ring, no error
    finally:
        alone.close()
    some = Doorbell(token, 1, peers=[0, 1, 3], size=4)
    try:
        assert sorted(some.peers) == [0, 3] and not some.all_local
    finally:
        some.close()


def test_two_jobs_on_one_node_do_not_share_bells():
    one = Doorbell(os.urandom(16), 0, peers=[0, 1], size=2)
    other_job_rank1 = Doorbell(os.urandom(16), 1, peers=[0, 1], size=2)
    try:
        one.ring(1)  # rank 1 of ITS job, which does not exist
        assert not other_job_rank1.wait(0.05)
    finally:
        one.close()
        other_job_rank1.close()


def test_a_name_can_be_bound_once():
    token = os.urandom(16)
    first = Doorbell(token, 0, peers=[0], size=1)
    try:
        with pytest.raises(OSError):
            Doorbell(token, 0, peers=[0], size=1)
    finally:
        first.close()
    assert bell_name(token, 0).startswith("\0hpcsched-bell-")


def test_node_identity_is_stable_and_private_to_the_node():
    ident = node_identity()
    assert len(ident) == _NODE and ident == node_identity()
    assert ident.startswith(socket.gethostname().encode()[:64])


def test_a_rank_that_does_not_listen_still_rings_and_is_not_rung():
    token = os.urandom(16)
    listener = Doorbell(token, 0, peers=[0, 1], size=2, quiet=[1])
    poller = Doorbell(token, 1, peers=[0, 1], size=2, quiet=[1], listen=False)
    try:
        assert listener.peers == {} and listener.all_local  # rank 1 is here and rings it
        assert sorted(poller.peers) == [0] and not poller.all_local and not poller.listening
        poller.ring(0)
        assert listener.wait(5)
        poller.ring_self()  # nothing to wake: it polls
    finally:
        listener.close()
        poller.close()
