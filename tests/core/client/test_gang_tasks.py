"""``ranks=N`` from the client: the annotation sent, bad values refused in the caller,
each member running the task with the first one's value as the result. Outside MPI mode
there is no communicator: ``get_task_comm`` says why (MPI mode: tests/hpc/test_mpi_gangs.py).
"""

from __future__ import annotations

import pytest

import hpcsched
from hpcsched import get_worker
from hpcsched.core.worker.context import current


def members():
    running = current()
    return get_worker().address, list(running.gang)


def comm_or_error():
    try:
        hpcsched.get_task_comm()
    except (ValueError, RuntimeError) as e:
        return type(e).__name__, str(e)
    return "no error", ""


@pytest.fixture
def c(shared_client):
    if len(shared_client.scheduler_info()["workers"]) < 2:
        pytest.skip("needs two workers")
    return shared_client


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True])
def test_a_bad_ranks_value_is_refused_in_the_caller(c, bad):
    with pytest.raises(ValueError, match="ranks="):
        c.submit(members, ranks=bad)
    with pytest.raises(ValueError, match="ranks="):
        c.map(members, [[1]], ranks=bad)


def test_every_member_runs_it_and_the_first_ones_value_is_the_result(c):
    me, gang = c.submit(members, ranks=2, pure=False).result(timeout=30)
    assert len(gang) == 2 == len(set(gang)) and me == gang[0]


def test_map_makes_one_gang_per_element(c):
    results = c.gather(c.map(lambda i: (i, members()), range(4), ranks=2), timeout=30)
    assert [i for i, _ in results] == [0, 1, 2, 3]
    assert all(me == gang[0] and len(set(gang)) == 2 for _, (me, gang) in results)


def test_dask_annotate_ranks_reaches_submit(c):
    dask = pytest.importorskip("dask")
    with dask.annotate(ranks=2):
        me, gang = c.submit(members, pure=False).result(timeout=30)
    assert len(gang) == 2 and me == gang[0]


def test_get_task_comm_needs_mpi_workers_and_a_gang(c):
    kind, why = c.submit(comm_or_error, ranks=2, pure=False).result(timeout=30)
    assert kind == "RuntimeError" and "not MPI ranks" in why
    kind, why = c.submit(comm_or_error, pure=False).result(timeout=30)
    assert kind == "ValueError" and "ranks=N" in why
    with pytest.raises(ValueError, match="ranks=N"):
        hpcsched.get_task_comm()
