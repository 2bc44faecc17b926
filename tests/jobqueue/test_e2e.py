"""End to end: SLURMCluster / SGECluster against the real batch systems on localhost,
PBSCluster / LSFCluster against the command emulators -- the same tests for all four;
PBSCluster also against SchedMD's Torque wrappers over the local SLURM (``torque``: a
second, independent source of PBS command behaviour) where a test says so.

Every test checks with the batch system's own command (``squeue``, ``qstat``,
``bjobs``), not through the adapter, that nothing it submitted is left, and the
``batch`` fixture (tests/jobqueue/conftest.py) cancels whatever a failing test leaves
behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpcsched.core import config
from hpcsched.jobqueue.cluster import JobFailedError, SchedulerUnreachableError
from hpcsched.jobqueue.job import JobState
from hpcsched.jobqueue.runner import BatchCommandError, BatchCommandTimeout
from tests.conftest import interruptible
from tests.jobqueue.batch import (
    CLASSES,
    ROOT,
    Batch,
    numeric,
    run_command,
    unfinished,
    wait_for,
)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("job_array", [False, True], ids=["jobs", "array"])
def test_scale_compute_scale_down(batch, job_array):
    from hpcsched.core.client.client import Client

    c = batch.cluster(job_array=job_array, processes=1)
    preview = c.job_script(array=2 if job_array else None)
    assert oct(os.stat(c.secret_file).st_mode & 0o777) == "0o600"
    assert c.security.secret_hex() not in preview
    assert f"HPCSCHED_SECRET_FILE={c.secret_file}" in preview
    c.scale(jobs=2)
    ids = batch.record(c)
    first = next(iter(c.jobs.values()))
    # job_script() showed exactly what was submitted
    assert (batch.log_dir / f"{first.name.split('.')[0]}.sh").read_text() == preview
    assert len(c.jobs) == 2 and len(ids) == (1 if job_array else 2)
    c.wait_for_workers(2, timeout=60)
    assert all(j.state is JobState.RUNNING or j.workers for j in c.jobs.values())
    with Client(c) as client:
        assert sum(client.gather(client.map(lambda x: x * 2, range(10)))) == 90
    c.scale(0)
    batch.assert_queue_empty(ids)
    wait_for(lambda: not c.workers, 30, "workers to leave")
    c.close()
    assert not os.path.exists(c.secret_file)


@pytest.mark.timeout(90)
def test_two_workers_per_job_and_scale_by_workers(batch):
    c = batch.cluster(cores=2, processes=2, memory="600MB")
    c.scale(3)  # 3 workers = 2 whole jobs
    batch.record(c)
    assert len(c.jobs) == 2
    c.wait_for_workers(4, timeout=60)
    names = sorted(w["name"] for w in c.workers.values())
    assert len(names) == 4 and all(c.book.job_of_worker(n) for n in names)
    c.scale_down([next(iter(c.workers))])  # one worker's address: its whole job goes
    wait_for(lambda: len(c.workers) == 2, 30, "the other job's 2 workers to remain")
    assert sum(1 for j in c.jobs.values() if j.active) == 1


@pytest.mark.timeout(90)
def test_job_failing_at_start_is_reported_with_its_log(batch, caplog):
    c = batch.cluster(job_script_prologue=["echo 'prologue: module python/9 not found' >&2",
                                           "exit 3"])
    c.scale(jobs=1)
    batch.record(c)
    t0 = time.monotonic()
    with pytest.raises(JobFailedError) as info:
        c.wait_for_workers(1, timeout=60)
    assert time.monotonic() - t0 < 45
    msg = str(info.value)
    assert "before any of its workers connected" in msg
    assert "exit code 3" in msg and "module python/9 not found" in msg
    assert c.failed_jobs and c.failed_jobs[0].state is JobState.FAILED
    assert "module python/9 not found" in caplog.text  # logged too
    # not resubmitted in a loop: the target waits for the next scale()
    time.sleep(3 * config.get("jobqueue.poll-interval"))
    assert len(c.jobs) == 1


@pytest.mark.timeout(90)
def test_worker_that_cannot_reach_the_scheduler_exits_naming_the_address(batch):
    c = batch.cluster(death_timeout=3)
    c.scheduler_address = "tcp://127.0.0.1:9"  # nothing listens there
    c.scale(jobs=1)
    batch.record(c)
    with pytest.raises(JobFailedError) as info:
        c.wait_for_workers(1, timeout=60)
    msg = str(info.value)
    assert "could not reach the scheduler at tcp://127.0.0.1:9" in msg
    assert "death_timeout=3" in msg


@pytest.mark.timeout(90)
def test_wrong_secret_is_refused(batch):
    c = batch.cluster(death_timeout=5)
    with open(c.secret_file, "w") as f:
        f.write("ab" * 32)
    c.scale(jobs=1)
    batch.record(c)
    with pytest.raises(JobFailedError, match="refused our credentials"):
        c.wait_for_workers(1, timeout=60)
    assert not c.workers


# every wait below is a condition with a bound generous for a loaded machine: the jobs' start
# (child's wait_for_workers), then the child's cleanup (cancel, scheduler close) at its end
@pytest.mark.timeout(240)
@pytest.mark.parametrize("batch,how", [
    # SIGTERM on every system; the other ways end in the same cleanup code: once
    pytest.param("slurm", "sigterm", marks=pytest.mark.slurm),
    pytest.param("sge", "sigterm", marks=pytest.mark.sge), ("pbs", "sigterm"), ("lsf", "sigterm"),
    *(pytest.param("slurm", how, marks=pytest.mark.slurm) for how in ("sigint", "exit", "gc")),
], indirect=["batch"])
def test_client_process_ending_leaves_no_job(batch, how):
    """SIGTERM, Ctrl-C, a plain exit without close(), garbage collection: jobs are cancelled."""
    code = textwrap.dedent(f"""
        import gc, sys, time
        from hpcsched.core import config
        from hpcsched.jobqueue.clusters import {CLASSES[batch.system].__name__} as C
        with config.set({{"jobqueue.poll-interval": 0.2}}):
            c = C(cores=1, memory="300MB", walltime="00:10:00", log_directory={str(batch.log_dir)!r})
            c.scale(jobs=2)
            print(" ".join(c.jobs), flush=True)
            c.wait_for_workers(2, timeout=120)
            print("ready", flush=True)
            if {how!r} == "gc":
                del c
                gc.collect()
                print("collected", flush=True)
            if {how!r} in ("sigterm", "sigint"):
                time.sleep(120)
    """)
    proc = subprocess.Popen(interruptible([sys.executable, "-c", code]), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=batch.env, cwd=ROOT)
    try:
        ids = {numeric(j) for j in proc.stdout.readline().split()}
        batch.ids |= ids
        assert len(ids) == 2, proc.stderr.read() if proc.poll() is not None else "no job ids"
        assert proc.stdout.readline().strip() == "ready"
        assert ids <= unfinished(batch.system, batch.env)
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == -signal.SIGTERM  # still dies of SIGTERM after cleanup
        elif how == "sigint":  # KeyboardInterrupt ends the script: cancelled at exit
            proc.send_signal(signal.SIGINT)
            assert proc.wait(60) == -signal.SIGINT  # Python re-raises it after finalizing
            assert "KeyboardInterrupt" in proc.stderr.read()
        elif how == "gc":
            assert proc.stdout.readline().strip() == "collected"
            batch.assert_queue_empty(ids)  # before the process exits
            assert proc.wait(60) == 0
        else:
            assert proc.wait(60) == 0
        batch.assert_queue_empty(ids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.timeout(90)
def test_submit_that_errors_raises_and_submits_nothing(batch):
    bad = {"slurm": ["-p nosuchpartition"], "sge": ["-q nosuchqueue"],
           "pbs": ["-q nosuchqueue"], "lsf": ["-q nosuchqueue"]}[batch.system]
    c = batch.cluster(job_extra_directives=bad)
    with pytest.raises(BatchCommandError, match="exit status"):
        c.scale(jobs=1)
    assert c.jobs == {}


@pytest.mark.timeout(60)
def test_missing_submit_command_raises_at_submission_not_for_a_script(batch, monkeypatch,
                                                                       tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    exe = CLASSES[batch.system].system_class.submit_command[0]
    c = batch.cluster()
    assert c.job_script().startswith("#!")  # printing a script needs no batch command
    with pytest.raises(FileNotFoundError, match=f"{exe} not found on PATH"):
        c.scale(jobs=1)
    assert c.jobs == {}


@pytest.mark.timeout(60)
def test_hanging_status_command_times_out(batch, tmp_path, monkeypatch):
    c = batch.cluster()
    c.scale(jobs=1)
    batch.record(c)
    hang = tmp_path / "hang-bin"
    hang.mkdir()
    status_cmd = c.system.status_command(["1"])[0]
    (hang / status_cmd).write_text("#!/bin/sh\nsleep 300\n")
    (hang / status_cmd).chmod(0o755)
    monkeypatch.setenv("PATH", f"{hang}{os.pathsep}{os.environ['PATH']}")
    with config.set({"jobqueue.command-timeout": 1}):
        t0 = time.monotonic()
        with pytest.raises(BatchCommandTimeout, match=f"{status_cmd}.*did not finish within 1 s"):
            c.poll()
        assert time.monotonic() - t0 < 10
    monkeypatch.setenv("PATH", batch.env["PATH"])
    c.close()  # cancelling still works


@pytest.mark.timeout(90)
@pytest.mark.parametrize("batch", [pytest.param("slurm", marks=pytest.mark.slurm)], indirect=True)
def test_job_whose_workers_retired_is_replaced_while_the_target_asks(batch):
    """Cluster logic, the same on every system: run once."""
    c = batch.cluster()
    c.scale(jobs=1)
    c.wait_for_workers(1, timeout=60)
    (first,) = list(c.jobs)
    name = next(iter(c.workers.values()))["name"]
    c.scheduler.retire_workers(names=[name])  # as at walltime: the worker leaves, the job ends
    wait_for(lambda: len(c.jobs) == 2, 30, "a replacement job")
    c.wait_for_workers(1, timeout=60)
    batch.record(c)
    assert c.jobs[first].ended and not c.failed_jobs


def scontrol_job(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s ``Key=Value`` fields of one job."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("batch", [pytest.param("slurm", marks=pytest.mark.slurm)], indirect=True)
def test_dask_config_set_sizes_the_jobs_submitted(batch, reread_dask_config):
    """A notebook's dask-jobqueue setup: ``dask.config.set`` first, then ``SLURMCluster()``
    with no sizes; the jobs SLURM holds are of the configured cores and memory."""
    import dask.config

    from hpcsched.core.client.client import Client

    dask.config.set({"jobqueue.slurm.cores": 2, "jobqueue.slurm.memory": "2GB"})
    c = batch.cluster(cores=None, memory=None)
    c.scale(jobs=1)
    (job_id,) = batch.record(c)
    job = scontrol_job(job_id)
    assert (job["NumCPUs"], job["MinMemoryNode"]) == ("2", "2G")  # 2 GB rounded up to GiB
    c.wait_for_workers(2, timeout=60)  # cores=2: 2 worker processes of 1 thread
    with Client(c) as client:
        assert sum(client.gather(client.map(lambda x: x * 2, range(10)))) == 90
    c.close()
    with dask.config.set({"jobqueue.slurm.cores": 1, "jobqueue.slurm.memory": "1GB"}):
        c = batch.cluster(cores=None, memory=None)
        c.scale(jobs=1)
        (job_id,) = batch.record(c)
    job = scontrol_job(job_id)
    assert (job["NumCPUs"], job["MinMemoryNode"]) == ("1", "954M")
    c.wait_for_workers(1, timeout=60)
    c.close()


@pytest.mark.parametrize("batch", ["pbs", "lsf"], indirect=True)
def test_scale_down_cancels_pending_jobs_first(batch, monkeypatch):
    """Needs a queue that keeps jobs pending: the emulators' max-running knob."""
    monkeypatch.setenv("HPCSCHED_EMU_MAX_RUNNING", "1")
    c = batch.cluster()
    c.scale(jobs=3)
    batch.record(c)
    c.wait_for_workers(1, timeout=60)
    wait_for(lambda: (c.poll() or True) and sorted(j.state.value for j in c.jobs.values())
             == ["pending", "pending", "running"], 30, "1 running and 2 pending jobs")
    (running,) = [j for j in c.jobs.values() if j.state is JobState.RUNNING]
    c.scale(jobs=1)
    assert [j.job_id for j in c.jobs.values() if j.active] == [running.job_id]
    pending_ids = {numeric(j.job_id) for j in c.jobs.values() if j is not running}
    batch.assert_queue_empty(pending_ids)
    assert numeric(running.job_id) in unfinished(batch.system, batch.env)
    assert len(c.workers) == 1


