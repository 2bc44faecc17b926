"""Resource detection for each batch system, from environments given as mappings."""

from __future__ import annotations

import socket

import psutil
import pytest

from hpcsched.launchers import resources
from hpcsched.launchers.resources import (
    Resources,
    detect,
    slurm_tasks_on_node,
    worker_memory_limit,
)

GiB = 2**30
MiB = 2**20


@pytest.fixture
def machine(monkeypatch):
    """A fake machine: 16 usable CPUs, 64 GiB of memory, a process started at t=1000."""
    monkeypatch.setattr(resources, "_machine_cpus", lambda: 16)
    monkeypatch.setattr(resources, "machine_memory", lambda: 64 * GiB)
    monkeypatch.setattr(resources, "process_start", lambda: 1000.0)


def test_slurm_task_layout():
    assert [slurm_tasks_on_node("2(x3),1", i) for i in range(4)] == [2, 2, 2, 1]
    assert slurm_tasks_on_node("4", 0) == 4
    with pytest.raises(ValueError, match="SLURM task layout"):
        slurm_tasks_on_node("2(y3)", 0)


# ------------------------------------------------------------------ memory limits
def test_auto_is_each_workers_share_and_no_limit_is_above_the_machine(machine, monkeypatch):
    """What every entry point gives its workers (LocalCluster, ``hpcsched worker``, an MPI
    rank, a batch job's workers): ``"auto"`` splits what the process has (``detect``), or a
    total it names, among the workers it starts; a fraction is of the machine, not split."""
    monkeypatch.setattr(resources, "detect", lambda: Resources(
        nthreads=4, memory_limit=32 * GiB, hostname="node"))
    assert worker_memory_limit("auto") == 32 * GiB
    assert worker_memory_limit("auto", workers=4) == 8 * GiB
    assert worker_memory_limit("auto", workers=2, total=64 * GiB) == 32 * GiB
    assert worker_memory_limit(0.25, workers=4) == 16 * GiB
    assert worker_memory_limit("100GB") == 64 * GiB
    assert worker_memory_limit(None) == 0


# ------------------------------------------------------------------ no batch system
def test_plain_machine_uses_what_the_machine_shows(machine):
    r = detect({}, hostname="laptop")
    assert r == Resources(nthreads=16, memory_limit=64 * GiB, hostname="laptop", local_size=1)
    assert r.batch_system is None and r.job_id is None and r.walltime_end is None


def test_mpich_ranks_share_the_machine(machine):
    env = {"PMI_RANK": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}
    r = detect(env, hostname="vm")
    assert (r.rank, r.local_rank, r.local_size) == (3, 1, 4)
    assert r.nthreads == 4 and r.memory_limit == 16 * GiB


def test_open_mpi_environment(machine):
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "32"}
    r = detect(env)
    assert (r.rank, r.local_rank, r.local_size) == (5, 2, 32)
    assert r.nthreads == 1  # never 0, even with more ranks than CPUs
    assert r.memory_limit == 2 * GiB


def test_explicit_local_size_wins(machine):
    r = detect({"MPI_LOCALNRANKS": "4"}, local_size=2)
    assert r.local_size == 2 and r.nthreads == 8


def test_real_machine_without_batch_system(monkeypatch):
    r = detect({})
    assert r.hostname == socket.gethostname()
    assert 1 <= r.nthreads <= (psutil.cpu_count() or 1)
    assert 0 < r.memory_limit <= psutil.virtual_memory().total


# ------------------------------------------------------------------ SLURM
def test_slurm_cpus_per_task_and_memory_per_cpu(machine):
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_CPUS_PER_TASK": "6", "SLURM_CPUS_ON_NODE": "24",
        "SLURM_MEM_PER_CPU": "2000", "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "7",
        "SLURM_LOCALID": "3", "SLURM_JOB_END_TIME": "1700003600",
    }
    r = detect(env, hostname="node12")
    assert r.batch_system == "slurm" and r.job_id == "4242"
    assert r.nthreads == 6
    assert r.memory_limit == 6 * 2000 * MiB
    assert (r.rank, r.local_rank, r.local_size) == (7, 3, 4)
    assert r.walltime_end == 1700003600.0


