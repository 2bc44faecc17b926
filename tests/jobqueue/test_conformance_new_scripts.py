"""Conformance with dask-jobqueue 0.9: the job files its own test suite expects of
HTCondorCluster, OARCluster and MoabCluster (its test_htcondor.py, test_oar.py; Moab is
its PBSCluster submitting with ``msub``), rebuilt as hpcsched tests, and FluxCluster's
``#flux:`` script. What each batch system's environment tells a job is read by its own
module (``in_job``), tested here with drawn environments.

The differences common to every system are listed in test_conformance_scripts.py
(``python -m hpcsched worker``, exact ``--memory-limit``, job names with the cluster's
id, the secret file, one log per job). Where these systems differ further, the test is
named ``..._differs_...`` and says why.
"""

from __future__ import annotations

import warnings

import pytest

from hpcsched.core import config
from hpcsched.jobqueue.clusters import FluxCluster, HTCondorCluster, MoabCluster, OARCluster
from hpcsched.jobqueue.systems import detect_job
from hpcsched.jobqueue.systems.htcondor import HTCondorSystem, quote_arguments
from hpcsched.jobqueue.systems.oar import OARSystem
from hpcsched.launchers import resources

pytestmark = pytest.mark.usefixtures("isolated_config")


def header(cls, **kw) -> str:
    with cls(**kw) as cluster:
        return cluster.job_header


def script(cls, **kw) -> str:
    with cls(**kw) as cluster:
        return cluster.job_script()


# ---------------------------------------------------------------- HTCondor


def test_htcondor_header_attributes():
    h = header(HTCondorCluster, cores=1, memory="100MB", disk="100MB")
    for line in (
        "MY.DaskWorkerCores = 1",
        "MY.DaskWorkerDisk = 100000000",
        "MY.DaskWorkerMemory = 100000000",
    ):
        assert line in h.splitlines()


def test_htcondor_job_script():
    s = script(
        HTCondorCluster,
        cores=4,
        processes=2,
        memory="100MB",
        disk="100MB",
        job_name="dummy-name",
        job_script_prologue=[
            'export LANG="en_US.utf8"',
            'export LC_ALL="en_US.utf8"',
            "cd /some/path/",
            "source venv/bin/activate",
        ],
        job_extra_directives={"+Extra": "True"},
    )
    lines = s.splitlines()
    for line in (
        "RequestCpus = MY.DaskWorkerCores",
        "RequestDisk = floor(MY.DaskWorkerDisk / 1024)",
        "RequestMemory = floor(MY.DaskWorkerMemory / 1048576)",
        "MY.DaskWorkerCores = 4",
        "MY.DaskWorkerDisk = 100000000",
        "MY.DaskWorkerMemory = 100000000",
        'MY.JobId = "$(ClusterId).$(ProcId)"',
        "+Extra = True",
        "Executable = /bin/sh",
        "Queue",
    ):
        assert line in lines
    assert lines[0] == "#!/usr/bin/env condor_submit" and lines[-1] == "Queue"
    assert any(ln.startswith("batch_name = dummy-name") for ln in lines)
    for part in (
        'export LANG=""en_US.utf8""',
        'export LC_ALL=""en_US.utf8""',
        "cd /some/path/",
        "source venv/bin/activate",
        " -m hpcsched worker tcp://",
        "--nthreads 2",
        "--nworkers 2",
        "--memory-limit 50MB",
    ):
        assert part in s
    # the prologue runs before the worker, in the one shell the arguments start
    arguments = next(ln for ln in lines if ln.startswith("Arguments = "))
    assert (
        arguments.startswith("Arguments = \"-c 'export LANG") and "; cd /some/path/; " in arguments
    )


