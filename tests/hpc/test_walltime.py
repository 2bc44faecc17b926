"""The parts of MPI mode's walltime handling that need no MPI (hpcsched/hpc/walltime.py):
when to stop, the stop itself in the main thread, and the command of the continuation."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import hpcsched.hpc.walltime as walltime
import hpcsched.jobqueue.runner as runner
from hpcsched.hpc.walltime import (
    DRAIN_SIGNAL,
    Drain,
    WalltimeReached,
    checkpoints_kept,
    continuation_command,
    drain_time,
)
from hpcsched.jobqueue.systems import JOB_END_QUERY_TIMEOUT
from hpcsched.launchers.resources import process_start


def test_the_stop_comes_the_margin_before_the_end_the_batch_system_gives():
    assert drain_time(30, {"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": "1700000600"}) \
        == 1700000570.0
    assert drain_time(30, {}) is None  # no batch job


def test_a_slurm_job_that_does_not_say_its_end_is_asked_for_it(monkeypatch):
    """SLURM before 23.02 sets no SLURM_JOB_END_TIME: scontrol show job has it."""
    asked = []

    def scontrol(cmd, timeout):
        asked.append((cmd, timeout))
        return "JobId=7 JobName=x EndTime=2026-11-29T09:18:28 Partition=debug\n"

    monkeypatch.setattr(runner, "run_command", scontrol)
    end = time.mktime((2026, 11, 29, 9, 18, 28, 0, 0, -1))
    assert drain_time(15, {"SLURM_JOB_ID": "7"}) == end - 15
    assert asked == [(["scontrol", "-o", "show", "job", "7"], JOB_END_QUERY_TIMEOUT)]
    monkeypatch.setattr(runner, "run_command", lambda cmd, timeout: "JobId=7 EndTime=Unknown")
    assert drain_time(15, {"SLURM_JOB_ID": "7"}) is None


def test_a_slurm_job_whose_end_cannot_be_read_has_no_walltime(monkeypatch, caplog):
    def failing(cmd, timeout):
        raise runner.BatchCommandTimeout("scontrol -o show job 7 did not finish in 10s", cmd)

    monkeypatch.setattr(runner, "run_command", failing)
    assert drain_time(15, {"SLURM_JOB_ID": "7"}) is None
    assert "cannot read the end of slurm job 7" in caplog.text


def test_a_pbs_job_ends_its_walltime_after_it_started():
    end = drain_time(60, {"PBS_JOBID": "12.server", "PBS_WALLTIME": "3600",
                          "PBS_ENVIRONMENT": "PBS_BATCH"})
    assert end == process_start() + 3600 - 60  # the job started about when its ranks did


@pytest.mark.timeout(30)
def test_the_time_interrupts_the_main_thread_wherever_it_waits_once():
    drain = Drain(time.time() + 0.3)
    drain.arm()
    try:
        with pytest.raises(WalltimeReached, match="walltime is near"):
            threading.Event().wait(20)  # as a script blocked in gather
        os.kill(os.getpid(), DRAIN_SIGNAL)  # a second notice does nothing
        time.sleep(0.1)
    finally:
        drain.disarm()
    assert signal.getsignal(DRAIN_SIGNAL) is signal.SIG_IGN  # a late notice kills nothing


@pytest.mark.timeout(30)
def test_sigusr1_interrupts_the_main_thread():
    drain = Drain(None)
    drain.arm()
    try:
        with pytest.raises(WalltimeReached, match="SIGUSR1"):
            os.kill(os.getpid(), DRAIN_SIGNAL)
            threading.Event().wait(20)
    finally:
        drain.disarm()


JOB = {"Requeue": "0", "Command": "/home/u/campaign.sh", "TimeLimit": "04:00:00",
       "NumNodes": "2", "NumTasks": "64", "Partition": "cpu", "JobName": "campaign",
       "WorkDir": "/home/u", "StdOut": "/home/u/campaign.out", "StdErr": "/home/u/campaign.out",
       "Account": "(null)"}


def test_a_requeueable_job_is_requeued():
    assert continuation_command("42", {**JOB, "Requeue": "1"}, None) == \
        ["scontrol", "requeue", "42"]


def test_another_is_submitted_again_with_its_script_arguments_and_limits():
    assert continuation_command("42", JOB, ["--steps", "a b"]) == [
        "sbatch", "--time=04:00:00", "--nodes=2", "--ntasks=64", "--partition=cpu",
        "--job-name=campaign", "--chdir=/home/u", "--output=/home/u/campaign.out",
        "--open-mode=append", "--no-requeue", "/home/u/campaign.sh", "--steps", "a b"]


def test_no_continuation_without_a_script_or_its_arguments():
    assert continuation_command("42", JOB, None) is None  # arguments unknown (srun ranks)
    assert continuation_command("42", {**JOB, "Command": "(null)"}, []) is None  # --wrap


def test_progress_is_counted_in_whole_checkpoints(tmp_path):
    (tmp_path / "a.pkl").write_bytes(b"")
    (tmp_path / "b.pkl.tmp-1").write_bytes(b"")  # a write cut short
    assert checkpoints_kept(str(tmp_path)) == 1
    assert checkpoints_kept(str(tmp_path / "none")) == checkpoints_kept(None) == 0


def test_an_sbatch_continuation_starts_once_the_job_is_over(monkeypatch, tmp_path):
    script = tmp_path / "campaign.sh"
    script.write_text("#!/bin/bash\n")
    monkeypatch.setattr(walltime, "_slurm_job", lambda job_id: {**JOB, "Command": str(script)})
    monkeypatch.setattr(walltime, "_batch_args", lambda job_id: ["x"])
    cmd, what = walltime.plan_continuation(12.2, {"SLURM_JOB_ID": "42"})
    assert cmd is not None and cmd[:2] == ["sbatch", "--begin=now+13"]
    assert cmd[-2:] == [str(script), "x"] and what.startswith("sbatch --begin=now+13")
    monkeypatch.setattr(walltime, "_slurm_job", lambda job_id: {**JOB, "Requeue": "1"})
    assert walltime.plan_continuation(12.2, {"SLURM_JOB_ID": "42"})[0] == \
        ["scontrol", "requeue", "42"]
    assert walltime.plan_continuation(12.2, {})[0] is None  # not a SLURM job
