"""Job templates on the real SLURM of this machine: a CPU -> GPU -> CPU pipeline under
``adapt()``, the GPU stage on jobs of a second template told apart by their job name.

The GPUs are stand-ins: the GPU template's job script puts a stand-in ``nvidia-smi`` on
PATH and sets ``CUDA_VISIBLE_DEVICES`` (its ``job_script_prologue``), as a site's GPU
partition would. The ``batch`` fixture cancels what a failing test leaves and checks
with ``squeue`` that none of the test's jobs is left.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import pytest

from hpcsched.core import config
from tests.jobqueue.batch import ROOT, unfinished, wait_for

pytestmark = pytest.mark.parametrize(
    "batch", [pytest.param("slurm", marks=pytest.mark.slurm)], indirect=True)

STAND_IN_SMI = """#!/bin/sh
echo "GPU 0: Stand-in GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)"
echo "GPU 1: Stand-in GPU (UUID: GPU-00000000-0000-0000-0000-000000000001)"
"""


def _cpu(x: int) -> tuple[int, str]:
    from hpcsched import get_worker

    return x + 1, get_worker().name


def _gpu(value: tuple[int, str]) -> tuple[int, str, tuple[str, ...]]:
    import time

    import hpcsched

    time.sleep(0.1)
    return value[0] * 10, hpcsched.get_worker().name, tuple(hpcsched.get_task_gpus())


def _cpu_after(value: tuple) -> tuple[int, str]:
    from hpcsched import get_worker

    return value[0] + 3, get_worker().name


def _gpu_jobs(c) -> list:
    return [j for j in c.jobs.values() if j.template == "gpu"]


def test_job_script_shows_each_template(batch, tmp_path):
    c = batch.cluster(job_templates={"gpu": dict(job_name="tplgpu", resources={"GPU": 2},
                                                 job_extra_directives=["--comment=gpu"])})
    gpu, cpu = c.job_script(template="gpu"), c.job_script()
    assert f"#SBATCH -J tplgpu-{c.cluster_id}-0" in gpu and "--resources GPU=2" in gpu
    assert "#SBATCH --comment=gpu" in gpu and "--comment" not in cpu
    assert f"#SBATCH -J hpcsched-{c.cluster_id}-0" in cpu and "--resources" not in cpu
    assert repr(c).endswith("jobs: default: none; gpu: none>")
    assert "default: none; gpu: none" in c._repr_html_()  # the notebook widget
    with pytest.raises(ValueError, match="no job template 'gpus'"):
        c.scale(jobs=1, template="gpus")


@pytest.mark.timeout(420)
def test_a_cpu_gpu_cpu_pipeline_grows_each_template_from_its_own_tasks(batch, road,
                                                                       tmp_path):
    from hpcsched.core.client.client import Client

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STAND_IN_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    c = batch.cluster(job_templates={"gpu": dict(
        job_name="tplgpu", resources={"GPU": 2},
        job_script_prologue=[f"export PATH={bin_dir}:$PATH",
                             "export CUDA_VISIBLE_DEVICES=0,1"])})
    cpu_prefix, gpu_prefix = f"hpcsched-{c.cluster_id}-", f"tplgpu-{c.cluster_id}-"
    with config.set({"adaptive.interval": 0.3, "adaptive.wait-count": 2,
                     "adaptive.target-duration": 1.0}):
        c.adapt(minimum=1, maximum=2, templates={"gpu": dict(maximum_jobs=1)})
        c.wait_for_workers(1, timeout=120)
        with Client(c) as client:
            # CPU stage: no GPU job is asked for while only CPU tasks wait
            first = road.calls(client, _cpu, 40)
            stage1 = client.gather(first)
            assert [v for v, _ in stage1] == list(range(1, 41))
            assert all(name.startswith(cpu_prefix) for _, name in stage1), stage1
            assert _gpu_jobs(c) == []
            # GPU stage: a GPU job comes for the GPU tasks, and runs them all
            gpu = [client.submit(_gpu, f, resources={"GPU": 1}, pure=False) for f in first]
            stage2 = client.gather(gpu)
            assert [v for v, _, _ in stage2] == [10 * i for i in range(1, 41)]
            assert all(name.startswith(gpu_prefix) for _, name, _ in stage2), stage2
            assert all(len(ids) == 1 and ids[0] in ("0", "1") for _, _, ids in stage2)
            assert len(_gpu_jobs(c)) == 1
            # CPU stage again: on CPU workers, while the GPU job is retired
            if road.name == "bulk":
                third = road.map(client, _cpu_after, stage2)
            else:
                third = [client.submit(_cpu_after, f, pure=False) for f in gpu]
            stage3 = client.gather(third)
            assert [v for v, _ in stage3] == [10 * i + 3 for i in range(1, 41)]
            assert all(name.startswith(cpu_prefix) for _, name in stage3), stage3
            wait_for(lambda: not any(j.active for j in _gpu_jobs(c)), 90,
                     "adaptive to retire the GPU job once no GPU task waits or runs")
            assert "gpu: " in c.job_summary()
        adaptive = c.adaptive
        assert any(d.reason.startswith("gpu: ") and d.action == "up" for d in adaptive.log)
        adaptive.stop()
    assert not c.failed_jobs
    started = time.monotonic()
    c.close()
    assert time.monotonic() - started < 60


OWNER = """
import sys
from hpcsched.core import config
from hpcsched.jobqueue.clusters import SLURMCluster