def test_htcondor_commands_take_their_extra_arguments():
    """dask-jobqueue's submit_command_extra / cancel_command_extra go on condor_submit's and
    condor_rm's command lines."""
    calls = []
    system = HTCondorSystem(
        cores=1,
        memory="1GB",
        disk="1GB",
        submit_command_extra=["-verbose"],
        cancel_command_extra=["-forcex"],
    )
    system.run_command = lambda cmd, timeout, input=None: (
        calls.append(cmd) or "1 job(s) submitted to cluster 7."
    )
    assert system.submit("/tmp/job.sub", "") == "7.0"
    system.cancel(["7.0"])
    assert calls == [["condor_submit", "-verbose", "/tmp/job.sub"], ["condor_rm", "-forcex", "7.0"]]


def test_htcondor_needs_disk_and_skips_attributes_by_name():
    with pytest.raises(ValueError, match="disk"):
        HTCondorSystem(cores=1, memory="1GB")
    system = HTCondorSystem(
        cores=1, memory="1GB", disk="1GB", job_directives_skip=["RequestDisk", "MY.JobId"]
    )
    h = system.header("j")
    assert not any(ln.startswith(("RequestDisk", "MY.JobId")) for ln in h)
    assert any("$(ClusterId)" not in ln and ln.startswith("MY.DaskWorkerDisk") for ln in h)


def test_htcondor_differs_by_one_log_file_per_job():
    """dask-jobqueue writes ``worker-<id>.out`` and ``.err``; hpcsched joins both in one log
    per job (shown when a job fails before its workers connect), streamed as it runs."""
    s = script(HTCondorCluster, cores=1, memory="1GB", disk="1GB", log_directory="/logs")
    out = next(ln for ln in s.splitlines() if ln.startswith("Output = "))
    err = next(ln for ln in s.splitlines() if ln.startswith("Error = "))
    assert out.split(" = ")[1] == err.split(" = ")[1] and out.endswith(".out")
    assert "Stream_Output = True" in s


def test_htcondor_quotes_arguments_by_the_new_rules():
    assert quote_arguments(["3", "simple", "arguments"]) == "3 simple arguments"
    assert quote_arguments(["one", "two with spaces", "three"]) == "one 'two with spaces' three"
    assert (
        quote_arguments(["one", '"two"', "spacy 'quoted' argument"])
        == "one \"\"two\"\" 'spacy ''quoted'' argument'"
    )


def test_htcondor_array_is_one_queue_statement():
    system = HTCondorSystem(cores=1, memory="1GB", disk="1GB", job_array=True)
    s = system.render("j", "tcp://h:1", None, array=3)
    assert s.splitlines()[-1] == "Queue 3"
    assert 'Environment = "HPCSCHED_ARRAY_INDEX=$(ProcId)"' in s.splitlines()
    assert '--name ""j.${HPCSCHED_ARRAY_INDEX}""' in s  # expanded by the job's shell
    assert system.array_element_ids("12.0", 3) == ["12.0", "12.1", "12.2"]


# ---------------------------------------------------------------- OAR


def test_oar_header():
    h = header(
        OARCluster,
        walltime="00:02:00",
        processes=4,
        cores=8,
        memory="28GB",
        job_name="dask-worker",
        memory_per_core_property_name="not_applicable",
    )
    assert "#OAR -n dask-worker" in h
    assert "#OAR -l /nodes=1/core=8,walltime=00:02:00" in h
    assert "#OAR --project" not in h and "#OAR -q" not in h and "#OAR -p" not in h

    h = header(
        OARCluster,
        queue="regular",
        project="DaskOnOar",
        processes=4,
        cores=8,
        memory="28GB",
        job_extra_directives=["-t besteffort"],
        memory_per_core_property_name="not_applicable",
    )
    assert "walltime=" in h and "#OAR --project DaskOnOar" in h
    assert "#OAR -q regular" in h and "#OAR -t besteffort" in h

    h = header(OARCluster, cores=4, memory="8GB", memory_per_core_property_name="memcore")
    assert "#OAR -p memcore" in h and "walltime=" in h

    h = header(
        OARCluster,
        walltime="00:02:00",
        processes=4,
        cores=8,
        memory="8GiB",
        memory_per_core_property_name="mem_core",
    )
    assert "#OAR -l /nodes=1/core=8,walltime=00:02:00" in h and "#OAR -p mem_core>=1024" in h

    h = header(
        OARCluster,
        cores=5,
        memory="28MiB",
        job_extra_directives=["-p gpu_count=1"],
        memory_per_core_property_name="mem_core",
    )
    # OAR keeps the last -p: the user's property and the memory's are merged into it
    assert h.splitlines()[-1] == "#OAR -p 'gpu_count=1 AND mem_core>=6'"


