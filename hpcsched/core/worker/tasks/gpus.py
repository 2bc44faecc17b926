"""A worker's GPUs as devices: which it has, and what a task's code and programs see.

A worker advertises its GPUs as the resource ``GPU`` (one unit per device) together with
their ids; a task submitted with ``resources={"GPU": k}`` is given ``k`` distinct devices
for as long as it runs (:class:`~hpcsched.core.state.worker_state.WorkerState` hands them
out and takes them back when the task's thread ends, whether it finished, failed or was
cancelled).

Where the ids come from, first found wins (:func:`find`):

1. ``CUDA_VISIBLE_DEVICES`` (NVIDIA; SLURM sets it for ``--gres=gpu``), ``ROCR_VISIBLE_DEVICES``
   (AMD ROCm), ``ZE_AFFINITY_MASK`` (Intel Level Zero): what this process was given.
   An empty value, or SLURM's ``NoDevFiles``, means none;
2. ``SLURM_STEP_GPUS``, then ``SLURM_JOB_GPUS``: the GPUs SLURM allocated on this node;
3. ``nvidia-smi -L``: every NVIDIA GPU of the machine (its ``GPU 0: ...`` lines).

What a task sees. Tasks run in threads of one process, and a process's environment is
shared by its threads: setting ``CUDA_VISIBLE_DEVICES`` while one task runs would change
it under every other. So

* a program a task starts sees only its devices: :func:`task_env` is the environment
  to start it with (``subprocess.run(cmd, env=hpcsched.task_env())``), the vendor's
  variable set to the task's ids;
* code in the task asks which devices are its own: ``hpcsched.get_task_gpus()`` gives
  their ids, and ``get_worker().gpus.ordinal(id)`` the index a framework in this process
  (``torch.device("cuda", i)``, ``cupy.cuda.Device(i)``) knows it by, since the process
  sees the worker's devices in the order of its own variable;
* a worker per GPU (``hpcsched worker --worker-per-gpu``, or ``python -m hpcsched
  --worker-per-gpu`` under mpiexec, one by local rank) has its process's variable set to
  its one device before anything starts, so that every library sees that device alone.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from hpcsched.core.protocol.records import Record

logger = logging.getLogger("hpcsched.worker")

#: the variables a vendor's runtime reads to know which devices a process sees, in the
#: order they are looked at
VISIBLE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
#: SLURM's GPUs of this step, else of this job, on this node (ids as nvidia-smi numbers them)
SLURM_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
_NONE = ("", "nodevfiles", "none", "void")
_SMI_LINE = re.compile(r"^GPU (\d+):")


class Gpus(Record):
    """The GPUs a worker has: their ``ids``, the environment ``variable`` that tells a
    process which it sees, and where they were found (``source``, for the logs)."""

    ids: tuple[str, ...]
    variable: str = "CUDA_VISIBLE_DEVICES"
    source: str = ""

    def ordinal(self, device: str) -> int:
        """The index a library in this process gives ``device``.

        >>> Gpus(("4", "6")).ordinal("6")
        1
        """
        return self.ids.index(str(device))

    def env(self, ids: tuple[str, ...] | list[str]) -> dict[str, str]:
        """The variable that shows a process the devices ``ids`` alone.

        >>> Gpus(("0", "1"), "ROCR_VISIBLE_DEVICES").env(["1"])
        {'ROCR_VISIBLE_DEVICES': '1'}
        """
        return {self.variable: ",".join(ids)}

    def one(self, index: int) -> Gpus:
        """The ``index``-th device alone (a worker per GPU), modulo their number."""
        device = self.ids[index % len(self.ids)]
        return Gpus((device,), self.variable, f"{self.source}, one per worker")


def _ids(text: str) -> tuple[str, ...]:
    # SLURM_JOB_GPUS may be "0,1", and old SLURM versions wrote "gpu:0,gpu:1"
    return tuple(p.strip().rpartition(":")[2] if p.strip().startswith("gpu:") else p.strip()
                 for p in text.split(",") if p.strip())


def parse_nvidia_smi(text: str) -> tuple[str, ...]:
    """The device numbers of ``nvidia-smi -L``'s output.

    >>> parse_nvidia_smi("GPU 0: NVIDIA A100 (UUID: GPU-1a)\\nGPU 1: NVIDIA A100 (UUID: GPU-2b)")
    ('0', '1')
    """
    return tuple(m.group(1) for line in text.splitlines()
                 if (m := _SMI_LINE.match(line.strip())))


def find(environ: Mapping[str, str], nvidia_smi: str | None = None) -> Gpus | None:
    """This process's GPUs from its environment, else from ``nvidia_smi`` (the output of
    ``nvidia-smi -L``, if it could be run); None when nothing tells of any.

    >>> find({"CUDA_VISIBLE_DEVICES": "2,3"})
    Gpus(ids=('2', '3'), variable='CUDA_VISIBLE_DEVICES', source='CUDA_VISIBLE_DEVICES')
    >>> find({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, "GPU 0: T4 (UUID: GPU-1)").ids
    ()
    >>> find({"SLURM_JOB_GPUS": "1,3"}).ids
    ('1', '3')
    """
    for variable in VISIBLE_VARIABLES:
        value = environ.get(variable)
        if value is not None:
            ids = () if value.strip().lower() in _NONE else _ids(value)
            return Gpus(ids, variable, variable)
    for variable in SLURM_VARIABLES:
        value = environ.get(variable, "").strip()
        if value and value.lower() not in _NONE:
            return Gpus(_ids(value), "CUDA_VISIBLE_DEVICES", variable)
    if nvidia_smi:
        ids = parse_nvidia_smi(nvidia_smi)
        if ids:
            return Gpus(ids, "CUDA_VISIBLE_DEVICES", "nvidia-smi -L")
    return None


def offer_gpus(gpus: Gpus | None, resources: dict, worker: Any = "") -> Gpus | None:
    """The GPUs a worker gives its tasks as devices, and its ``resources`` made to offer
    them (changed in place): ``GPU`` = their number unless the worker was told a count;
    a count below it offers the first ones; a count above it, or below one, is kept, and
    tasks are told no device (which would two tasks share?).

    >>> resources = {}
    >>> offer_gpus(Gpus(("0", "1")), resources).ids, resources
    (('0', '1'), {'GPU': 2})
    >>> resources = {"GPU": 1}
    >>> offer_gpus(Gpus(("2", "3")), resources).ids, resources
    (('2',), {'GPU': 1})
    """
    if gpus is None or not gpus.ids:
        return None
    count = resources.setdefault("GPU", len(gpus.ids))
    if count > len(gpus.ids):
        logger.warning("worker %s: resource GPU=%g but %d GPUs found (%s): the count is "
                       "kept, and tasks are told no device", worker, count, len(gpus.ids),
                       gpus.source)
        return None
    n = int(count)
    if n < 1:
        return None  # a fraction of one: counted, no device named
    return gpus if n == len(gpus.ids) else Gpus(gpus.ids[:n], gpus.variable, gpus.source)
