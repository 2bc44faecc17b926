"""What a worker does with the scheduler's messages: every op of the protocol's
scheduler -> worker table has one handler, each message is decoded to its record
(events get a ``stimulus_id``), and a message that is not a known op with the right
fields is logged, naming the op and what is wrong, and skipped: the worker goes on."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from hpcsched import Client, LocalCluster
from hpcsched.core.protocol import messages as protocol
from hpcsched.core.worker.parts.inbox import FromScheduler
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster_client() -> Iterator[tuple[LocalCluster, Client]]:
    # inproc: the workers are threads of this process, so their logs reach caplog
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, timeout=60,
                           dashboard_address=None)
    try:
        with Client(cluster, set_as_default=False) as client:
            yield cluster, client
    finally:
        cluster.close()


def inc(x: int) -> int:
    return x + 1


def test_every_record_the_scheduler_sends_has_one_handler(cluster_client):
    _, client = cluster_client
    (records,) = client.run(
        lambda dask_worker: sorted(t.__name__ for t in dask_worker._table)).values()
    assert records == sorted(t.__name__ for t in protocol.SCHEDULER_TO_WORKER.values())


def test_a_malformed_message_from_the_scheduler_is_logged_and_skipped(cluster_client,
                                                                      caplog):
    _, client = cluster_client
    bad = [{"op": "compute-task", "key": "x", "run_spec": None, "colour": 1},
           {"op": "no-such-op"}, "not a dict", {"op": "free-keys"}, {"op": ["unhashable"]}]

    def inject(dask_worker):  # as the transport delivers the scheduler's batches
        dask_worker.loop.put(FromScheduler(bad))

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if "ignores a message from the scheduler" in r.getMessage()]

    with caplog.at_level(logging.ERROR, logger="hpcsched.worker"):
        client.run(inject)
        wait_until(lambda: len(logged()) == len(bad), what="every bad message logged")
    text = "\n".join(logged())
    assert "op 'compute-task' has unknown fields 'colour'" in text
    assert "unknown op 'no-such-op'" in text
    assert "expected an op dict, got str" in text
    assert "op 'free-keys' lacks the field 'keys'" in text
    # nothing else happened to the worker: it computes as before
    assert client.submit(inc, 1, pure=False).result(timeout=60) == 2
