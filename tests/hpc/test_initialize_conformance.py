"""dask-mpi's ``initialize`` tests, as behaviours of ``hpcsched.initialize`` under mpiexec.

Ported from dask-mpi's ``dask_mpi/tests/test_initialize.py`` (test_basic,
test_small_world, test_no_exit) and their scripts, which run here with only
their import lines changed (tests/hpc/scripts/dask_mpi/). Where hpcsched
differs on purpose the test says so: rank 0 is scheduler *and* client (one
more worker than dask-mpi), and a world of one runs on a LocalCluster instead
of failing. Every run is bounded and checked to leave no process behind
(``run`` of tests/hpc/mpi_scripts.py).
"""

from __future__ import annotations

import os
import re

import pytest

from hpcsched.hpc.initialize_options import resolve
from tests.hpc.mpi_scripts import SCRIPTS, run
from tests.hpc.mpirun import needs_mpiexec

DASK_MPI = SCRIPTS / "dask_mpi"


def script(name: str) -> str:
    return str(DASK_MPI / name)


@needs_mpiexec
@pytest.mark.timeout(120)
def test_basic():
    """dask-mpi test_basic: -n 4, tasks run, one pinned to worker 2 by its rank."""
    r = run([script("initialize_basic.py")], module=False)
    assert r.code == 0, r
    assert r.out.count("initialize_basic ok") == 1, r


@needs_mpiexec
@pytest.mark.timeout(120)
def test_small_world_runs_on_a_local_cluster():
    """dask-mpi test_small_world expects a failure with one rank; hpcsched runs the
    script on a LocalCluster instead (its Client has no MPI ranks to use)."""
    r = run(["-c", "import hpcsched; assert hpcsched.initialize() is True; "
             "c = hpcsched.Client(n_workers=1, threads_per_worker=1); "
             "assert c.submit(int, '7').result(timeout=30) == 7; c.close(); print('small ok')"],
            nprocs=1, module=False, timeout=90)
    assert r.code == 0, r
    assert "small ok" in r.out and "world size 1" in r.err, r


@needs_mpiexec
@pytest.mark.timeout(120)
def test_no_exit_on_a_sub_communicator():
    """dask-mpi test_no_exit: initialize(comm=<ranks 0-2>, exit=False); rank 3 stays
    out; after send_close_signal every rank meets in the script's own collectives."""
    r = run([script("initialize_no_exit.py")], module=False)
    assert r.code == 0, r
    # ranks' lines may interleave in mpiexec's output: count the phrases, not the lines
    assert sorted(re.findall(r"no_exit ok on rank (\d)", r.out)) == ["0", "1", "2", "3"], r


@needs_mpiexec
@pytest.mark.timeout(120)
def test_every_parameter_is_accepted_and_the_meaningless_are_logged_once(tmp_path):
    r = run([script("initialize_options.py"), str(tmp_path)], nprocs=3, module=False)
    assert r.code == 0, r
    assert "options ok" in r.out, r
    for name in ("protocol='tcp'", "scheduler_port=0", "nanny=True"):
        assert r.err.count(f"ignored {name}") == 1, (name, r)
    assert "cannot respawn a rank" in r.err and "over MPI itself" in r.err, r


@needs_mpiexec
@pytest.mark.timeout(120)
def test_a_worker_class_of_another_protocol_fails_every_rank_clearly():
    r = run([script("initialize_bad_class.py")], module=False)
    assert r.code != 0, r
    assert "not a subclass of hpcsched.core.worker.server.Worker" in r.err, r
    assert "never reached" not in r.out, r


# ---------------------------------------------------------------- the translation alone
def test_resolve_translates_dask_names():
    o = resolve(worker_class="distributed.Nanny", memory_limit=0.25, dashboard=False,
                interface="lo")
    assert o.worker_class is None and o.memory_limit == 0.25 and o.dashboard_address is None
    assert any("cannot respawn" in n for n in o.ignored)
    assert any(n.startswith("interface='lo'") for n in o.ignored)
    assert resolve(interface="lo").dashboard_address == "127.0.0.1:8787"
    assert resolve(worker_options={"protocol": "tcp", "lifetime": 5}).worker_kwargs == \
        {"lifetime": 5}