def test_oar_job_script():
    s = script(
        OARCluster,
        walltime="00:02:00",
        processes=4,
        cores=8,
        memory="28GB",
        memory_per_core_property_name="memcore",
        job_script_prologue=['export LANG="en_US.utf8"'],
    )
    for part in (
        "#OAR -l /nodes=1/core=8,walltime=00:02:00",
        "#OAR -p memcore",
        'export LANG="en_US.utf8"',
        " -m hpcsched worker tcp://",
        "--nthreads 2",
        "--nworkers 4",
        "--memory-limit 7GB",
    ):
        assert part in s


def test_oar_custom_config_section():
    conf = {
        "queue": "myqueue",
        "project": "myproject",
        "cores": 1,
        "memory": "2 GB",
        "walltime": "00:02:00",
        "name": "myname",
        "processes": 1,
        "memory-per-core-property-name": "mem_core",
    }
    with config.set({"jobqueue.oar-config-name": conf}):
        h = header(OARCluster, config_name="oar-config-name")
    for line in (
        "#OAR -q myqueue",
        "#OAR --project myproject",
        "#OAR -n myname",
        "#OAR -l /nodes=1/core=1,walltime=00:02:00",
        "#OAR -p mem_core>=1908",
    ):
        assert line in h


def test_oar_warns_without_a_memory_property():
    with pytest.warns(UserWarning, match="memory_per_core_property_name"):
        OARSystem(cores=1, memory="1GB")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        OARSystem(cores=1, memory="1GB", memory_per_core_property_name="not_applicable")


def test_oar_differs_by_naming_the_output_files():
    """dask-jobqueue leaves OAR's ``OAR.<id>.stdout``/``.stderr`` in the submitting
    directory; hpcsched writes one log per job in log_directory (``-O``/``-E``)."""
    h = header(
        OARCluster,
        cores=1,
        memory="1GB",
        log_directory="/logs",
        memory_per_core_property_name="not_applicable",
    )
    out = [ln for ln in h.splitlines() if ln.startswith(("#OAR -O /logs/", "#OAR -E /logs/"))]
    assert len(out) == 2 and out[0][8:] == out[1][8:]


# ---------------------------------------------------------------- Moab


def test_moab_is_pbs_submitted_with_msub():
    h = header(
        MoabCluster,
        walltime="00:02:00",
        processes=4,
        cores=8,
        memory="28GB",
        job_name="dask-worker",
        queue="regular",
        account="DaskOnMoab",
    )
    for line in (
        "#PBS -N dask-worker",
        "#PBS -l select=1:ncpus=8:mem=27GB",
        "#PBS -l walltime=00:02:00",
        "#PBS -q regular",
        "#PBS -A DaskOnMoab",
    ):
        assert line in h
    calls = []
    with MoabCluster(cores=1, memory="1GB") as cluster:
        system = cluster.system
        system.run_command = lambda cmd, timeout, input=None: calls.append(cmd) or "\n1234\n"
        assert system.submit("/tmp/job.sh", "") == "1234"
        system.cancel(["1234"])
    assert calls == [["msub", "/tmp/job.sh"], ["canceljob", "1234"]]


# ---------------------------------------------------------------- Flux


