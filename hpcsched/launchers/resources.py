"""What this process may use: threads, memory, GPUs, job identity and walltime.

:func:`detect` reads the batch job's environment, shares the node's CPUs and memory
among the ranks placed on the node, and falls back to what the machine shows (CPU
affinity, :func:`machine_memory`). What a batch system puts in a job's environment (its
job-id variable, cores and memory, the walltime's end) is known by that system's module
in :mod:`hpcsched.jobqueue.systems`, reached through the seam ``batch-job``
(:mod:`hpcsched.core.seams`): it answers with a :class:`JobEnvironment`.
It is pure apart from reading ``os.environ`` and psutil, and takes the
environment as an argument so every batch system is tested with a mapping.

How many ranks share the node (``local_size``), first found wins:

1. the ``local_size`` argument;
2. an MPI communicator given as ``comm``: ``Split_type(COMM_TYPE_SHARED)``.
   That is a collective call: every rank of ``comm`` must call ``detect`` at
   the same time (MPICH spins while waiting), so it is only used when asked;
3. the launcher's environment: ``MPI_LOCALNRANKS`` (MPICH hydra),
   ``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI), ``PMIX_LOCAL_SIZE``,
   ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_NTASKS_PER_NODE`` /
   ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"`` indexed by ``SLURM_NODEID``);
4. otherwise 1.

GPUs (:func:`detect_gpus`): the environment first (``CUDA_VISIBLE_DEVICES`` and the
other vendors', SLURM's GPU variables), else ``nvidia-smi -L``; the rules are those of
:func:`hpcsched.core.worker.tasks.gpus.find`.

Sizes are read by :func:`hpcsched.core.units.parse_bytes`; batch systems' own
memory variables (SLURM_MEM_PER_NODE, in megabytes) follow their own
conventions and are read by their own modules.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from typing import Any

from hpcsched.core import seams
from hpcsched.core.protocol.records import Record
from hpcsched.core.units import memory_limit_bytes, parse_memory_limit
from hpcsched.core.worker.tasks.gpus import Gpus, find

#: seconds ``nvidia-smi -L`` may take (a hung driver must not keep a worker from starting)
NVIDIA_SMI_TIMEOUT = 20.0


class Resources(Record):
    """What one rank (process) may use, and what is known of its job."""

    nthreads: int
    memory_limit: int  # bytes
    hostname: str
    batch_system: str | None = None  # "slurm", "pbs", ...: JobEnvironment.system
    job_id: str | None = None
    walltime_end: float | None = None  # epoch seconds when the job's walltime ends
    rank: int | None = None
    local_rank: int | None = None
    local_size: int = 1  # ranks sharing this node
    node_cpus: int | None = None  # CPUs of the node given to the job (all local ranks)
    node_memory: int | None = None  # bytes of the node given to the job


class JobEnvironment(Record):
    """What a batch job tells the processes inside it through their environment.

    Each batch system's module reads its own variables into one
    (:meth:`hpcsched.jobqueue.base.BatchSystem.in_job`); ``None`` is "not said".
    """

    system: str  # the batch system's name, as its configuration section: "slurm", ...
    job_id: str
    node_cpus: int | None = None  # CPUs of this node given to the job
    node_memory: int | None = None  # bytes of this node given to the job
    cpus_per_rank: int | None = None  # CPUs given to each task (SLURM's --cpus-per-task)
    memory_per_cpu: int | None = None  # bytes per CPU (SLURM's --mem-per-cpu)
    walltime_end: float | None = None  # epoch seconds when the walltime ends


def batch_job(env: Mapping[str, str] | None = None,
              hostname: str | None = None) -> JobEnvironment | None:
    """The batch job this process runs in, read from ``env`` (``os.environ``), or None."""
    env = os.environ if env is None else env
    detect_job = seams.resolve("batch-job")
    return detect_job(env, hostname or socket.gethostname())


def job_end(job: JobEnvironment | None) -> float | None:
    """When ``job``'s walltime ends (epoch seconds), None when unknown (or no job): what its
    environment says, else what its batch system's commands say (the seam
    ``batch-job-end``, :func:`hpcsched.jobqueue.systems.job_end`), asked once at a start."""
    if job is None or job.walltime_end is not None:
        return None if job is None else job.walltime_end
    return seams.resolve("batch-job-end")(job)


# ------------------------------------------------------------------ env readers
def env_int(env: Mapping[str, str], name: str, minimum: int = 1) -> int | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        n = int(value.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    if n < minimum:
        raise ValueError(f"environment variable {name}={value!r} must be >= {minimum}")
    return n


def first_env_int(env: Mapping[str, str], names: tuple[str, ...],
                  minimum: int = 1) -> int | None:
    for name in names:
        n = env_int(env, name, minimum)
        if n is not None:
            return n
    return None


def slurm_tasks_on_node(text: str, node_index: int) -> int:
    """``"2(x3),1"`` (SLURM_TASKS_PER_NODE) -> tasks on node ``node_index``.

    >>> slurm_tasks_on_node("2(x3),1", 3), slurm_tasks_on_node("4", 0)
    (1, 4)
    """
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise ValueError(f"cannot read SLURM task layout {text!r} (expected e.g. '2(x3),1')")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if not counts:
        raise ValueError(f"empty SLURM task layout {text!r}")
    return counts[min(max(node_index, 0), len(counts) - 1)]


#: each MPI launcher's variables in a rank's environment: (world size, rank, ranks on
#: this node, rank on this node). SLURM's world size is an srun step's (a batch script's
#: own environment has SLURM_NTASKS and SLURM_PROCID=0 too: it is no launcher's rank).
LAUNCHERS = (
    ("PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID"),  # MPICH, Intel MPI, pmi2
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI
    ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
     "MV2_COMM_WORLD_LOCAL_RANK"),  # MVAPICH
    ("PMIX_SIZE", "PMIX_RANK", "PMIX_LOCAL_SIZE", "PMIX_LOCAL_RANK"),
    ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", None, "SLURM_LOCALID"),  # an srun step
)


def launcher_size(env: Mapping[str, str] = os.environ) -> int | None:
    """Number of processes the launcher says it started; None if no launcher is seen.

    0 means "a launcher is there but did not say how many" (ask MPI).
    """
    for size_var, rank_var, _, _ in LAUNCHERS:
        if size_var == "SLURM_STEP_NUM_TASKS" and not env.get("SLURM_STEP_ID"):
            continue  # a batch script's own environment, not an srun step
        value = env.get(size_var, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                raise RuntimeError(f"hpcsched: {size_var}={value!r} is not a number of "
                                   "processes") from None
        if env.get(rank_var, "").strip():
            return 0
    return None


def launcher_rank(env: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank when a launcher started several, else None."""
    try:
        if (launcher_size(env) or 0) < 2:
            return None
    except RuntimeError:
        return None
    return first_env_int(env, tuple(v[1] for v in LAUNCHERS), minimum=0)


