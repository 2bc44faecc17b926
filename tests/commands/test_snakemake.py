"""The Snakemake executor plugin (plugins/snakemake-executor-plugin-hpcsched) with a
real Snakemake: a workflow's jobs run as tasks of a running hpcsched cluster, each in a
fork of a Python with Snakemake loaded (the default) or as a ``python -m snakemake``
command task (``--hpcsched-fresh-process``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from hpcsched import Client
from hpcsched.commands.run import CommandFailed
from tests.conftest import wait_until
from tests.launchers.procs import WORKER_OPTS, Procs, hpcsched_cmd, start_scheduler

pytest.importorskip("snakemake")
pytest.importorskip("snakemake_executor_plugin_hpcsched",
                    reason="pip install ./plugins/snakemake-executor-plugin-hpcsched")
pytestmark = pytest.mark.timeout(600)

SNAKEFILE = textwrap.dedent("""
    N = int(config.get("count", 10))

    rule all:
        input: expand("out/{i}.txt", i=range(N)), "sum.txt"

    rule make:
        output: "out/{i}.txt"
        shell: "echo $(( {wildcards.i} * 2 )) > {output}"

    rule total:
        input: expand("out/{i}.txt", i=range(N))
        output: "sum.txt"
        shell: "cat {input} | awk '{{s += $1}} END {{print s}}' > {output}"
""")


def snakemake(workdir: Path, sfile: Path, *extra: str) -> subprocess.CompletedProcess:
    exe = shutil.which("snakemake", path=os.path.dirname(sys.executable)) or "snakemake"
    return subprocess.run([exe, "--executor", "hpcsched", "--hpcsched-scheduler-file",
                           str(sfile), "--jobs", "20", *extra], cwd=workdir,
                          capture_output=True, text=True, timeout=540,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def cluster(procs: Procs, tmp_path: Path) -> Path:
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    procs.start([*hpcsched_cmd(), "worker", "--scheduler-file", str(sfile), *WORKER_OPTS,
                 "--nworkers", "2"], "workers")
    return sfile


@pytest.mark.parametrize("mode", [[], ["--hpcsched-fresh-process"]], ids=["fork", "fresh"])
def test_a_workflow_runs_its_jobs_as_tasks(cluster, tmp_path, mode):
    work = tmp_path / "wf"
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)
    done = snakemake(work, cluster, "--config", "count=12", *mode)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [int((work / "out" / f"{i}.txt").read_text()) for i in range(12)] == \
        [2 * i for i in range(12)]
    assert int((work / "sum.txt").read_text()) == sum(2 * i for i in range(12))
    logs = list((work / ".snakemake" / "hpcsched" / "make").glob("*.log"))
    assert len(logs) == 12  # one command task per job, each with its log


def test_a_failing_rule_fails_the_workflow_and_names_its_log(cluster, tmp_path):
    work = tmp_path / "wf"
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE.replace(
        'shell: "echo $(( {wildcards.i} * 2 )) > {output}"',
        'shell: "test {wildcards.i} != 3 && echo {wildcards.i} > {output}"'))
    done = snakemake(work, cluster, "--config", "count=5")
    assert done.returncode != 0
    assert "hpcsched task" in done.stderr and ".snakemake/hpcsched/make/" in done.stderr


SLEEPER = textwrap.dedent("""
    rule all:
        input: "done.txt"

    rule sleeper:
        output: "done.txt"
        shell: "sleep 300 & echo $! > pid; wait; touch {output}"
""")


def _sleeping_job(client: Client, work: Path):
    """A Snakemake job as the plugin submits it, whose rule sleeps; and the sleep's pid."""
    from snakemake_executor_plugin_hpcsched.preloaded import run_job

    work.mkdir()
    (work / "Snakefile").write_text(SLEEPER)
    future = client.submit(run_job, ["--snakefile", str(work / "Snakefile"), "--cores", "1",
                                     "--nolock"], str(work), {}, str(work / "job.log"),
                           pure=False)
    pid = wait_until(lambda: _pid_in(work / "pid"), timeout=120, what="the rule to start")
    return future, pid


def _pid_in(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_cancelling_a_forked_job_kills_its_rule(cluster, tmp_path):
    with Client(scheduler_file=str(cluster)) as client:
        future, pid = _sleeping_job(client, tmp_path / "wf")
        assert _alive(pid)
        future.cancel()
        wait_until(lambda: not _alive(pid), timeout=30, what="the cancelled job's rule to end")
        assert not (tmp_path / "wf" / "done.txt").exists()


def test_a_workers_death_ends_its_forked_jobs(cluster, tmp_path):
    with Client(scheduler_file=str(cluster)) as client:
        future, pid = _sleeping_job(client, tmp_path / "wf")
        workers = set(client.run(os.getpid).values())
        (runner,) = [p.pid for p in psutil.Process(pid).parents() if p.pid in workers]
        os.kill(runner, signal.SIGKILL)
        wait_until(lambda: not _alive(pid), timeout=30, what="the dead worker's job to end")


def test_a_failing_forked_job_names_its_log_and_quotes_it(cluster, tmp_path):
    from snakemake_executor_plugin_hpcsched.preloaded import run_job

    with Client(scheduler_file=str(cluster)) as client:
        future = client.submit(run_job, ["--snakefile", str(tmp_path / "missing"), "--cores",
                                         "1"], str(tmp_path), {}, str(tmp_path / "job.log"),
                               pure=False)
        with pytest.raises(CommandFailed) as e:
            future.result(timeout=120)
        assert e.value.returncode == 1 and e.value.stderr_path == str(tmp_path / "job.log")
        assert "missing" in str(e.value)