def test_flux_job_script():
    s = script(
        FluxCluster,
        walltime="00:02:00",
        processes=2,
        cores=4,
        memory="8GB",
        queue="batch",
        account="proj",
    )
    for line in (
        "#flux: -N 1",
        "#flux: -n 1",
        "#flux: -c 4",
        "#flux: -t 120s",
        "#flux: -q batch",
        "#flux: --setattr=system.bank=proj",
    ):
        assert line in s.splitlines()
    assert any(ln.startswith("#flux: --output=") for ln in s.splitlines())
    assert "--nworkers 2" in s and "--memory-limit 4GB" in s
    s = script(FluxCluster, processes=2, cores=4, memory="8GB", launcher="flux")
    assert "#flux: -n 2" in s and "#flux: -c 2" in s and "exec flux run -n 2 " in s


# ---------------------------------------------------------------- inside a job


def test_each_system_reads_its_own_jobs_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "process_start", lambda: 1000.0)
    ad = tmp_path / ".job.ad"
    ad.write_text(
        'ClusterId = 42\nProcId = 3\nRequestCpus = 2\nRequestMemory = 954\nOwner = "me"\n'
    )
    job = detect_job({"_CONDOR_JOB_AD": str(ad)}, "node1")
    assert (job.system, job.job_id, job.node_cpus, job.node_memory) == (
        "htcondor",
        "42.3",
        2,
        954 * 2**20,
    )

    nodefile = tmp_path / "nodes"
    nodefile.write_text("node1\nnode1\nnode2\nnode1.cluster\n")
    job = detect_job(
        {"OAR_JOB_ID": "77", "OAR_NODEFILE": str(nodefile), "OAR_JOB_WALLTIME_SECONDS": "600"},
        "node1",
    )
    assert (job.system, job.job_id, job.node_cpus, job.walltime_end) == ("oar", "77", 3, 1600.0)

    # a Moab job under Torque has both ids: Moab's names the job its cluster submitted
    job = detect_job({"MOAB_JOBID": "1234", "PBS_JOBID": "99.torque", "PBS_NUM_PPN": "8"}, "n")
    assert (job.system, job.job_id, job.node_cpus) == ("moab", "1234", 8)
    assert detect_job({"PBS_JOBID": "99.torque"}, "n").system == "pbs"

    job = detect_job({"FLUX_JOB_ID": "ƒ2Tc8nHw", "SLURM_JOB_ID": "5"}, "n")
    assert (job.system, job.job_id) == ("flux", "ƒ2Tc8nHw")  # Flux started under SLURM
    assert detect_job({}, "n") is None


def test_each_system_is_asked_only_where_its_job_variables_are_set():
    # detect_job imports a system's module only where one of JOB_VARIABLES[module] is set:
    # a system whose in_job could answer without them would never be asked
    from hpcsched.jobqueue.systems import JOB_VARIABLES, SYSTEMS, system_class

    assert list(JOB_VARIABLES) == list(SYSTEMS)
    everything = {v: "7" for variables in JOB_VARIABLES.values() for v in variables}
    everything.update(NSLOTS="4", SGE_ROOT="/sge", PBS_NUM_PPN="2", FLUX_URI="")
    for module, variables in JOB_VARIABLES.items():
        cls = system_class(module)
        if cls.job_id_variables:
            assert variables == cls.job_id_variables, module
        others = {k: v for k, v in everything.items() if k not in variables}
        assert cls.in_job(others, "n") is None, module


def test_outside_a_job_no_batch_system_is_imported(tmp_path):
    import subprocess
    import sys

    code = ("import sys\n"
            "from hpcsched.launchers.resources import batch_job\n"
            "assert batch_job({'HOME': '/home/me'}, 'n') is None\n"
            "print(sorted(m for m in sys.modules if m.startswith('hpcsched.jobqueue.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['hpcsched.jobqueue.systems']"]