def test_scheduler_listens_on_the_interface_asked_for(batch):
    c = batch.cluster(interface="lo")
    assert c.scheduler_address.startswith("tcp://127.0.0.1:")
    assert f" {c.scheduler_address} " in c.job_script()
    c.close()
    c2 = batch.cluster(scheduler_options={"host": "127.0.0.1", "port": 0})
    assert c2.scheduler_address.startswith("tcp://127.0.0.1:")
    with pytest.raises(ValueError, match="interface='nosuch0' not found on this host; available: .*lo"):
        batch.cluster(interface="nosuch0")


@pytest.mark.parametrize("batch", [pytest.param("slurm", marks=pytest.mark.slurm), "pbs"],
                         indirect=True)
@pytest.mark.timeout(120)
def test_adaptive_grows_with_work_and_shrinks_to_the_minimum(batch, road):
    from hpcsched.core.client.client import Client

    c = batch.cluster()
    with config.set({"adaptive.interval": 0.3, "adaptive.wait-count": 2,
                     "adaptive.target-duration": 1.0}):
        adaptive = c.adapt(minimum=1, maximum=2)
        c.wait_for_workers(1, timeout=60)
        with Client(c) as client:
            futures = road.calls(client, lambda x: (time.sleep(0.3), x)[1], 40)
            wait_for(lambda: len(c.jobs) == 2, 30, "adaptive to submit a second job")
            assert sum(client.gather(futures)) == sum(range(40))
        wait_for(lambda: sum(j.active for j in c.jobs.values()) == 1, 60,
                 "adaptive to retire the idle job down to the minimum")
        adaptive.stop()
    batch.record(c)
    assert len(c.jobs) == 2 and not c.failed_jobs


