"""GPUs as devices, on an emulated machine: real worker processes whose ``PATH`` holds a
stand-in ``nvidia-smi`` (it prints ``GPU n: ... (UUID: ...)`` lines as NVIDIA's does), or
whose environment names the devices (``CUDA_VISIBLE_DEVICES``, ``SLURM_JOB_GPUS``).

A worker with four devices runs four one-GPU tasks at once, each seeing a different
device, in its code (``get_task_gpus``) and in the programs it starts (``task_env``); a
task asking for two sees two. Maps take the task road when they have ``resources=``
(bulk maps carry no restrictions), and that is checked too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import hpcsched
from hpcsched.core.client.client import Client
from hpcsched.launchers.resources import detect_gpus
from tests.conftest import _local_cluster, worker_env
from tests.launchers.procs import hpcsched_cmd, start_scheduler

FAKE_SMI = """#!/bin/sh
[ "$1" = "-L" ] || exit 2
i=0
while [ $i -lt {n} ]; do
  echo "GPU $i: Fake Tesla (UUID: GPU-0000000$i-feed-beef-cafe-00000000000$i)"
  i=$((i + 1))
done
"""

#: variables that would name devices before nvidia-smi is asked: the test machine's own
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
                 "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")


def fake_machine(tmp_path: Path, n: int) -> dict[str, str]:
    """The environment of a machine with ``n`` NVIDIA GPUs and nothing else telling of them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(n=n))
    smi.chmod(0o755)
    return {**worker_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def no_gpu_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in GPU_VARIABLES:
        monkeypatch.delenv(var, raising=False)


# ---------------------------------------------------------------- tasks the workers run
def what_i_see(tag: Any, rendezvous: str | None = None, n: int = 0) -> dict:
    """The devices this task holds, as its code and a program it starts see them; with a
    ``rendezvous`` directory, wait (bounded) until ``n`` tasks are in it at once."""
    start = time.monotonic()
    child = subprocess.run([sys.executable, "-c",
                            "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', '-'))"],
                           env=hpcsched.task_env(), capture_output=True, text=True, timeout=60,
                           check=True).stdout.strip()
    met = None
    if rendezvous:
        Path(rendezvous, str(tag)).touch()
        deadline = time.monotonic() + 60
        while len(os.listdir(rendezvous)) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        met = len(os.listdir(rendezvous)) >= n
    worker = hpcsched.get_worker()
    ids = hpcsched.get_task_gpus()
    return {"ids": ids, "child": child, "met": met, "start": start, "stop": time.monotonic(),
            "ordinals": [worker.gpus.ordinal(i) for i in ids] if worker.gpus else [],
            "process": os.environ.get("CUDA_VISIBLE_DEVICES", "-")}


# ---------------------------------------------------------------- the tests
@pytest.mark.timeout(180)
def test_four_devices_run_four_one_gpu_tasks_at_once_each_seeing_its_own(
        tmp_path: Path, no_gpu_variables: None):
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    with _local_cluster(n_workers=1, threads_per_worker=6,
                        worker_env=fake_machine(tmp_path, 4)) as cluster, \
            Client(cluster, set_as_default=False) as client:
        info = client.scheduler_info(timeout=30)["workers"]
        assert [w["resources"] for w in info.values()] == [{"GPU": 4}]
        assert [w["gpus"] for w in info.values()] == [["0", "1", "2", "3"]]
        futures = [client.submit(what_i_see, i, str(rendezvous), 4, resources={"GPU": 1},
                                 pure=False) for i in range(4)]
        seen = client.gather(futures, timeout=120)
        assert all(s["met"] for s in seen), "the four did not run at once"
        assert sorted(i for s in seen for i in s["ids"]) == ["0", "1", "2", "3"]
        for s in seen:
            assert len(s["ids"]) == 1 and s["child"] == s["ids"][0]
            assert s["ordinals"] == [int(s["ids"][0])]
            assert s["process"] == "-"  # the process's environment is every task's

        pair = client.submit(what_i_see, "pair", resources={"GPU": 2}, pure=False)
        s = pair.result(timeout=60)
        assert len(s["ids"]) == 2 and len(set(s["ids"])) == 2
        assert s["child"] == ",".join(s["ids"])

        plain = client.submit(what_i_see, "cpu", pure=False).result(timeout=60)
        assert plain["ids"] == [] and plain["child"] == ""  # asked for none: shown none


@pytest.mark.timeout(240)
def test_a_large_map_with_gpus_never_gives_one_device_to_two_tasks_at_once(
        tmp_path: Path, no_gpu_variables: None):
    """40 calls (above the bulk threshold): with ``resources=`` a map takes the task road;
    at any moment each device runs one call, and all four are used."""
    from hpcsched.core.client.graphs import BULK_MAP_MIN

    n = 40
    assert n > BULK_MAP_MIN
    with _local_cluster(n_workers=1, threads_per_worker=6,
                        worker_env=fake_machine(tmp_path, 4)) as cluster, \
            Client(cluster, set_as_default=False) as client:
        futures = client.map(what_i_see, range(n), resources={"GPU": 1}, pure=False)
        prefix = futures[0].key.rpartition("-")[0] + "-"
        assert not client.run_on_scheduler(
            lambda dask_scheduler: prefix in dask_scheduler.state.bulk.maps)
        seen = client.gather(futures, timeout=200)
    assert {i for s in seen for i in s["ids"]} == {"0", "1", "2", "3"}
    for s in seen:
        assert len(s["ids"]) == 1 and s["child"] == s["ids"][0]
    for a in seen:
        for b in seen:
            if a is not b and a["ids"] == b["ids"]:
                assert a["stop"] <= b["start"] or b["stop"] <= a["start"], (a, b)


@pytest.mark.timeout(120)
def test_a_worker_per_gpu_sees_its_own_device_alone(tmp_path: Path, procs: Any,
                                                    no_gpu_variables: None):
    """``hpcsched worker --worker-per-gpu`` on a machine whose SLURM job holds GPUs 1 and 3:
    two workers, each process's CUDA_VISIBLE_DEVICES its one device."""
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    procs.start([*hpcsched_cmd(), "worker", "--scheduler-file", str(sfile), "--worker-per-gpu",
                 "--nthreads", "1", "--memory-limit", "0", "--name", "g"], "workers",
                env={"SLURM_JOB_GPUS": "1,3"})
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
        workers = client.scheduler_info()["workers"]
        assert sorted(w["resources"]["GPU"] for w in workers.values()) == [1, 1]
        assert sorted(w["gpus"] for w in workers.values()) == [["1"], ["3"]]
        seen = {}
        for address in workers:
            s = client.submit(what_i_see, address, resources={"GPU": 1}, workers=[address],
                              pure=False).result(timeout=60)
            seen[address] = s
        assert sorted(s["process"] for s in seen.values()) == ["1", "3"]
        for s in seen.values():
            assert s["ids"] == [s["process"]] and s["child"] == s["process"]
            assert s["ordinals"] == [0]  # the process sees its one device as device 0


@pytest.mark.timeout(120)
def test_the_worker_processes_of_one_job_split_its_gpus(tmp_path: Path, procs: Any,
                                                        no_gpu_variables: None):
    """A GPU job's template of two worker processes (``--nworkers 2 --resources GPU=1``)
    on a node of two GPUs: each process is shown its own device, so that two one-GPU tasks
    never both run on device 0."""
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    procs.start([*hpcsched_cmd(), "worker", "--scheduler-file", str(sfile), "--nworkers", "2",
                 "--resources", "GPU=1", "--nthreads", "1", "--memory-limit", "0",
                 "--name", "job"], "workers", env={"CUDA_VISIBLE_DEVICES": "0,1"})
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
        workers = client.scheduler_info()["workers"]
        assert sorted(w["gpus"] for w in workers.values()) == [["0"], ["1"]]
        seen = client.gather([client.submit(what_i_see, a, resources={"GPU": 1}, workers=[a],
                                            pure=False) for a in workers], timeout=60)
        assert sorted(s["process"] for s in seen) == ["0", "1"]
        for s in seen:
            assert s["ids"] == [s["process"]] and s["child"] == s["process"]
    out = subprocess.run([*hpcsched_cmd(), "worker", "tcp://127.0.0.1:1", "--nworkers", "2",
                          "--resources", "GPU=2"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert out.returncode != 0 and "GPU=2 for each of 2 worker processes" in out.stderr


def test_detection_reads_the_environment_before_nvidia_smi(tmp_path: Path):
    env = fake_machine(tmp_path, 2)
    assert detect_gpus(env).ids == ("0", "1")
    assert detect_gpus({**env, "CUDA_VISIBLE_DEVICES": "3"}).ids == ("3",)
    amd = detect_gpus({**env, "ROCR_VISIBLE_DEVICES": "0,2"})
    assert (amd.ids, amd.variable) == (("0", "2"), "ROCR_VISIBLE_DEVICES")
    assert detect_gpus({**env, "ZE_AFFINITY_MASK": "0.0,0.1"}).ids == ("0.0", "0.1")
    assert detect_gpus({**env, "SLURM_STEP_GPUS": "2", "SLURM_JOB_GPUS": "2,3"}).ids == ("2",)
    assert detect_gpus({**env, "CUDA_VISIBLE_DEVICES": ""}).ids == ()
    assert detect_gpus({"PATH": str(tmp_path / "nowhere")}) is None


@pytest.mark.timeout(60)
def test_outside_a_task_the_calls_say_so():
    with pytest.raises(ValueError, match="inside a task"):
        hpcsched.get_task_gpus()
    with pytest.raises(ValueError, match="inside a task"):
        hpcsched.task_env()
