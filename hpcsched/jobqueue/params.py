"""Job parameters under dask-jobqueue's names and with its meanings.

:func:`resolve` turns keyword arguments into the parameter dict a
:class:`~hpcsched.jobqueue.base.BatchSystem` renders from. The layers, later winning:

1. defaults -- dask-jobqueue's own (``jobqueue.yaml`` of dask-jobqueue 0.9: a 30 minute
   walltime, ``processes`` about the square root of ``cores``, ...);
2. dask's configuration ``jobqueue.<section>`` (:mod:`hpcsched.jobqueue.dask_config`: its
   files, ``DASK_*`` variables and ``dask.config.set`` in this process): keys this system
   has no use for are ignored there, as dask-jobqueue ignores them;
3. hpcsched's configuration ``jobqueue.<section>`` (YAML, ``HPCSCHED_JOBQUEUE__...``):
   unknown keys are errors (a typo must not pass silently);
4. keyword arguments that are not ``None``.

``<section>`` is ``config_name`` when given, else the system (``slurm``, ``sge``, ...).

dask-jobqueue's renamed parameters (``extra``, ``job_extra``, ``env_extra``,
``header_skip``; ``project`` on SLURM and PBS) still work with its ``FutureWarning``:
the new name wins when both are set. Parameters that mean nothing to hpcsched are
accepted and one line is logged saying why they are ignored (:data:`IGNORED`).
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

import hpcsched.jobqueue.dask_config as dask_config
from hpcsched.core import config
from hpcsched.core.units import parse_bytes

logger = logging.getLogger(__name__)

#: parameter -> default, shared by every system (a system adds its own)
COMMON: dict[str, Any] = {
    "cores": None,
    "memory": None,
    "processes": None,  # None: about sqrt(cores), see default_processes
    "nthreads": None,  # threads per worker; default cores // processes
    "walltime": "00:30:00",
    "queue": None,
    "account": None,
    "project": None,
    "resource_spec": None,
    "job_extra_directives": [],
    "job_directives_skip": [],
    "job_script_prologue": [],
    "job_script_epilogue": [],  # lines run after the worker exits (dask-jobqueue 0.9)
    "log_directory": None,
    "local_directory": None,
    "interface": None,
    "job_name": "hpcsched",  # configuration key "name", as in dask-jobqueue
    "python": None,
    "scheduler_options": {},
    "death_timeout": None,  # None: worker.death-timeout (60 s, as dask-jobqueue)
    "job_array": False,
    "shebang": "#!/usr/bin/env bash",
    "submit_command_extra": [],
    "worker_extra_args": [],
    "launcher": "fork",
    "shared_temp_directory": None,  # where the cluster's secret file goes (else log_directory)
    "protocol": None,
    "worker_command": None,  # the module the job runs: see worker_program
    "resources": None,  # abstract resources of a job ({"GPU": 4}), shared by its workers
    "resources_only": None,  # its workers run only tasks asking for those (templates.py)
    # dask-jobqueue parameters hpcsched accepts and does not use (see IGNORED)
    "nanny": True,
    # dask-jobqueue's old names (see DEPRECATED)
    "extra": None,
    "job_extra": None,
    "env_extra": None,
    "header_skip": None,
}

#: old name -> new name, renamed in dask-jobqueue 0.8 (it warns with FutureWarning)
DEPRECATED = {
    "extra": "worker_extra_args",
    "job_extra": "job_extra_directives",
    "env_extra": "job_script_prologue",
    "header_skip": "job_directives_skip",
}

#: parameter -> (is it set to something hpcsched would have to honour?, why it is ignored)
IGNORED: dict[str, tuple[Any, str]] = {
    "nanny": (lambda v: v is False,
              "hpcsched workers run without a nanny process; a job's worker that dies is "
              "replaced by a new job while the cluster's target asks for it"),
}

#: dask-jobqueue's default worker_command (its jobqueue.yaml, which importing dask_jobqueue
#: copies to ~/.config/dask and registers as dask's default): "the usual worker", which
#: here is hpcsched's
_DASK_JOBQUEUE_DEFAULT_WORKER = "distributed.cli.dask_worker"
#: packages whose worker programs are dask.distributed workers
_DASK_WORKER_PACKAGES = ("distributed", "dask", "dask_cuda", "dask_jobqueue", "dask_mpi")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def worker_program(worker_command: str | None) -> list[str]:
    """What follows ``python -m`` in a job script, from dask-jobqueue's ``worker_command``
    (a module, with arguments of its own after a space, as in ``"dask_cuda.cli cuda worker"``).

    An hpcsched scheduler speaks only to hpcsched workers, so the module must run one:
    ``hpcsched`` itself (the default), or a module of your own that prepares the node and
    calls :func:`hpcsched.launchers.cli.worker_main` with its arguments, which are
    ``hpcsched worker``'s (the scheduler's address, ``--name``, ``--nthreads`` ...). A
    dask.distributed worker program is refused with what to use instead.

    >>> worker_program(None), worker_program("distributed.cli.dask_worker")
    (['hpcsched', 'worker'], ['hpcsched', 'worker'])
    >>> worker_program("mysite.gpu_worker")
    ['mysite.gpu_worker']
    """
    if worker_command is None or worker_command == _DASK_JOBQUEUE_DEFAULT_WORKER:
        return ["hpcsched", "worker"]
    if not isinstance(worker_command, str):
        raise TypeError(f"worker_command must be a module name, got {worker_command!r}")
    module, *args = worker_command.split()
    if module in ("hpcsched", "hpcsched.__main__") and args in ([], ["worker"]):
        return ["hpcsched", "worker"]
    if module.split(".")[0] == "hpcsched":
        raise ValueError(
            f"worker_command={worker_command!r} runs no hpcsched worker with 'python -m': "
            "hpcsched's worker is the module 'hpcsched' (python -m hpcsched worker, the "
            "default); leave worker_command unset")
    if not _MODULE.match(module):
        raise ValueError(
            f"worker_command={worker_command!r}: give the Python module the job runs with "
            "'python -m', as in dask-jobqueue: 'hpcsched' (the default), or a module of your "
            "own that calls hpcsched.launchers.cli.worker_main(sys.argv[1:])")
    if module.split(".")[0] in _DASK_WORKER_PACKAGES:
        raise ValueError(
            f"worker_command={worker_command!r} starts a dask.distributed worker, which cannot "
            "join an hpcsched scheduler (it speaks hpcsched's protocol, not distributed's). "
            "Leave worker_command unset: jobs start 'python -m hpcsched worker'. For GPUs, "
            "give each worker its GPUs as resources (worker_extra_args=['--resources', "
            "'GPU=1']) and choose the devices in job_script_prologue (export "
            "CUDA_VISIBLE_DEVICES=...); to prepare more than that, name a module of your own "
            "that calls hpcsched.launchers.cli.worker_main(sys.argv[1:]).")
    return [module, *args]


def default_processes(cores: int) -> int:
    """dask-jobqueue's default (``distributed.deploy.local.nprocesses_nthreads``): one
    process per core up to 4 cores, then the smallest factor of ``cores`` that is at least
    its square root, so that processes and threads per process are about equal.

    >>> [default_processes(c) for c in (1, 4, 6, 8, 12, 24, 36, 7)]
    [1, 4, 3, 4, 4, 6, 6, 7]
    """
    if cores <= 4:
        return cores
    return min(f for f in range(1, cores + 1) if cores % f == 0 and f >= math.sqrt(cores))


def _param_name(key: str) -> str:
    key = key.replace("-", "_")
    return "job_name" if key == "name" else key


def _config_layers(section: str, known: Mapping[str, Any]) -> dict[str, Any]:
    """dask's section (lenient), then hpcsched's (strict); nested mappings kept nested."""
    out: dict[str, Any] = {}
    ignored = []
    for key, value in dask_config.section(section).items():
        param = _param_name(key)
        if param in known:
            out[param] = dict(value) if isinstance(value, Mapping) else value
        else:
            ignored.append(key)
    if ignored:
        logger.debug("dask configuration jobqueue.%s: ignoring %s (not parameters of this "
                     "batch system)", section, ", ".join(sorted(ignored)))
    for key, value in config.get_prefix(f"jobqueue.{section}").items():
        top, _, sub = key.partition(".")
        param = _param_name(top)
        if param not in known:
            raise ValueError(f"unknown parameter {param!r} in configuration "
                             f"jobqueue.{section}.{top} (known: {', '.join(sorted(known))})")
        if sub:  # hpcsched's configuration arrives flattened: scheduler-options.host
            prev = out.get(param)
            out[param] = dict(prev) if isinstance(prev, Mapping) else {}
            out[param][sub.replace("-", "_")] = value
        else:
            out[param] = value
    return out


def resolve(owner: str, system: str, defaults: Mapping[str, Any], kwargs: Mapping[str, Any],
            deprecated_project: bool = False) -> dict[str, Any]:
    """Merged parameters (see the module docstring); ``owner`` names the class in errors."""
    kwargs = dict(kwargs)
    owner = owner.replace("System", "Cluster")  # users meet the cluster class
    section = kwargs.pop("config_name", None) or system
    known = dict(defaults)
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise TypeError(f"{owner} got unexpected keyword argument(s) {', '.join(unknown)} "
                        f"(known: {', '.join(sorted(known))})")
    merged = dict(known)
    merged.update(_config_layers(section, known))
    given = {k: v for k, v in kwargs.items() if v is not None}
    merged.update(given)
    merged["config_name"] = section
    for key in ("scheduler_options",):
        if isinstance(merged.get(key), Mapping):
            merged[key] = {str(k).replace("-", "_"): v for k, v in merged[key].items()}
    if merged["cores"] is None or merged["memory"] is None:
        raise ValueError(
            "You must specify how many cores and how much memory each job has "
            f"(cores and memory), for example:\ncluster = {owner}("
            f"cores={merged['cores'] or 8}, memory={merged['memory'] or '24GB'!r})")
    _apply_deprecated(merged, deprecated_project)
    for name, (matters, why) in IGNORED.items():
        if matters(merged[name]):
            logger.info("%s: %s=%r is ignored: %s", owner, name, merged[name], why)
    return merged


def _apply_deprecated(p: dict[str, Any], deprecated_project: bool) -> None:
    renames = dict(DEPRECATED)
    if deprecated_project:
        renames["project"] = "account"
    for old, new in renames.items():
        if p.get(old) is None:
            continue
        warnings.warn(
            f"{old} has been renamed to {new} (as in dask-jobqueue). You are still using it "
            f"(even if only set to []; please also check configuration files). If {new} is "
            f"not set, {old} is respected for now; if it is, {old} is ignored and you can "
            "remove it.", FutureWarning, stacklevel=4)
        if not p.get(new):
            p[new] = p[old]
        p[old] = None


_RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def check_resources(resources: Any) -> dict[str, float]:
    """``resources`` (a job's abstract resources, shared by its workers, each told its
    share with ``hpcsched worker --resources``) as a dict of names to positive numbers, or an error naming the entry.

    >>> check_resources({"GPU": 4})
    {'GPU': 4.0}
    >>> check_resources(None)
    {}
    """
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise TypeError(f"resources must be a dict such as {{'GPU': 4}}, got {resources!r}")
    out: dict[str, float] = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not _RESOURCE_NAME.match(name):
            raise ValueError(f"resources: {name!r} is not a resource name (letters, digits, "
                             "'_', '.', '-')")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) \
                or not math.isfinite(amount) or amount <= 0:
            raise ValueError(f"resources[{name!r}]={amount!r}: give a positive number")
        out[name] = float(amount)
    return out


def split_resources(resources: Mapping[str, float], processes: int) -> dict[str, float]:
    """Each worker's share of a job's ``resources``: a job of 4 GPUs and 4 worker
    processes gives each worker one; a whole number that does not split evenly is refused.

    >>> split_resources({"GPU": 4.0}, 2)
    {'GPU': 2.0}
    """
    out = {}
    for name, amount in resources.items():
        share = amount / processes
        if amount == int(amount) and share != int(share):
            raise ValueError(f"resources[{name!r}]={amount:g} does not split evenly among "
                             f"the job's {processes} worker processes: set processes to a "
                             "divisor of it")
        out[name] = share
    return out


def adapt_bounds(minimum: int, maximum: float, kwargs: dict[str, Any], threads: int,
                 memory: int) -> tuple[int, float]:
    """``adapt``'s bounds in workers, narrowed by dask's resource bounds.

    ``minimum_cores``, ``maximum_cores``, ``minimum_memory`` and ``maximum_memory`` are
    taken out of ``kwargs`` and counted as ``distributed.SpecCluster.adapt`` counts them,
    for workers of ``threads`` threads and ``memory`` bytes each.

    >>> adapt_bounds(0, math.inf, {"maximum_memory": "4GB", "minimum_cores": 3}, 2, 2 * 10**9)
    (2, 2)
    """
    if (v := kwargs.pop("minimum_cores", None)) is not None:
        minimum = max(minimum or 0, math.ceil(v / threads))
    if (v := kwargs.pop("maximum_cores", None)) is not None:
        maximum = min(maximum, math.floor(v / threads))
    if (v := kwargs.pop("minimum_memory", None)) is not None:
        minimum = max(minimum or 0, math.ceil(parse_bytes(v) / memory))
    if (v := kwargs.pop("maximum_memory", None)) is not None:
        maximum = min(maximum, math.floor(parse_bytes(v) / memory))
    return minimum, maximum


def check_cluster_keywords(cls: str, asynchronous: bool, ignored: dict[str, Any],
                            moved: dict[str, Any]) -> None:
    """dask-jobqueue's cluster keywords: refused with a way out, or logged as ignored."""
    for what, value in moved.items():
        if value is not None:
            raise ValueError(f"Please pass {what!r} through 'scheduler_options': use "
                             f"{cls}(..., scheduler_options={{{what!r}: {value!r}}})")
    if asynchronous:
        raise ValueError(f"{cls}(asynchronous=True): hpcsched's clusters are synchronous "
                         "objects (no 'await cluster'); run them from a thread with "
                         "loop.run_in_executor if an event loop needs one")
    why = {"loop": "the scheduler runs its own event loop thread",
           "scheduler_cls": "an hpcsched scheduler is always started",
           "silence_logs": "hpcsched leaves logging to the application "
                           "(logging.getLogger('hpcsched').setLevel(...))"}
    for what, value in ignored.items():
        if value is not None:
            logger.info("%s: %s=%r is ignored: %s", cls, what, value, why[what])