def _users_venv(path: Path) -> Path:
    """A virtual environment at ``path`` that sees this interpreter's packages.

    A real one: Python finds its environment from the ``pyvenv.cfg`` beside or above the
    executable it was started as, so a bare link to ``sys.executable`` elsewhere loses the
    packages of a venv that runs these tests. A ``.pth`` file adds this interpreter's site
    directories (their own ``.pth`` files processed too, as ``site.addsitedir`` does).
    """
    import site

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   capture_output=True, timeout=60)
    purelib = subprocess.run([str(path / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    (Path(purelib) / "_outer_site.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
    return path


def _where_am_i() -> tuple[str, str, str]:
    """Run on a worker: the interpreter, the working (local) directory, the job's TMPDIR."""
    import os
    import sys

    return sys.executable, os.getcwd(), os.environ.get("TMPDIR", "")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batch", [pytest.param("slurm", marks=pytest.mark.slurm),
                                   pytest.param("sge", marks=pytest.mark.sge),
                                   pytest.param("torque", marks=pytest.mark.slurm)],
                         indirect=True)
def test_the_jobs_shell_expands_the_users_variables(batch, tmp_path):
    """dask-jobqueue's habit: settings with $VARS, expanded where the job runs; a path
    with a space stays one path."""
    from hpcsched.core.client.client import Client

    venv = _users_venv(tmp_path / "my env")
    fallback_tmp = tmp_path / "job tmp"
    c = batch.cluster(
        python="$SOMEVAR/bin/python", local_directory="$TMPDIR/${WORKDIR_NAME}",
        job_script_prologue=[f"export SOMEVAR='{venv}'", "export WORKDIR_NAME=w",
                             # Grid Engine gives each job a TMPDIR; SLURM may not
                             f"export TMPDIR=\"${{TMPDIR:-{fallback_tmp}}}\"",
                             f"export PYTHONPATH='{ROOT}'"])
    script = c.job_script()
    assert 'exec "$SOMEVAR/bin/python" ' in script
    assert '--local-directory "$TMPDIR/${WORKDIR_NAME}"' in script
    c.scale(jobs=1)
    batch.record(c)
    c.wait_for_workers(1, timeout=60)
    with Client(c) as client:
        executable, cwd, tmpdir = client.submit(_where_am_i).result(timeout=30)
    assert executable == str(venv / "bin" / "python")
    assert tmpdir and "$" not in tmpdir
    assert cwd == os.path.join(tmpdir, "w")
    c.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batch", [pytest.param("torque", marks=pytest.mark.slurm)],
                         indirect=True)
def test_pbs_cluster_over_the_torque_wrappers(batch):
    """PBSCluster against a second implementation of qsub/qstat/qdel: SchedMD's wrappers
    (no JSON qstat, no exit status, own -o/-e unless told): scale, compute, scale down."""
    from hpcsched.core.client.client import Client

    c = batch.cluster(cores=2, processes=2, memory="600MB")
    c.scale(jobs=2)
    ids = batch.record(c)
    assert len(ids) == 2
    c.wait_for_workers(4, timeout=60)
    assert c.observed == c.plan == c.requested and len(c.observed) == 4
    with Client(c) as client:
        assert sum(client.gather(client.map(lambda x: x + 1, range(8)))) == 36
    logs = c.get_logs()
    assert "submitted PBSCluster" in logs["Cluster"]
    assert set(logs) == {"Cluster", *(j.name for j in c.jobs.values())}
    c.scale(jobs=1)
    wait_for(lambda: len(c.workers) == 2, 30, "one job's workers to leave")
    c.poll()
    assert c.system._text_qstat  # it found out that this qstat has no JSON
    c.scale(0)
    batch.assert_queue_empty(ids)
    assert not c.failed_jobs


def pbs_job_name(batch: Batch, job_id: str) -> str:
    out = run_command(["qstat", "-x", "-f", "-F", "json", job_id], batch.env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["Jobs"][job_id]["Job_Name"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("batch", ["pbs"], indirect=True)
def test_pbs_job_directives_skip_and_extra_directives_name_the_job(batch):
    """dask-jobqueue's ``job_directives_skip=["-N"]`` and ``job_extra_directives=["-N
    ..."]``, as qsub sees them: the script's directives are all it is given."""
    c = batch.cluster(job_name="foobar", job_extra_directives=["-N myjob"])
    c.scale(jobs=1)
    batch.record(c)
    (job_id,) = c.jobs
    assert pbs_job_name(batch, job_id) == "myjob"  # the later directive wins, as in qsub
    c.wait_for_workers(1, timeout=60)  # the job's name is not how its worker is known
    c.close()
    c = batch.cluster(job_name="foobar", job_directives_skip=["-N"])
    assert "#PBS -N" not in c.job_script()
    c.scale(jobs=1)
    batch.record(c)
    ((job_id, job),) = c.jobs.items()
    assert pbs_job_name(batch, job_id) == f"{job.name}.sh"  # qsub's default: the script's name
    c.wait_for_workers(1, timeout=60)
    c.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("batch", ["pbs"], indirect=True)
def test_worker_command_module_and_epilogue_run_in_the_job(batch, tmp_path):
    """A site's own worker module (``worker_command``) that starts hpcsched's worker, and a
    ``job_script_epilogue`` that runs once the worker has left: both in a real job."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "site_worker.py").write_text(textwrap.dedent("""\
        import os, sys
        from hpcsched.launchers.cli import worker_main
        os.environ["SITE_PREPARED"] = "1"
        sys.exit(worker_main(sys.argv[1:]))
        """))
    mark = tmp_path / "epilogue-ran"
    c = batch.cluster(worker_command="site_worker",
                      job_script_prologue=[f"export PYTHONPATH={mods}"],
                      job_script_epilogue=[f"echo $worker_status > {mark}"])
    c.scale(jobs=1)
    batch.record(c)
    c.wait_for_workers(1, timeout=60)
    from hpcsched.core.client.client import Client

    with Client(c) as client:
        assert client.run(lambda: os.environ.get("SITE_PREPARED")) == {
            w: "1" for w in c.workers}
    name = next(iter(c.workers.values()))["name"]
    c.scheduler.retire_workers(names=[name])  # as at walltime: the worker leaves
    wait_for(mark.exists, 30, "the epilogue to run")
    assert mark.read_text() == "0\n"  # the worker's own status, seen by the epilogue


class CountingRunner:
    """The real batch commands, with the time of each submission recorded."""

    def __init__(self, submit: str):
        from hpcsched.jobqueue import runner

        self.submit, self.run, self.times = submit, runner.run_command, []

    def __call__(self, cmd, **kwargs):
        if os.path.basename(cmd[0]) == self.submit:
            self.times.append(time.monotonic())
        return self.run(cmd, **kwargs)


BACKOFF = {"jobqueue.submit-retry-delays": ["1s", "2s"], "jobqueue.submit-pause-after": 4,
           "jobqueue.dead-jobs-pause-after": 2}


@pytest.mark.timeout(90)
def test_adapt_with_a_submission_that_always_fails_backs_off_and_pauses(batch):
    """``adapt()`` against a queue that does not exist: submissions 1 s, then 2 s apart
    (a short schedule; the default's figures are in test_submissions.py), none after
    the fourth, the error in the repr, the widget and the scheduler's events."""
    with config.set(BACKOFF):
        c = batch.cluster(queue="nosuchpartition")
    counter = CountingRunner(c.system.submit_command[0])
    c.system.run_command = counter
    adaptive = c.adapt(minimum=1, maximum=3, interval=0.2)
    wait_for(lambda: c.backoff.paused, 30, "submissions to pause")
    paused_at = time.monotonic()
    times = list(counter.times)
    assert len(times) == 4, times
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.8 and gaps[2] >= 1.8, gaps
    # adaptive keeps asking every 0.2 s; nothing is submitted while paused
    wait_for(lambda: time.monotonic() - paused_at > 3 and adaptive.log, 10, "3 s of pause")
    assert len(counter.times) == 4 and c.jobs == {}
    error = c.backoff.last_error.strip().splitlines()[-1]
    assert "exit status" in c.backoff.last_error and error
    assert "4 failed submissions in a row (submissions paused" in repr(c)
    assert error in repr(c)
    html = c._repr_html_()
    assert "Problem" in html and "submissions paused" in html
    events = [what for _, topic, what in list(c.scheduler.state.recorder.events)
              if topic == "jobqueue"]
    assert len(events) == 4 and all("submission failed" in e for e in events), events
    # adaptive asked for the same growth all along: one entry, not one a second
    assert [d.action for d in adaptive.log].count("up") == 1, list(map(str, adaptive.log))
    # the user asks again: one submission at once, failing again
    adaptive.stop()
    with pytest.raises(BatchCommandError):
        c.scale(jobs=1)
    assert len(counter.times) == 5 and c.backoff.failures == 1 and not c.backoff.paused


@pytest.mark.timeout(120)
def test_adapt_with_jobs_that_die_before_a_worker_connects_pauses(batch):
    with config.set(BACKOFF):
        c = batch.cluster(job_script_prologue=["echo 'no python here' >&2", "exit 3"])
    c.adapt(minimum=1, maximum=1, interval=0.2)
    wait_for(lambda: c.backoff.paused, 90, "submissions to pause after 2 dead jobs")
    batch.record(c)
    assert len(c.failed_jobs) == 2 and len(c.jobs) == 2
    assert "2 jobs ended before a worker connected in a row" in repr(c)
    assert "no python here" in c.backoff.last_error
    time.sleep(3 * config.get("jobqueue.poll-interval"))  # adaptive keeps asking: no job
    assert len(c.jobs) == 2


@pytest.mark.timeout(90)
def test_workers_that_cannot_connect_are_reported_within_the_connect_timeout(batch):
    with config.set({"jobqueue.connect-timeout": 3}):
        c = batch.cluster(death_timeout=60)
    c.scheduler_address = "tcp://127.0.0.1:9"  # nothing listens there
    c.scale(jobs=1)
    batch.record(c)
    t0 = time.monotonic()
    with pytest.raises(SchedulerUnreachableError) as info:
        c.wait_for_workers(1, timeout=60)
    assert time.monotonic() - t0 < 45
    msg = str(info.value)
    assert "cannot reach the scheduler at tcp://127.0.0.1:9" in msg
    assert "This host's interfaces: " in msg and "lo 127.0.0.1" in msg
    assert "scheduler_options={'interface': '<name>'}" in msg
    assert "(chosen as " in msg
    assert "cannot reach the scheduler" in repr(c)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("batch", [pytest.param("slurm", marks=pytest.mark.slurm)],
                         indirect=True)
def test_a_slurm_worker_knows_its_jobs_end_from_scontrol_when_the_environment_is_silent(batch):
    """SLURM before 23.02 (22.05 here) puts no SLURM_JOB_END_TIME in a job's environment:
    the worker asks ``scontrol show job`` once as it starts, and its end (which the
    scheduler's placement reads) is the job's EndTime. (No walltime margin: the workers'
    ``--lifetime`` is then the whole walltime, counted from their later start, and the
    job's end comes first.)"""
    with config.set({"worker.walltime-margin": 0, "worker.walltime-stagger": 0}):
        c = batch.cluster(walltime="00:07:00")
        assert "--lifetime 420 " in c.job_script()
        c.scale(jobs=1)
        (job_id,) = batch.record(c)
        c.wait_for_workers(1, timeout=90)
        (info,) = c.workers.values()
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                             text=True, timeout=30, check=True).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        end = time.mktime(time.strptime(fields["EndTime"], "%Y-%m-%dT%H:%M:%S"))
        assert info.get("lifetime_end") == end, (info, fields["EndTime"])
        start = time.mktime(time.strptime(fields["StartTime"], "%Y-%m-%dT%H:%M:%S"))
        assert end - start == 7 * 60
