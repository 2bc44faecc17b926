"""Snakemake's executor for hpcsched: each job of a workflow is a task of the cluster.

Snakemake hands each job to :meth:`Executor.run_job`. Every remote executor runs a job
as ``python -m snakemake`` for that one job; here, by default, the job runs instead in a
fork of a Python on the worker that has Snakemake loaded already
(:mod:`.preloaded`: a short rule's job then costs what the rule costs, not Snakemake's
start-up), with the same arguments and environment. With ``--hpcsched-fresh-process``,
or a ``--precommand`` (which needs a shell), the command itself becomes a command task
(``Client.submit_command``). :meth:`Executor.check_active_jobs` reads the futures'
states, which the client already knows (no polling of a batch system: one status query
per job per interval there, none here).
"""

import asyncio
import os
import shlex
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Optional

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase


# Snakemake reads each field's type to parse its option: real types, not strings (no
# ``from __future__ import annotations`` in this module)
@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    scheduler_file: Optional[str] = field(  # noqa: UP045 - Snakemake calls the type

        default=None,
        metadata={"help": "the hpcsched scheduler's file (as `hpcsched scheduler "
                          "--scheduler-file` or a cluster wrote it)", "env_var": True})
    address: Optional[str] = field(  # noqa: UP045 - Snakemake calls the type
        default=None,
        metadata={"help": "the scheduler's address, when not from a file (its secret "
                          "from $HPCSCHED_SECRET_FILE)", "env_var": True})
    fresh_process: bool = field(
        default=False,
        metadata={"help": "run each job as its own `python -m snakemake` command rather "
                          "than in a fork of a Python with Snakemake loaded (for workers "
                          "that cannot import this plugin)"})


common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    pass_envvar_declarations_to_cmd=True,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=0,
)


class Executor(RemoteExecutor):
    def __init__(self, workflow, logger) -> None:
        # the base starts the status thread (which calls sleep()) before __post_init__
        self._changed = threading.Event()  # a job's future ended since the last check
        super().__init__(workflow, logger)

    def __post_init__(self) -> None:
        from hpcsched import Client

        settings = self.workflow.executor_settings
        scheduler_file = (getattr(settings, "scheduler_file", None)
                          or os.environ.get("HPCSCHED_SCHEDULER_FILE"))
        address = getattr(settings, "address", None)
        try:
            if address:
                self.client = Client(address)
            elif scheduler_file:
                self.client = Client(scheduler_file=scheduler_file)
            else:
                raise WorkflowError("the hpcsched executor needs a scheduler: "
                                    "--hpcsched-scheduler-file F or --hpcsched-address A")
        except (OSError, TimeoutError) as e:
            raise WorkflowError(f"cannot reach the hpcsched scheduler: {e}") from e
        self.logdir = os.path.abspath(os.path.join(".snakemake", "hpcsched"))
        self._has_cpus = "cpus" in _resource_names(self.client)
        self._fork = not getattr(settings, "fresh_process", False)

    def run_job(self, job: JobExecutorInterface) -> None:
        command = self.format_job_exec(job)
        log = os.path.join(self.logdir, job.name if not job.is_group() else "group",
                           f"{job.jobid}.log")
        options = {}
        if self._has_cpus and job.threads > 1:
            options["resources"] = {"cpus": job.threads}
        key = f"snakemake-{job.name}-{job.jobid}" if not job.is_group() else None
        argv = self._snakemake_args(command) if self._fork else None
        if argv is not None:
            from snakemake_executor_plugin_hpcsched.preloaded import run_job

            future = self.client.submit(run_job, argv, os.getcwd(), self.envvars(), log,
                                        key=key or f"snakemake-group-{job.jobid}",
                                        pure=False, **options)
        else:
            future = self.client.submit_command(command, cwd=os.getcwd(), stdout=log,
                                                stderr=log, key=key, **options)
        future.add_done_callback(lambda _f: self._changed.set())
        self.report_job_submission(SubmittedJobInfo(job, external_jobid=str(future.key),
                                                    aux={"future": future, "log": log}))

    def additional_general_args(self) -> str:
        """A job's Snakemake picks among the one job (or the jobs of one group) it runs:
        the greedy scheduler does that at once, where the ILP scheduler, Snakemake's
        default, writes the problem out and starts a solver for it."""
        return "--scheduler greedy"  # joined as text: a list here breaks format_job_exec

    def _snakemake_args(self, command: str) -> list[str] | None:
        """The arguments of ``python -m snakemake`` in the job's command, as its shell
        would split them; None when something else runs before it (a precommand)."""
        head, found, args = command.partition(" -m snakemake ")
        if not found or self.get_python_executable() not in head:
            return None
        head = head.replace(self.get_envvar_declarations(), "", 1)
        if head.strip() != self.get_python_executable():
            return None
        return shlex.split(args)

    async def check_active_jobs(
            self, active_jobs: list[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        for job_info in active_jobs:
            future = job_info.aux["future"]
            status = future.status
            if status == "finished":
                self.report_job_success(job_info)
            elif status in ("error", "cancelled", "lost"):
                msg = (f"hpcsched task {future.key} {status}: "
                       f"{future.exception() if status == 'error' else ''}")
                self.report_job_error(job_info, msg=msg, aux_logs=[job_info.aux["log"]])
            else:
                yield job_info

    async def sleep(self) -> None:
        """Until a job's future ends (the client hears it from the scheduler), at most a
        second: not Snakemake's default of 10 s between status queries of a batch
        system, since nothing is queried here."""
        await asyncio.get_running_loop().run_in_executor(None, self._changed.wait, 1.0)
        self._changed.clear()

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        futures = [j.aux["future"] for j in active_jobs]
        if futures:
            self.client.cancel(futures)

    def shutdown(self) -> None:
        super().shutdown()
        self.client.close()


def _resource_names(client) -> set:
    names: set = set()
    for w in client.scheduler_info().get("workers", {}).values():
        names.update((w.get("resources") or {}).keys())
    return names