def test_slurm_node_share_from_tasks_per_node(machine):
    env = {"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "32", "SLURM_MEM_PER_NODE": "128000",
           "SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_NODEID": "2"}
    r = detect(env)
    assert r.local_size == 2  # the third node holds 2 tasks
    assert r.nthreads == 16 and r.node_cpus == 32
    assert r.node_memory == 128000 * MiB and r.memory_limit == 64000 * MiB
    assert r.walltime_end is None


def test_slurm_memory_with_suffix_and_zero(machine):
    env = {"SLURM_JOB_ID": "1", "SLURM_MEM_PER_NODE": "8G", "SLURM_CPUS_ON_NODE": "2"}
    assert detect(env).memory_limit == 8 * GiB
    # 0 means the whole node: fall back to what the machine shows
    env["SLURM_MEM_PER_NODE"] = "0"
    assert detect(env).memory_limit == 64 * GiB


def test_mpi_launcher_beats_slurm_layout(machine):
    env = {"SLURM_JOB_ID": "1", "SLURM_CPUS_ON_NODE": "8", "SLURM_TASKS_PER_NODE": "1",
           "MPI_LOCALNRANKS": "4"}
    assert detect(env).nthreads == 2


@pytest.mark.parametrize(
    "name, value",
    [("SLURM_CPUS_PER_TASK", "many"), ("SLURM_CPUS_PER_TASK", "0"), ("SLURM_MEM_PER_NODE", "lots"),
     ("SLURM_JOB_END_TIME", "tomorrow")],
)
def test_slurm_garbage_names_the_variable(machine, name, value):
    with pytest.raises(ValueError, match=name):
        detect({"SLURM_JOB_ID": "1", name: value})


# ------------------------------------------------------------------ PBS / Torque
def test_torque(machine):
    env = {"PBS_JOBID": "123.pbs-server", "PBS_NUM_PPN": "12", "PBS_WALLTIME": "7200",
           "MPI_LOCALNRANKS": "3"}
    r = detect(env)
    assert r.batch_system == "pbs" and r.job_id == "123.pbs-server"
    assert r.node_cpus == 12 and r.nthreads == 4
    assert r.memory_limit == 64 * GiB // 3
    assert r.walltime_end == 1000.0 + 7200


def test_pbs_pro_ncpus_and_hms_walltime(machine):
    env = {"PBS_JOBID": "9.srv", "NCPUS": "8", "PBS_WALLTIME": "01:30:00"}
    r = detect(env)
    assert r.nthreads == 8
    assert r.walltime_end == 1000.0 + 5400


def test_pbs_bad_walltime(machine):
    with pytest.raises(ValueError, match="walltime"):
        detect({"PBS_JOBID": "1", "PBS_WALLTIME": "1:2:3:4"})


# ------------------------------------------------------------------ LSF
def test_lsf_slots_of_this_host(machine):
    env = {"LSB_JOBID": "555", "LSB_DJOB_NUMPROC": "12",
           "LSB_MCPU_HOSTS": "hostA.cluster 8 hostB.cluster 4"}
    r = detect(env, hostname="hostB")
    assert r.batch_system == "lsf" and r.job_id == "555"
    assert r.node_cpus == 4 and r.nthreads == 4
    # a host not in the list: the job's slot count
    assert detect(env, hostname="elsewhere").node_cpus == 12


def test_lsf_bad_host_list(machine):
    with pytest.raises(ValueError, match="LSB_MCPU_HOSTS"):
        detect({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "hostA 8 hostB"}, hostname="hostA")


# ------------------------------------------------------------------ SGE
def test_sge_array_task(machine):
    env = {"JOB_ID": "77", "SGE_TASK_ID": "5", "NSLOTS": "6", "SGE_ROOT": "/opt/sge"}
    r = detect(env)
    assert r.batch_system == "sge" and r.job_id == "77.5"
    assert r.nthreads == 6


def test_sge_plain_job(machine):
    r = detect({"JOB_ID": "78", "SGE_TASK_ID": "undefined", "NSLOTS": "2"})
    assert r.job_id == "78" and r.nthreads == 2


def test_job_id_alone_is_not_sge(machine):
    assert detect({"JOB_ID": "78"}).batch_system is None


def test_bad_local_size(machine):
    with pytest.raises(ValueError, match="MPI_LOCALNRANKS"):
        detect({"MPI_LOCALNRANKS": "0"})
    with pytest.raises(ValueError, match="local_size"):
        detect({}, local_size=0)
