"""The Snakemake executor plugin (plugins/snakemake-executor-plugin-hpcsched) with a
real Snakemake: a workflow's jobs run as command tasks of a running hpcsched cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


def test_a_workflow_runs_its_jobs_as_command_tasks(cluster, tmp_path):
    work = tmp_path / "wf"
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)
    done = snakemake(work, cluster, "--config", "count=12")
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
