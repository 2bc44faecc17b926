"""HTCondorCluster, OARCluster, MoabCluster and FluxCluster against emulators of their
systems (tests/jobqueue/emulators): jobs really run, and each system's commands answer in
their real formats.

Each cluster makes a round trip (scale to 2 jobs, compute, scale to 0, nothing left in
the queue nor running) in which every worker names its job as its batch system does
(the system's own in-job detection, sent with its heartbeats), and adapts to work on
both roads (a bulk map, tasks one by one). Their job files are compared with
tests/jobqueue/test_conformance_new_scripts.py.
"""

from __future__ import annotations

import time

import pytest

from hpcsched.core import config
from tests.jobqueue.batch import wait_for

SYSTEMS = ["htcondor", "oar", "moab", "flux"]


def _job_ids_of_workers(cluster) -> dict[str, str | None]:
    """worker name -> the job id its heartbeats carry."""
    return {
        ws.name: (ws.metrics or {}).get("job_id")
        for ws in list(cluster.scheduler.state.workers.values())
    }


@pytest.mark.timeout(150)
@pytest.mark.parametrize("batch", SYSTEMS, indirect=True)
def test_round_trip_scale_compute_scale_to_zero(batch):
    from hpcsched.core.client.client import Client
    from tests.jobqueue.emulators import live_processes

    c = batch.cluster()
    c.scale(jobs=2)
    ids = batch.record(c)
    assert len(c.jobs) == 2 and len(ids) == 2
    c.wait_for_workers(2, timeout=90)
    with Client(c) as client:
        assert sum(client.gather(client.map(lambda x: x * 2, range(10)))) == 90
    # each worker read its job's id from the job's environment, as its system writes it
    wait_for(lambda: all(_job_ids_of_workers(c).values()), 30, "heartbeats with job ids")
    jobs_by_name = {j.name: j.job_id for j in c.jobs.values()}
    assert _job_ids_of_workers(c) == jobs_by_name
    c.scale(0)
    batch.assert_queue_empty(ids)
    wait_for(lambda: not c.workers, 30, "workers to leave")
    state = batch.env["HPCSCHED_EMU_STATE"]
    wait_for(lambda: not live_processes(state), 30, "every job process to end")
    assert not c.failed_jobs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("batch", SYSTEMS, indirect=True)
def test_adapt_grows_with_work_and_shrinks_to_zero(batch, road):
    from hpcsched.core.client.client import Client
    from tests.jobqueue.emulators import live_processes

    c = batch.cluster()
    with config.set(
        {"adaptive.interval": 0.3, "adaptive.wait-count": 2, "adaptive.target-duration": 1.0}
    ):
        adaptive = c.adapt(minimum=0, maximum=2)
        with Client(c) as client:
            futures = road.calls(client, lambda x: (time.sleep(0.3), x)[1], 40)
            wait_for(lambda: len(c.jobs) == 2, 60, "adaptive to submit two jobs")
            assert sum(client.gather(futures)) == sum(range(40))
        wait_for(
            lambda: not any(j.active for j in c.jobs.values()),
            90,
            "adaptive to retire the idle jobs down to zero",
        )
        adaptive.stop()
    ids = batch.record(c)
    batch.assert_queue_empty(ids)
    wait_for(
        lambda: not live_processes(batch.env["HPCSCHED_EMU_STATE"]), 30, "every job process to end"
    )
    assert len(c.jobs) == 2 and not c.failed_jobs


@pytest.mark.timeout(150)
@pytest.mark.parametrize("batch", ["htcondor"], indirect=True)
def test_htcondor_job_array_is_one_cluster_of_jobs(batch):
    from hpcsched.core.client.client import Client

    c = batch.cluster(job_array=True)
    c.scale(jobs=2)
    ids = batch.record(c)
    assert sorted(c.jobs) == [f"{min(ids)}.0", f"{min(ids)}.1"] and len(ids) == 1
    c.wait_for_workers(2, timeout=90)
    with Client(c) as client:
        assert client.submit(sum, [1, 2]).result(timeout=30) == 3
    wait_for(lambda: all(_job_ids_of_workers(c).values()), 30, "heartbeats with job ids")
    assert _job_ids_of_workers(c) == {j.name: j.job_id for j in c.jobs.values()}
    c.scale(0)
    batch.assert_queue_empty(ids)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("batch", ["flux"], indirect=True)
def test_a_flux_job_asks_its_own_instance_for_cores_and_walltime(batch, tmp_path):
    """In a Flux job, FLUX_URI names the job's instance: `flux resource list` gives its
    cores and `flux kvs get resource.R` its expiration, which detect() reads."""
    import subprocess
    import sys

    script = tmp_path / "job.sh"
    log = tmp_path / "job.out"
    script.write_text(
        "#!/bin/sh\n#flux: -N 1 -n 1 -c 3 -t 5m\n"
        f"exec {sys.executable} -c 'from hpcsched.launchers.resources import detect; "
        "r = detect(); print(r.batch_system, r.job_id, r.node_cpus, r.walltime_end)'\n"
    )
    run = subprocess.run(
        ["flux", "batch", f"--output={log}", str(script)],
        env=batch.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    job_id = run.stdout.strip()
    wait_for(lambda: log.exists() and log.read_text().strip(), 60, "the job's output")
    system, seen_id, cores, end = log.read_text().split()
    assert (system, seen_id, cores) == ("flux", job_id, "3")
    assert time.time() < float(end) <= time.time() + 300  # the job's start + 5 minutes
