"""The peers' tests hpcsched fails on purpose, each with its reason.

Each key is one difference: the pytest node ids of its tests as ``fnmatch`` patterns
(``test_slurm.py::test_header``; a file name alone skips a whole module, which is then not
imported). ``tests/peers/plugin.py`` marks the tests strict expected failures, so a listed
test that starts passing fails the run and the list is kept true; the first difference
whose pattern matches a test is its reason. ``docs/moving/differences.md``
shows this list, and ``tests/peers/test_differences.py`` keeps the two equal.
"""

from __future__ import annotations

DIFFERENCES: dict[tuple[str, ...], str] = {
    ("test_runner.py", "test_slurm.py::test_slurm_runner"):
        "dask-jobqueue's runners (SLURMRunner, and their base tested in one process under "
        "asyncio). hpcsched's scheduler, client and workers inside one batch job are its MPI "
        "mode: srun / mpiexec python -m hpcsched script.py, or --scheduler-file F.",
    ("test_job.py::test_basic[[]*", "test_job.py::test_job[[]*",
     "test_jobqueue_core.py::test_job_id_*", "test_jobqueue_core.py::test_command_template*",
     "test_lsf.py::test_config", "test_lsf.py::test_use_stdin*",
     "test_htcondor.py::test_header"):
        "They test dask-jobqueue's Job objects (job_cls(scheduler=...) starting a worker, "
        "_job_id_from_submit_output, _command_template) and the cluster's private _dummy_job. "
        "hpcsched's job_cls is a BatchSystem: the job's parameters, script and commands; the "
        "cluster submits the scripts and keeps its jobs as records. What those tests check "
        "(use_stdin, job id parsing, the worker's options) is in job_script() and in "
        "hpcsched's own tests.",
    ("test_job.py::test_cluster[[]*", "test_job.py::test_adapt*",
     "test_job.py::test_nworkers_scale", "test_job.py::test_jobqueue_job_call*",
     "test_pbs.py::test_adapt", "test_jobqueue_core.py::test_config_interface"):
        "asynchronous=True: hpcsched's clusters are synchronous objects, refused with a clear "
        "error; an event loop runs them in a thread (loop.run_in_executor).",
    ("test_jobqueue_core.py::test_scheduler_options[[]*",
     "test_jobqueue_core.py::test_scheduler_options_interface*",
     "test_jobqueue_core.py::test_import_scheduler_options_from_config*",
     "test_jobqueue_core.py::test_forward_ip*", "test_pbs.py::test_basic",
     "test_pbs.py::test_adaptive*", "test_pbs.py::test_scale_grouped", "test_lsf.py::test_basic",
     "test_lsf.py::test_adaptive*"):
        "They read attributes hpcsched's clusters do not have: dask.distributed's SpecCluster "
        "internals (scheduler_spec, new_spec, worker_spec, scheduler.ip), "
        "_dummy_job.worker_processes, and pending_jobs / running_jobs, which dask-jobqueue "
        "0.9's own cluster no longer has either (its CI runs no LSF). hpcsched honours the "
        "same scheduler_options and shows its address in cluster.scheduler_address (a "
        "routable one by default, not socket.gethostbyname('')), its jobs in cluster.jobs.",
    ("test_slurm.py::test_header", "test_pbs.py::test_header[[]*", "test_lsf.py::test_header",
     "test_oar.py::test_header", "test_job.py::test_header_lines_*",
     "test_job.py::test_deprecation_header_skip*",
     "test_slurm.py::test_worker_name_uses_cluster_name"):
        "Job names: each job is named <job_name>-<cluster id>-<n>, which also names its log "
        "file and its workers, so that every worker maps to its job (job_directives_skip=['-N'] "
        "drops the directive, not the name); the default job_name is 'hpcsched', not "
        "'dask-worker'.",
    ("test_slurm.py::test_job_script", "test_pbs.py::test_job_script[[]*",
     "test_lsf.py::test_job_script", "test_oar.py::test_job_script",
     "test_sge.py::test_job_script", "test_htcondor.py::test_job_script"):
        "The job runs python -m hpcsched worker (an hpcsched scheduler speaks to hpcsched "
        "workers, not distributed.cli.dask_worker), under the job names above, with "
        "--memory-limit written exactly (6GB) where dask's format_bytes rounds (5.59GiB).",
    ("test_jobqueue_core.py::test_security*",):
        "dask.distributed's Security (TLS certificates, protocol='tls'): hpcsched's clusters "
        "authenticate every peer with the cluster's secret and take TLS from comm.tls.cert / "
        "comm.tls.key / comm.tls.ca.",
    tuple(f"test_job.py::test_deprecation_job_extra[[]{system}]"
          for system in ("pbs", "moab", "slurm", "sge", "lsf", "oar")):
        "job_extra / job_extra_directives must be a list of strings (a dict only on "
        "HTCondor): a dict elsewhere is an error, where dask-jobqueue takes it silently.",
    ("test_cli.py",):
        "dask-mpi's command line, dask-mpi --scheduler-file F (its options --nanny, "
        "--worker-class, --scheduler-rank, --no-scheduler). hpcsched's is mpiexec -n N "
        "python -m hpcsched --scheduler-file F: rank 0 the scheduler, the other ranks "
        "workers, served until a client calls shutdown() or the walltime.",
    ("test_initialize.py::test_basic", "test_execute.py::test_basic[[]*-0]",
     "test_execute.py::test_no_exit"):
        "dask-mpi's layout: hpcsched's rank 0 runs the scheduler and the client, so every "
        "other rank is a worker (N-1 workers, where dask-mpi has N-2) and execute() takes "
        "no other client_rank / scheduler_rank; a world of one runs on a LocalCluster "
        "instead of failing.",
    ("test_slurm.py::test_different_interfaces_on_scheduler_and_workers",):
        "It needs the interface aliases eth0:worker and eth0:scheduler of dask-jobqueue's "
        "docker CI; here eth0 has none, and an interface that is not there is an error "
        "naming the host's interfaces.",
    ("test_jobqueue_core.py::test_wrong_parameter_error*", "test_job.py::test_docstring_cluster*",
     "test_oar.py::test_memory_per_core_property_name_none_warning"):
        "Wordings: an unknown keyword raises TypeError (Python's error for it) naming the "
        "known parameters, where dask-jobqueue raises ValueError; the cluster classes' "
        "docstrings name dask-jobqueue's parameters rather than repeat each numpydoc entry "
        "('cores : int'); the warning about OAR's memory_per_core_property_name says what to "
        "set ('memcore', or 'not_applicable') in its own sentence.",
}


def patterns() -> list[tuple[str, str]]:
    """(pattern, reason) for every pattern, in the list's order."""
    return [(pattern, reason) for key, reason in DIFFERENCES.items() for pattern in key]


BEGIN = "<!-- differences: generated from tests/peers/differences.py -->"
END = "<!-- differences: end -->"


def markdown() -> str:
    """The list as docs/moving/differences.md shows it, between its markers."""
    lines = [BEGIN, ""]
    for number, (key, reason) in enumerate(DIFFERENCES.items(), 1):
        tests = ", ".join(f"`{pattern}`" for pattern in key)
        lines += [f"{number}. {reason}", f"   (the peers' tests: {tests})", ""]
    return "\n".join([*lines, END])


if __name__ == "__main__":  # python -m tests.peers.differences: the page's block
    print(markdown())
