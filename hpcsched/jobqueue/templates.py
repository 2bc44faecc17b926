"""Job templates: several kinds of jobs behind one cluster and one scheduler.

A campaign often needs more than one kind of worker: a CPU stage, a GPU stage, a
large-memory step. With dask-jobqueue that takes two clusters that cannot share a
scheduler, or a GPU node held for the whole run (dask/distributed#2118,
dask-jobqueue#103). Here a batch cluster takes ``job_templates``::

    SLURMCluster(cores=4, memory="16GB",
                 job_templates={"gpu": dict(queue="gpu", cores=8, memory="64GB",
                                            job_extra_directives=["--gres=gpu:4"],
                                            resources={"GPU": 4})})

Rules this module keeps:

* the cluster's own parameters are the template named ``"default"``; a template is
  those parameters with its own on top (any job parameter, and ``resources``, the
  abstract resources of each job, shared evenly by its worker processes, each told its
  share with ``hpcsched worker --resources``);
* the workers of a template with ``resources`` run only the tasks that ask for one of
  them (``resources_only``, true unless the template says otherwise): the CPU stages of
  a pipeline do not land on a GPU job, whose adaptive scaling then follows the GPU tasks
  alone. ``resources_only=False`` lets its idle workers take any task;
* a template's jobs are named ``<job_name>-<template>-<cluster id>-<n>`` unless it
  names its own ``job_name``, so that its jobs are told apart in the queue and its
  workers map back to it;
* parameters of the cluster itself (the scheduler's address, ``scheduler_options``,
  ``log_directory``, ``shared_temp_directory``, ``interface``, ``protocol``) are one per
  cluster and refused in a template.

:class:`JobTemplates` owns the rendered :class:`~hpcsched.jobqueue.base.BatchSystem` of
each template; :class:`TemplatePools` is what adaptive scaling sees of them (see
:mod:`hpcsched.launchers.adaptive_pools`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcsched.jobqueue.base import BatchSystem
from hpcsched.jobqueue.job import DEFAULT_TEMPLATE as DEFAULT

if TYPE_CHECKING:
    from hpcsched.jobqueue.book import JobBook
    from hpcsched.launchers.adaptive_policy import WorkerSnapshot

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
#: parameters of the cluster as a whole: one scheduler, one secret, one log directory
CLUSTER_WIDE = ("scheduler_options", "log_directory", "shared_temp_directory", "interface",
                "protocol", "config_name")


class JobTemplates:
    """The batch system of each job template, the default one first.

    >>> from hpcsched.jobqueue.systems.slurm import SLURMSystem
    >>> t = JobTemplates(SLURMSystem, dict(cores=2, memory="4GB", log_directory="/tmp"),
    ...                  {"gpu": dict(queue="gpu", resources={"GPU": 4})})
    >>> t.names, t.system("gpu").params["queue"], t.system("gpu").params["job_name"]
    (['default', 'gpu'], 'gpu', 'hpcsched-gpu')
    """

    def __init__(self, system_class: type[BatchSystem], kwargs: Mapping[str, Any],
                 job_templates: Any, default: BatchSystem | None = None) -> None:
        self.systems: dict[str, BatchSystem] = {
            DEFAULT: default if default is not None else system_class(**kwargs)}
        if job_templates is None:
            return
        if not isinstance(job_templates, Mapping):
            raise TypeError("job_templates must be a dict of template name -> dict of job "
                            f"parameters, got {type(job_templates).__name__}")
        base = self.systems[DEFAULT].params
        for name, overrides in job_templates.items():
            if not isinstance(name, str) or not _NAME.match(name) or name == DEFAULT:
                raise ValueError(f"job_templates: {name!r} is not a template name (letters, "
                                 f"digits and '_', starting with a letter; not {DEFAULT!r}, "
                                 "which is the cluster's own parameters)")
            if not isinstance(overrides, Mapping):
                raise TypeError(f"job_templates[{name!r}] must be a dict of job parameters, "
                                f"got {overrides!r}")
            wide = sorted(set(overrides) & set(CLUSTER_WIDE))
            if wide:
                raise ValueError(f"job_templates[{name!r}]: {', '.join(wide)} belong to the "
                                 "cluster as a whole (one scheduler, one secret): set them on "
                                 "the cluster, not in a template")
            merged = {**kwargs, **overrides}
            merged.setdefault("job_name", f"{base['job_name']}-{name}")
            if overrides.get("resources") and overrides.get("resources_only") is None:
                merged["resources_only"] = True
            if "processes" not in overrides and "cores" in overrides:
                merged.pop("processes", None)  # recomputed from the template's cores
            merged["log_directory"] = base["log_directory"]
            try:
                self.systems[name] = system_class(**merged)
            except (TypeError, ValueError) as e:
                raise type(e)(f"job_templates[{name!r}]: {e}") from None
        names = {s.params["job_name"]: t for t, s in self.systems.items()}
        if len(names) < len(self.systems):
            raise ValueError("job_templates: two templates share a job_name; give each its "
                             "own, so that their jobs and workers are told apart")

    @property
    def names(self) -> list[str]:
        """The templates, ``"default"`` first."""
        return list(self.systems)

    @property
    def named(self) -> bool:
        """Whether the cluster has templates besides its default one."""
        return len(self.systems) > 1

    def system(self, template: str | None) -> BatchSystem:
        """The batch system of ``template`` (None: the default), or an error naming it."""
        name = DEFAULT if template is None else template
        system = self.systems.get(name)
        if system is None:
            raise ValueError(f"no job template {name!r}; this cluster has "
                             f"{', '.join(map(repr, self.systems))}")
        return system

    def check(self, template: str | None) -> str:
        """``template``'s name (None: the default), if the cluster has it."""
        self.system(template)
        return DEFAULT if template is None else template

    def resources(self, template: str) -> dict[str, float]:
        """What each worker of ``template`` has: its share of the job's ``resources``."""
        return dict(self.systems[template].worker_resources)

    def workers_per_job(self, template: str) -> int:
        return int(self.systems[template].params["processes"])


class TemplatePools:
    """The templates as adaptive scaling sees them: the pools of workers it grows and
    shrinks one by one (the interface of :mod:`hpcsched.launchers.adaptive_pools`).

    It reads the cluster's :class:`~hpcsched.jobqueue.book.JobBook` under the cluster's
    lock, and owns nothing else.
    """

    def __init__(self, templates: JobTemplates, book: JobBook,
                 lock: threading.RLock | threading.Lock) -> None:
        self.templates = templates
        self.book = book
        self.lock = lock

    def names(self) -> list[str]:
        return self.templates.names

    def resources(self, pool: str) -> dict[str, float]:
        return self.templates.resources(pool)

    def workers_per_unit(self, pool: str) -> int:
        return self.templates.workers_per_job(pool)

    def pool_of(self, worker: WorkerSnapshot) -> str:
        """The template of the job a worker belongs to (the default for one of no job):
        its unit is its job's id (``JobQueueCluster.unit_of``), found at once."""
        with self.lock:
            job = self.book.jobs.get(worker.unit) if worker.unit else None
            if job is None:
                job = self.book.job_of_worker(worker.name)
        return job.template if job is not None else DEFAULT

    def requested(self, pool: str) -> int:
        """Workers asked for of this template: those of its jobs counted in the target."""
        with self.lock:
            return len(self.book.active(pool)) * self.templates.workers_per_job(pool)
