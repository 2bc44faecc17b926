"""The ``Comm`` contract (tests/core/comm/conformance.py) over the in-process transports.

``inproc://``, and ``tcp://`` on loopback in clear, with a shared secret and over
``tls://``: each comm comes from a real listener (``registry.listen`` / ``connect``),
and both ends run in this process, the acceptor in a thread. ``mpi://`` runs the same
checks between ranks: tests/hpc/test_mpi_comm_conformance.py.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

import pytest

from hpcsched.core.comm import Comm, Security, registry
from tests.core.comm.conformance import CHECKS, WAIT, Check, run_in_threads

pytestmark = pytest.mark.timeout(60)

Pair = Callable[[], tuple[Comm, Comm, str]]  # -> (opener, acceptor, listener's address)


@pytest.fixture(params=["inproc", "tcp", "tcp-secret", "tls"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    """``pair()``: a fresh comm's two ends; every listener and comm is closed afterwards."""
    if request.param == "inproc":
        address, server, client = "inproc://", None, None
    elif request.param == "tcp":
        address, server, client = "tcp://127.0.0.1:0", None, None
    elif request.param == "tcp-secret":
        secret = Security.generate()
        address, server, client = "tcp://127.0.0.1:0", secret, secret
    else:
        cert, key = request.getfixturevalue("tls_files")
        secret = Security.generate().secret
        address = "tls://127.0.0.1:0"
        server = Security(secret=secret, tls_cert=cert, tls_key=key)
        client = Security(secret=secret, tls_ca=cert)
    accepted: queue.Queue = queue.Queue()
    listener = registry.listen(address, accepted.put, server)
    comms: list[Comm] = []

    def make() -> tuple[Comm, Comm, str]:
        opener = registry.connect(listener.address, WAIT, client)
        comms.append(opener)
        acceptor = accepted.get(timeout=WAIT)
        comms.append(acceptor)
        return opener, acceptor, listener.address

    try:
        yield make
    finally:
        listener.stop()
        for c in comms:
            c.close()


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_comm_contract(pair: Pair, check: Check) -> None:
    run_in_threads(check, *pair())