@pytest.mark.parametrize("kwargs, error", [
    ({"nthreads": 0}, "nthreads"),
    ({"memory_limit": "lots"}, "memory_limit"),
    ({"worker_options": {"bogus": 1}}, "worker_options['bogus']"),
    ({"worker_options": [1]}, "worker_options must be a dict"),
    ({"worker_class": "no.such.Module"}, "cannot be imported"),
    ({"interface": "no-such-if0"}, "interface=.no-such-if0. not found on this host"),
])
def test_resolve_rejects_bad_input_clearly(kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error.replace("[", r"\[")):
        resolve(**kwargs)


RESTRICTED_TO_A_MISSING_RANK = (
    "import hpcsched, sys; hpcsched.initialize(); c = hpcsched.Client({client}); "
    "f = c.submit(int, '7', workers={rank}); print('ok', c.submit(int, '8').result()); "
    "f.result()")


@needs_mpiexec
@pytest.mark.timeout(150)
@pytest.mark.parametrize("nprocs,client,rank", [(1, "n_workers=1, threads_per_worker=1", 2),
                                                (3, "", 7)])
def test_a_task_no_rank_can_run_fails_instead_of_hanging(nprocs, client, rank):
    """A task restricted to a worker the job does not have (``workers=7`` of ranks 1-2,
    or rank 2 in a world of one, whose LocalCluster does not grow either) fails with
    NoValidWorkerError after scheduler.no-workers-timeout, here configured short; the job
    ends with the script's error rather than waiting until its walltime."""
    r = run(["-c", RESTRICTED_TO_A_MISSING_RANK.format(client=client, rank=rank)],
            nprocs=nprocs, module=False, timeout=120,
            env={"HPCSCHED_SCHEDULER__NO_WORKERS_TIMEOUT": "2"})
    assert r.code == 1, r
    assert "ok 8" in r.out, r
    assert "NoValidWorkerError" in r.err and f"workers=['{rank}']" in r.err, r


def test_fixed_clusters_fail_unrunnable_tasks_unless_configured_otherwise(monkeypatch):
    from hpcsched.hpc import bootstrap

    monkeypatch.setenv("HPCSCHED_SCHEDULER__NO_WORKERS_TIMEOUT", "")  # restored after
    monkeypatch.delenv("HPCSCHED_SCHEDULER__NO_WORKERS_TIMEOUT")
    assert bootstrap._fixed_cluster_no_workers_timeout() == {
        "no_workers_timeout": bootstrap.FIXED_CLUSTER_NO_WORKERS_TIMEOUT}
    bootstrap.world_of_one_fixed_size()
    assert os.environ["HPCSCHED_SCHEDULER__NO_WORKERS_TIMEOUT"] == "60"
    monkeypatch.setenv("HPCSCHED_SCHEDULER__NO_WORKERS_TIMEOUT", "5s")
    assert bootstrap._fixed_cluster_no_workers_timeout() == {}
    bootstrap.world_of_one_fixed_size()
    assert os.environ["HPCSCHED_SCHEDULER__NO_WORKERS_TIMEOUT"] == "5s"


@needs_mpiexec
@pytest.mark.timeout(120)
def test_execute_runs_the_client_function_and_every_rank_goes_on():
    """dask-mpi test_execute's test_no_exit: execute(f, comm=<ranks 0-2>) runs f on rank 0
    (a single task pinned to a rank, and a map of 40 calls, above the bulk threshold);
    then every rank, rank 3 included, goes on after it."""
    r = run([script("execute_no_exit.py")], module=False)
    assert r.code == 0, r
    assert r.out.count("execute client ran") == 1, r
    assert sorted(re.findall(r"execute_no_exit ok on rank (\d)", r.out)) == ["0", "1", "2", "3"], r


@needs_mpiexec
@pytest.mark.timeout(120)
def test_execute_ends_the_job_with_the_client_functions_failure():
    r = run(["-c", "import hpcsched\n"
                   "def f(): raise RuntimeError('client function failed')\n"
                   "hpcsched.execute(f)\n"
                   "print('after execute')"], nprocs=3, module=False)
    assert r.code == 1, r
    assert "client function failed" in r.err, r


@pytest.mark.parametrize("kwargs", [dict(client_rank=2), dict(scheduler_rank=1),
                                    dict(scheduler=False, scheduler_address="tcp://a:1"),
                                    dict(scheduler_file="f.json"), dict(worker_name="w")])
def test_execute_refuses_a_layout_it_does_not_have(kwargs):
    import hpcsched

    with pytest.raises(ValueError, match="rank 0 of comm.+--scheduler-file"):
        hpcsched.execute(print, **kwargs)