def launcher_local_rank(env: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank among those the launcher started on its node, if it says."""
    return _rank_from_env(env)[1]


def _local_size_from_env(env: Mapping[str, str]) -> int | None:
    n = first_env_int(env, tuple(v[2] for v in LAUNCHERS if v[2]))
    if n is not None:
        return n
    node = env_int(env, "SLURM_NODEID", minimum=0) or 0
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(name, "").strip():
            return slurm_tasks_on_node(env[name], node)
    return None


def _rank_from_env(env: Mapping[str, str]) -> tuple[int | None, int | None]:
    rank = first_env_int(env, tuple(v[1] for v in LAUNCHERS), minimum=0)
    local = first_env_int(env, tuple(v[3] for v in LAUNCHERS), minimum=0)
    return rank, local


def _mpi_local(comm: Any) -> tuple[int, int, int]:
    """(rank, local rank, local size) from a communicator: collective over ``comm``."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return comm.Get_rank(), node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def _machine_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # honours cpusets (SLURM's task/cgroup, taskset)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_memory() -> int:
    """This machine's memory in bytes, or its control group's limit when lower.

    What a ``memory_limit`` fraction is of and is capped at
    (:func:`hpcsched.core.units.memory_limit_bytes`), as dask's ``system.MEMORY_LIMIT``.
    """
    # the kernel's total, as psutil.virtual_memory().total reads it, without importing
    # psutil on every rank of a job before its first task
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no such names on this platform
        import psutil

        total = int(psutil.virtual_memory().total)
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" means no limit
            total = min(total, int(text))
        break
    return total


def worker_memory_limit(memory_limit: Any, *, workers: int = 1, total: int | None = None,
                        machine: int | None = None) -> int:
    """The bytes each of ``workers`` workers started together may use (0: no limit) for a
    ``memory_limit`` as every entry point takes it (:func:`~hpcsched.core.units.parse_memory_limit`).

    ``"auto"`` gives each an equal share of ``total``, the memory of what they run in: by
    default this process's part of its machine or batch job (:func:`detect`). A fraction
    is of ``machine`` (by default :func:`machine_memory`), and no limit is above it.

    >>> gib = 2**30
    >>> worker_memory_limit("auto", workers=4, total=16 * gib, machine=16 * gib) // gib
    4
    >>> worker_memory_limit(0.5, machine=16 * gib) // gib, worker_memory_limit(None)
    (8, 0)
    """
    if machine is None:
        machine = machine_memory()
    share = 0
    if parse_memory_limit(memory_limit) == "auto":
        if total is None:
            total = detect().memory_limit
        share = total // max(workers, 1)
    return memory_limit_bytes(memory_limit, machine=machine, share=share)


def process_start() -> float:
    """When this process started (epoch seconds): about when its job did, for a worker."""
    import psutil

    return float(psutil.Process().create_time())


def detect(
    env: Mapping[str, str] | None = None,
    *,
    comm: Any = None,
    local_size: int | None = None,
    hostname: str | None = None,
) -> Resources:
    """The resources of this rank; see the module docstring for the rules.

    ``comm``: an MPI communicator to count the ranks on this node with (collective).
    """
    env = os.environ if env is None else env
    hostname = hostname or socket.gethostname()
    job = batch_job(env, hostname)
    rank, local_rank = _rank_from_env(env)
    if local_size is None and comm is not None:
        rank, local_rank, local_size = _mpi_local(comm)
    if local_size is None:
        local_size = _local_size_from_env(env) or 1
    if local_size < 1:
        raise ValueError(f"local_size must be >= 1, got {local_size}")

    node_cpus: int | None = None
    node_memory: int | None = None
    cpus_per_rank: int | None = None
    memory_per_rank: int | None = None
    if job is not None:
        cpus_per_rank, node_cpus, node_memory = job.cpus_per_rank, job.node_cpus, job.node_memory
        if job.memory_per_cpu is not None:
            threads = cpus_per_rank or max(1, (node_cpus or _machine_cpus()) // local_size)
            memory_per_rank = job.memory_per_cpu * threads

    if cpus_per_rank is None:
        cpus_per_rank = max(1, (node_cpus or _machine_cpus()) // local_size)
    if memory_per_rank is None:
        memory_per_rank = (node_memory or machine_memory()) // local_size
    return Resources(
        nthreads=cpus_per_rank,
        memory_limit=int(memory_per_rank),
        hostname=hostname,
        batch_system=job.system if job is not None else None,
        job_id=job.job_id if job is not None else None,
        walltime_end=job.walltime_end if job is not None else None,
        rank=rank,
        local_rank=local_rank,
        local_size=local_size,
        node_cpus=node_cpus,
        node_memory=node_memory,
    )


def detect_gpus(env: Mapping[str, str] | None = None) -> Gpus | None:
    """This process's GPUs (None: none known): from ``env`` (default ``os.environ``), else
    from ``nvidia-smi -L`` when it is on the ``PATH`` of ``env``."""
    import shutil

    env = os.environ if env is None else env
    gpus = find(env)
    if gpus is not None:
        return gpus
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return None
    import subprocess  # only here: every worker asks, and most nodes have no nvidia-smi

    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False,
                             timeout=NVIDIA_SMI_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return find(env, out.stdout) if out.returncode == 0 else None
