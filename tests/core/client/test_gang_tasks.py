"""``ranks=N`` from the client: the annotation sent, bad values refused in the caller,
each member running the task with the first one's value as the result. Outside MPI mode
there is no communicator: ``get_task_comm`` says why (MPI mode: tests/hpc/test_mpi_gangs.py).
"""

from __future__ import annotations

import pytest

import hpcsched
from hpcsched import get_worker
from hpcsched.core.client.client import Client
from hpcsched.core.worker.context import current
from tests.conftest import _local_cluster, worker_env
from tests.launchers.procs import hpcsched_cmd


def members():
    running = current()
    return get_worker().address, list(running.gang)


def comm_or_error():
    try:
        hpcsched.get_task_comm()
    except (ValueError, RuntimeError) as e:
        return type(e).__name__, str(e)
    return "no error", ""


def launcher_env(_=None):
    import os

    names = ("HPCSCHED_MPI_PREFIX", "HPCSCHED_NRANKS", "HPCSCHED_GANG_MEMBER")
    with open(os.environ["HPCSCHED_HOSTFILE"]) as f:
        hosts = f.read().split()
    return {n: os.environ[n] for n in names}, hosts, os.environ["HPCSCHED_HOSTFILE"]


def left_behind(path):
    import os

    return "HPCSCHED_HOSTFILE" in os.environ, os.path.exists(path)


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
    with pytest.raises(ValueError, match="ranks_per_node="):
        c.submit(members, ranks=2, ranks_per_node=bad)


@pytest.mark.parametrize("calls", [1, 40])  # a map above the bulk threshold too
def test_a_gang_task_names_its_slots_for_an_mpi_launcher(c, calls):
    """Each member's environment: the launcher line over the hosts of the task's slots,
    a host file naming each, the member's place; all gone when the task ends."""
    if calls == 1:
        results = [c.submit(launcher_env, ranks=2, pure=False).result(timeout=30)]
    else:
        results = c.gather(c.map(launcher_env, range(calls), ranks=2, pure=False), timeout=120)
    workers = c.scheduler_info()["workers"]
    for env, hosts, _path in results:
        assert len(hosts) == 2 and set(hosts) <= {w["host"] for w in workers.values()}
        counts = ",".join(f"{h}:{hosts.count(h)}" for h in dict.fromkeys(hosts))
        assert env == {"HPCSCHED_MPI_PREFIX": f"mpiexec -n 2 -hosts {counts}",
                       "HPCSCHED_NRANKS": "2", "HPCSCHED_GANG_MEMBER": "0"}
    # the same worker, later, in a task of its own: no variable, no file left
    first = c.submit(members, ranks=2, pure=False).result(timeout=30)[0]
    assert c.submit(left_behind, results[-1][2], workers=[first],
                    pure=False).result(timeout=30) == (False, False)


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


@pytest.mark.timeout(120)
def test_a_worker_in_a_batch_job_names_its_job_to_the_scheduler(procs):
    # a gang's slots come from one job (tests/core/state/test_wide_tasks.py)
    with _local_cluster(n_workers=0) as cluster, \
            Client(cluster, set_as_default=False) as client:
        procs.start([*hpcsched_cmd(), "worker", cluster.scheduler_address, "--name", "in-job",
                     "--nthreads", "1", "--memory-limit", "0"], "in-job",
                    env={**worker_env(), "HPCSCHED_SECRET": cluster.security.secret_hex(),
                         "SLURM_JOB_ID": "4242"})
        client.wait_for_workers(1, timeout=60)
        (info,) = client.scheduler_info()["workers"].values()
        assert info["job"] == "4242"