journal, logs, name = sys.argv[1:4]
with config.set({"jobqueue.poll-interval": 0.2}):
    cluster = SLURMCluster(cores=1, memory="300MB", walltime="00:10:00", log_directory=logs,
                           job_name=name, scheduler_journal=journal,
                           worker_extra_args=["--scheduler-reconnect-timeout", "120"],
                           job_templates={"gpu": dict(job_name=name + "gpu",
                                                      resources={"GPU": 1})})
cluster.scale(jobs=1)
cluster.scale(jobs=1, template="gpu")
cluster.wait_for_workers(2, timeout=150)
print("jobs", " ".join(sorted(f"{j.job_id}={j.template}" for j in cluster.jobs.values())),
      flush=True)
sys.exit(0)  # without close(): a journaled cluster leaves its jobs to a restart
"""


def _by_name(prefix: str) -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                         timeout=30).stdout
    return {ln.split()[0] for ln in out.splitlines()
            if len(ln.split()) == 2 and ln.split()[1].startswith(prefix)}


@pytest.mark.timeout(300)
def test_a_restarted_cluster_adopts_each_job_with_its_template(batch, tmp_path):
    """The process holding a journaled cluster with a GPU template ends without close();
    the same cluster made again with the same journal adopts both jobs, each with its
    template and its template's target: it submits and cancels nothing."""
    name = f"tpl{secrets.token_hex(3)}"
    journal = tmp_path / "journal"
    try:
        child = subprocess.run([sys.executable, "-c", OWNER, str(journal), str(batch.log_dir),
                                name], capture_output=True, text=True, timeout=200,
                               cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert child.returncode == 0, child.stdout + child.stderr
        line = next(ln for ln in child.stdout.splitlines() if ln.startswith("jobs "))
        first = dict(item.split("=") for item in line.split()[1:])
        assert sorted(first.values()) == ["default", "gpu"]
        assert set(first) <= unfinished("slurm")
        c = batch.cluster(job_name=name, scheduler_journal=str(journal),
                          job_templates={"gpu": dict(job_name=name + "gpu",
                                                     resources={"GPU": 1})})
        assert {j.job_id: j.template for j in c.jobs.values()} == first
        assert c.book.targets == {"default": 1, "gpu": 1}
        c.wait_for_workers(2, timeout=120)
        assert c.book.adjustments() == []
        assert {j.job_id for j in c.jobs.values()} == set(first)  # none submitted
        assert "default: 1 running; gpu: 1 running" in repr(c)
        batch.record(c)
    finally:
        left = _by_name(name)
        batch.ids |= left
        if left and not batch.clusters:
            subprocess.run(["scancel", *sorted(left)], capture_output=True, timeout=30)
