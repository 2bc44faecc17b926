"""The backoff of failing submissions, with a fake clock: the schedule a cluster keeps to.

The real-SLURM side (``adapt()`` with a partition that does not exist, a short
schedule) is in ``test_submission_backoff_slurm.py``; here the default schedule's
figures: a cluster that adapts every second against a submission that always fails
submits twice in its first ten minutes.
"""

from __future__ import annotations

import pytest

from hpcsched.core import config
from hpcsched.jobqueue.submissions import SubmissionBackoff

ERROR = "sbatch --parsable failed with exit status 1:\nsbatch: error: invalid partition specified"


def submissions_while_failing(backoff: SubmissionBackoff, seconds: float,
                              every: float = 1.0) -> list[float]:
    """When a cluster asked every ``every`` s would submit, all submissions failing."""
    times = []
    now = 0.0
    while now < seconds:
        if backoff.may_submit(now):
            times.append(now)
            backoff.failed(now, ERROR)
        now += every
    return times


@pytest.mark.timeout(10)
def test_the_default_schedule_submits_twice_in_ten_minutes_and_pauses_after_ten(isolated_config):
    backoff = SubmissionBackoff.from_config()
    assert backoff.delays == (60.0, 900.0, 1800.0)
    assert (backoff.pause_after_failures, backoff.pause_after_dead_jobs) == (10, 3)
    # adaptive asks every second: t=0 fails, t=60 fails, the next would be at 960 s
    assert submissions_while_failing(backoff, 600) == [0.0, 60.0]
    assert backoff.not_before == 960.0
    # then every 30 minutes, until the tenth failure pauses submissions for good
    rest = submissions_while_failing(backoff, 100_000.0)
    assert rest[:3] == [960.0, 2760.0, 4560.0]
    assert backoff.failures == 10 and backoff.paused
    assert not backoff.may_submit(1e9)
    assert "submissions paused" in backoff.describe(1e9)
    assert "invalid partition specified" in backoff.describe(1e9)


@pytest.mark.timeout(10)
def test_a_success_resumes_and_a_connected_worker_ends_a_run_of_dead_jobs():
    b = SubmissionBackoff(delays=(1.0, 2.0), pause_after_failures=5, pause_after_dead_jobs=3)
    assert b.describe(0.0) == "" and b.may_submit(0.0)
    b.failed(0.0, ERROR)
    b.failed(1.0, ERROR)
    assert not b.may_submit(2.9) and b.may_submit(3.0)
    assert "2 failed submissions in a row (next submission in 1 s)" in b.describe(2.0)
    b.submitted(3.0)  # sbatch works again (the partition came back)
    assert not b.failing and b.may_submit(3.0) and b.describe(3.0) == ""
    # jobs that die before a worker connects count too: the third pauses
    for t in (10.0, 20.0, 30.0):
        assert b.may_submit(t)
        b.submitted(t)
        b.job_died(t, "batch job 7 ended failed before any of its workers connected")
    assert b.paused and "3 jobs ended before a worker connected" in b.describe(31.0)
    b.worker_connected()  # a job started well after all
    assert not b.paused and b.may_submit(31.0)
    b.failed(40.0, ERROR)
    b.reset()  # the user calls scale() or adapt() again
    assert b.may_submit(40.0) and not b.failing


@pytest.mark.timeout(10)
def test_the_schedule_is_configurable_and_checked(isolated_config, monkeypatch):
    monkeypatch.setenv("HPCSCHED_JOBQUEUE__SUBMIT_RETRY_DELAYS", "1s, 500ms")
    config.refresh()
    try:
        with config.set({"jobqueue.submit-pause-after": 4}):
            b = SubmissionBackoff.from_config()
    finally:
        monkeypatch.delenv("HPCSCHED_JOBQUEUE__SUBMIT_RETRY_DELAYS")
        config.refresh()
    assert b.delays == (1.0, 0.5) and b.pause_after_failures == 4
    assert submissions_while_failing(b, 100.0, every=0.25) == [0.0, 1.0, 1.5, 2.0]
    with pytest.raises(ValueError, match="pause_after_failures must be at least 1"):
        SubmissionBackoff(pause_after_failures=0)
    with pytest.raises(ValueError, match="at least one"):
        SubmissionBackoff(delays=())
    with config.set({"jobqueue.submit-retry-delays": ["1s", "soon"]}), \
            pytest.raises(ValueError, match="jobqueue.submit-retry-delays"):
        SubmissionBackoff.from_config()
