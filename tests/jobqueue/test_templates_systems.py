"""Job templates on every batch system the tests reach: SLURM and Grid Engine for real
(when running), PBS and LSF through their command emulators. Each submits a job of a
template, sees its worker join with the template's resources, and leaves no job."""

from __future__ import annotations

import pytest

from hpcsched.jobqueue.job import JobState


@pytest.mark.timeout(180)
def test_a_job_of_a_template_is_submitted_as_such_and_serves_its_tasks(batch):
    from hpcsched.core.client.client import Client

    c = batch.cluster(job_name="cpu", job_templates={"gpu": dict(
        job_name="gpu", resources={"GPU": 1},
        job_script_prologue=["export CUDA_VISIBLE_DEVICES=3"])})
    c.scale(jobs=1, template="gpu")
    (job,) = c.jobs.values()
    assert job.template == "gpu" and job.name.startswith(f"gpu-{c.cluster_id}-")
    c.wait_for_workers(1, timeout=120)
    info = next(iter(c.scheduler_info_workers().values()))
    assert info["resources"] == {"GPU": 1.0} and info["resources_only"] is True
    with Client(c) as client:
        # a lambda travels by value: PBS does not pass the test's PYTHONPATH to the job
        gpus = client.submit(lambda: list(__import__("hpcsched").get_task_gpus()),
                             resources={"GPU": 1})
        assert gpus.result(timeout=60) == ["3"]
    assert c.job_summary() == "default: none; gpu: 1 running"
    c.scale(jobs=0, template="gpu")
    assert job.cancel_requested or job.state in (JobState.DONE, JobState.CANCELLED)
    batch.record(c)
