"""The SLURM and Grid Engine adapters against the real batch systems on localhost:
submit (directives as rendered), status, arrays, failures, cancel -- and the queue is
checked with squeue / qstat directly to be empty afterwards.

The job body is ``sleep`` instead of a worker; the cluster-level end-to-end tests
run real workers.
"""

from __future__ import annotations

import subprocess

import pytest

from hpcsched.jobqueue.base import BatchSystem
from hpcsched.jobqueue.job import JobState
from hpcsched.jobqueue.systems.sge import SGESystem
from hpcsched.jobqueue.systems.slurm import SLURMSystem
from tests.jobqueue.batch import wait_for


def queue_ids(system: str) -> set[str]:
    """Live job ids straight from the batch system (not through the adapter)."""
    if system == "slurm":
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True,
                             check=True, timeout=30).stdout
        return {ln.split()[0].split("_")[0] for ln in out.splitlines()
                if ln.split() and ln.split()[1] not in ("COMPLETED", "CANCELLED", "FAILED")}
    out = subprocess.run(["qstat"], capture_output=True, text=True, check=True, timeout=30).stdout
    return {ln.split()[0] for ln in out.splitlines()[2:] if ln.split()}


@pytest.fixture(params=["slurm", "sge"])
def real(request, tmp_path):
    """(system name, adapter, submit(body, array=None) -> ids); cancels everything after."""
    name = request.param
    request.getfixturevalue(name)  # skip / fail when the system does not answer
    cls = {"slurm": SLURMSystem, "sge": SGESystem}[name]
    adapter: BatchSystem = cls(cores=2, memory="200MB", walltime="00:05:00",
                               log_directory=str(tmp_path))
    submitted: list[str] = []
    counter = iter(range(1000))

    def submit(body: str, array: int | None = None) -> list[str]:
        job_name = f"hpcsched-test-{next(counter)}"
        script = "\n".join(["#!/bin/sh", *adapter.header(job_name, array), body, ""])
        path = tmp_path / f"{job_name}.sh"
        path.write_text(script)
        job_id = adapter.submit(str(path), script)
        ids = adapter.array_element_ids(job_id, array) if array else [job_id]
        submitted.extend(ids)
        return ids

    yield name, adapter, submit
    if submitted:
        try:
            adapter.cancel(submitted)
        finally:
            parents = {i.split("_")[0].split(".")[0] for i in submitted}
            wait_for(lambda: not (parents & queue_ids(name)), 30, f"{name} queue free of {parents}")


@pytest.mark.slurm
@pytest.mark.sge
@pytest.mark.timeout(90)
def test_submit_status_cancel_leaves_nothing(real):
    name, adapter, submit = real
    ids = submit("sleep 300")
    ids += submit("sleep 300", array=3)
    assert len(ids) == 4
    wait_for(lambda: all(s.state is JobState.RUNNING for s in adapter.status(ids).values())
             and len(adapter.status(ids)) == 4, 30, "4 running jobs")
    adapter.cancel(ids)
    parents = {i.split("_")[0].split(".")[0] for i in ids}
    wait_for(lambda: not (parents & queue_ids(name)), 30, "an empty queue")
    # cancelling again (jobs gone) is not an error
    adapter.cancel(ids)


@pytest.mark.slurm
@pytest.mark.sge
@pytest.mark.timeout(90)
def test_job_that_fails_at_start_is_seen_failed_with_exit_code(real):
    name, adapter, submit = real
    (job_id,) = submit("echo starting; exit 3")

    def ended() -> bool:
        st = adapter.status([job_id]).get(job_id)
        return st is not None and st.state.terminal

    wait_for(ended, 45, "the failing job to be reported ended")
    st = adapter.status([job_id])[job_id]
    assert st.state is JobState.FAILED and st.exit_code == 3


@pytest.mark.slurm
@pytest.mark.sge
@pytest.mark.timeout(60)
def test_submit_refused_raises_with_the_batch_systems_message(real):
    name, adapter, submit = real
    bad = {"slurm": "-p no-such-partition", "sge": "-q no-such-queue"}[name]
    adapter.params["job_extra_directives"] = [bad]
    with pytest.raises(Exception) as info:
        submit("sleep 1")
    text = str(info.value)
    assert "exit status" in text and "no-such" in text
