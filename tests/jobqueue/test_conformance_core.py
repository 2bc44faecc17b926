"""Conformance with dask-jobqueue 0.9's JobQueueCluster (its test_jobqueue_core.py and
its documented ``jobqueue.yaml``), rebuilt as hpcsched tests: the worker command, the
defaults, scheduler options and addresses, dask's configuration files, the cluster's
methods. Deliberate differences are named ``..._differs_...`` with the reason.
"""

from __future__ import annotations

import logging
import re
import socket
import sys
import textwrap
import warnings

import pytest

from hpcsched.core import config
from hpcsched.core.comm import hosts
from hpcsched.jobqueue.cluster import JobQueueCluster
from hpcsched.jobqueue.clusters import LSFCluster, PBSCluster, SGECluster, SLURMCluster
from hpcsched.launchers import address

pytestmark = pytest.mark.usefixtures("isolated_config")
CLUSTERS = [SLURMCluster, PBSCluster, SGECluster, LSFCluster]


@pytest.fixture(params=CLUSTERS, ids=lambda c: c.__name__)
def Cluster(request):  # noqa: N802 - a class, as in dask-jobqueue's tests
    return request.param


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def test_command_template(Cluster):
    with Cluster(cores=2, memory="4GB") as c:
        s = c.job_script()
        assert f"{sys.executable} -m hpcsched worker" in s
        assert all(p in s for p in (" --nthreads 1", " --memory-limit ", " --name "))
    with Cluster(cores=2, memory="4GB", death_timeout=60, local_directory="/scratch",
                 worker_extra_args=["--resources", "GPU=1"]) as c:
        s = c.job_script()
        assert " --death-timeout 60" in s and " --local-directory /scratch" in s
        assert " --resources GPU=1" in s


def test_worker_command_names_the_module_the_job_runs(Cluster):
    """dask-jobqueue's ``worker_command`` picks the worker program. dask-jobqueue's own
    default (in the jobqueue.yaml it installs) means the usual worker: hpcsched's."""
    for default in (None, "distributed.cli.dask_worker", "hpcsched", "hpcsched worker"):
        with Cluster(cores=2, memory="4GB", worker_command=default) as c:
            assert " -m hpcsched worker tcp://" in c.job_script()
    with Cluster(cores=2, memory="4GB", worker_command="mysite.gpu_worker --gpus 2") as c:
        assert " -m mysite.gpu_worker --gpus 2 tcp://" in c.job_script()
        assert "hpcsched worker" not in c.job_script()


def test_worker_command_differs_a_dask_worker_program_is_refused_saying_what_to_use(Cluster):
    """An hpcsched scheduler speaks only to hpcsched workers: dask_cuda's worker (the
    reason dask-jobqueue users set worker_command) cannot join it."""
    for dask_worker in ("dask_cuda.cli", "dask_cuda.cli cuda worker",
                        "distributed.cli.dask_spec"):
        with pytest.raises(ValueError, match=re.escape(
                f"worker_command={dask_worker!r} starts a dask.distributed worker")) as e:
            Cluster(cores=2, memory="4GB", worker_command=dask_worker)
        assert "--resources" in str(e.value) and "CUDA_VISIBLE_DEVICES" in str(e.value)
    with pytest.raises(ValueError, match="runs no hpcsched worker with 'python -m'"):
        Cluster(cores=2, memory="4GB", worker_command="hpcsched.launchers.cli")
    with pytest.raises(ValueError, match="give the Python module the job runs"):
        Cluster(cores=2, memory="4GB", worker_command="/usr/bin/dask-worker")


def test_nanny_false_is_logged_as_ignored(Cluster, caplog):
    with caplog.at_level(logging.INFO, logger="hpcsched.jobqueue"):
        with Cluster(cores=2, memory="4GB", nanny=False):
            pass
    assert "nanny=False is ignored" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hpcsched.jobqueue"):
        with Cluster(cores=2, memory="4GB", worker_command="distributed.cli.dask_worker",
                     nanny=True):
            pass
    assert "ignored" not in caplog.text  # dask-jobqueue's defaults say nothing


def test_job_script_epilogue_runs_after_the_worker(Cluster):
    """dask-jobqueue 0.9's ``job_script_epilogue``: lines after the worker command; the
    job ends with the worker's exit status, not the epilogue's."""
    epilogue = ["echo worker done", 'rm -rf "$TMPDIR/scratch"']
    with Cluster(cores=2, memory="4GB", job_script_prologue=["echo start"],
                 job_script_epilogue=epilogue) as c:
        lines = c.job_script().splitlines()
    worker = next(i for i, ln in enumerate(lines) if " -m hpcsched worker " in ln)
    assert not lines[worker].startswith("exec ")  # the shell must outlive the worker
    assert lines.index("echo start") < worker
    assert lines[worker + 1:] == ["worker_status=$?", *epilogue, "exit $worker_status"]
    with Cluster(cores=2, memory="4GB") as c:
        assert c.job_script().splitlines()[-1].startswith("exec ")


def test_shebang_settings(Cluster):
    with Cluster(cores=2, memory="4GB", shebang="#!/usr/bin/python") as c:
        s = c.job_script()
        assert s.startswith("#!/usr/bin/python") and "bash" not in s.splitlines()[0]
    with Cluster(cores=2, memory="4GB") as c:
        assert c.job_script().startswith("#!/usr/bin/env bash")


def test_default_number_of_worker_processes(Cluster):
    for cores, workers, threads in ((4, 4, 1), (6, 3, 2), (8, 4, 2), (1, 1, 1)):
        with Cluster(cores=cores, memory="4GB") as c:
            s = c.job_script()
            assert f" --nworkers {workers}" in s and f" --nthreads {threads}" in s


def test_memory_as_a_number_is_bytes_and_tiny_memory_is_refused(Cluster):
    with Cluster(cores=2, memory=2 * 10**9, processes=1) as c:
        assert "--memory-limit 2GB" in c.job_script()
    with pytest.raises(ValueError, match=r"memory=16 is 16 bytes.*did you mean '16GB'\?"):
        Cluster(cores=2, memory=16)


def test_dashboard_link_carries_the_token(Cluster):
    """As dask-jobqueue's, the link of the scheduler's dashboard; hpcsched's carries the
    access token derived from the cluster's secret."""
    with Cluster(cores=1, memory="1GB") as c:
        assert c.dashboard_link.startswith("http://") and "/status?token=" in c.dashboard_link


def test_forward_ip_and_routable_default(Cluster):
    with Cluster(cores=8, processes=4, memory="28GB",
                 scheduler_options={"host": "127.0.0.1"}) as c:
        assert c.scheduler_address.startswith("tcp://127.0.0.1:")
        assert f" {c.scheduler_address} " in c.job_script()
    if address.routable_address() is None:
        pytest.skip("this machine has no routable address")
    with Cluster(cores=8, processes=4, memory="28GB") as c:
        host = c.scheduler_address.split("://")[1].rsplit(":", 1)[0]
        assert host == address.routable_address() and not host.startswith("127.")
        assert f" {c.scheduler_address} " in c.job_script()


def test_loopback_only_is_an_error_unless_asked_for(Cluster, monkeypatch):
    monkeypatch.setattr(address, "route_source", lambda target: None)
    monkeypatch.setattr(hosts, "up_interfaces", lambda: {"lo": ["127.0.0.1"]})
    with pytest.raises(address.NoRoutableAddress, match="interface='lo'"):
        Cluster(cores=1, memory="1GB")
    with Cluster(cores=1, memory="1GB", interface="lo") as c:  # the user says so
        assert c.scheduler_address.startswith("tcp://127.0.0.1:")
        assert " --interface lo" in c.job_script()


def test_scheduler_options_interface_and_port(Cluster):
    port = free_port("127.0.0.1")
    with Cluster(cores=1, memory="1GB", scheduler_options={"interface": "lo", "port": port}) as c:
        assert c.scheduler_address == f"tcp://127.0.0.1:{port}"
    # scheduler on one interface, workers told another
    with Cluster(cores=1, memory="1GB", interface="worker-interface",
                 scheduler_options={"interface": "lo"}) as c:
        assert c.scheduler_address.startswith("tcp://127.0.0.1:")
        assert " --interface worker-interface" in c.job_script()
    with Cluster(cores=1, memory="1GB", interface="worker-interface",
                 scheduler_options={"host": "127.0.0.1"}) as c:
        assert c.scheduler_address.startswith("tcp://127.0.0.1:")
        assert " --interface worker-interface" in c.job_script()


def test_scheduler_options_from_config_replaced_by_keyword(Cluster):
    port = free_port("127.0.0.1")
    section = Cluster.system_class.system
    with config.set({f"jobqueue.{section}.scheduler-options": {"interface": "lo", "port": port}}):
        with Cluster(cores=2, memory="2GB") as c:
            assert c.scheduler_address == f"tcp://127.0.0.1:{port}"
        with Cluster(cores=2, memory="2GB", scheduler_options={"interface": "lo"}) as c:
            assert c.scheduler_address != f"tcp://127.0.0.1:{port}"


def test_host_and_dashboard_address_go_through_scheduler_options(Cluster):
    for kw in ({"host": "127.0.0.1"}, {"dashboard_address": ":8787"}):
        (key,) = kw
        with pytest.raises(ValueError, match=f"pass {key!r} through 'scheduler_options'"):
            Cluster(cores=1, memory="1GB", **kw)
    with Cluster(cores=1, memory="1GB", interface="lo",
                 scheduler_options={"dashboard_address": "127.0.0.1:0"}) as c:
        assert c.dashboard_link.startswith("http://127.0.0.1:")
        assert not c.dashboard_link.startswith("http://127.0.0.1:0/")


def test_wrong_parameter_error_names_it(Cluster):
    """dask-jobqueue raises ValueError; hpcsched a TypeError, as Python does for an
    unexpected keyword argument, naming the class, the parameter and the known ones."""
    match = rf"{Cluster.__name__} got unexpected keyword argument.+wrong_parameter.+cores.+memory"
    with pytest.raises(TypeError, match=match):
        Cluster(cores=1, memory="1GB", wrong_parameter="wrong_parameter_value")


def test_log_directory_is_created(Cluster, tmp_path):
    target = tmp_path / "logs"
    with Cluster(cores=1, memory="1GB"):
        assert not target.exists()
    with Cluster(cores=1, memory="1GB", log_directory=str(target)):
        assert target.is_dir()


def test_cluster_without_batch_system():
    with pytest.raises(ValueError, match="specify a Job type.+'job_cls' class variable of "
                                         "JobQueueCluster"):
        JobQueueCluster(cores=4, memory="1GB")


def test_job_cls_as_a_class_variable_or_keyword():
    """dask-jobqueue's way to bring a batch system of one's own: a ``job_cls`` class
    variable of a JobQueueCluster subclass, or ``job_cls=``; a subclass of a cluster that
    names its own wins over the class it derives from."""
    from hpcsched.jobqueue.systems.slurm import SLURMSystem

    class PartitionedSLURM(SLURMSystem):
        def queue_account_directives(self):
            return ["-p fast"]

    class MyCluster(JobQueueCluster):
        job_cls = PartitionedSLURM

    class MySLURMCluster(SLURMCluster):
        system_class = PartitionedSLURM

    for made in (lambda: MyCluster(cores=1, memory="1GB"),
                 lambda: MySLURMCluster(cores=1, memory="1GB"),
                 lambda: JobQueueCluster(cores=1, memory="1GB", job_cls=PartitionedSLURM)):
        with made() as cluster:
            assert "#SBATCH -p fast" in cluster.job_header
    assert SLURMCluster.job_cls is SLURMSystem


def test_a_batch_system_without_a_configuration_section_is_named():
    from hpcsched.jobqueue.base import BatchSystem

    class MyJob(BatchSystem):
        pass

    with pytest.raises(ValueError, match="MyJob has no 'system' class variable"):
        MyJob(cores=1, memory="1GB")


def test_a_batch_system_shows_its_script_before_any_cluster():
    from hpcsched.jobqueue.systems.pbs import PBSSystem

    script = PBSSystem(cores=1, memory="1GB", job_name="foobar").job_script()
    assert "#PBS -N foobar" in script
    assert "-m hpcsched worker SCHEDULER_ADDRESS --name foobar" in script


def test_deprecated_aliases_warn_and_the_new_name_wins(Cluster):
    warnings.simplefilter("always")
    with pytest.warns(FutureWarning) as record:
        with Cluster(cores=1, memory="1GB", extra=["--resources", "A=1"], job_extra=["-x y"],
                     env_extra=["export OLD=1"], header_skip=["-o "]) as c:
            s = c.job_script()
    renamed = sorted(str(w.message).split()[0] for w in record if w.category is FutureWarning)
    assert renamed == ["env_extra", "extra", "header_skip", "job_extra"]
    assert "--resources A=1" in s and " -x y" in s and "export OLD=1" in s
    assert " -o " not in c.job_header
    with pytest.warns(FutureWarning, match="env_extra has been renamed"):
        with Cluster(cores=1, memory="1GB", env_extra=["export OLD=1"],
                     job_script_prologue=["export NEW=1"]) as c:
            s = c.job_script()
    assert "export NEW=1" in s and "export OLD=1" not in s


def test_cluster_keywords_of_dask_jobqueue(Cluster, caplog):
    with caplog.at_level(logging.INFO, logger="hpcsched.jobqueue"):
        with Cluster(cores=1, memory="1GB", name="my-cluster", silence_logs="error",
                     security=True, loop=None, n_workers=0) as c:
            assert c.name == "my-cluster"
            assert c.plan == c.requested == c.observed == set()
            assert c.get_logs() == {"Cluster": ""}
    assert "silence_logs='error' is ignored" in caplog.text
    with pytest.raises(ValueError, match="asynchronous=True"):
        Cluster(cores=1, memory="1GB", asynchronous=True)
    with pytest.raises(ValueError, match="protocol='tls://'"):
        Cluster(cores=1, memory="1GB", protocol="tls://")


def test_shared_temp_directory_holds_the_secret_file(Cluster, tmp_path):
    with Cluster(cores=1, memory="1GB", shared_temp_directory=str(tmp_path / "shared")) as c:
        assert c.secret_file.startswith(str(tmp_path / "shared") + "/")
        assert f"HPCSCHED_SECRET_FILE={c.secret_file}" in c.job_script()


# ---------------------------------------------------------------- dask's jobqueue.yaml

#: every key of the slurm/pbs/sge/lsf sections of dask-jobqueue 0.9's default jobqueue.yaml
#: with its default value, plus sections for systems hpcsched does not have
COMMON_KEYS = """\
    name: dask-worker
    cores: 8
    memory: 28GB
    processes: null
    python: null
    interface: null
    death-timeout: 60
    local-directory: null
    shared-temp-directory: null
    extra: null
    worker-command: "distributed.cli.dask_worker"
    worker-extra-args: []
    shebang: "#!/usr/bin/env bash"
    queue: null
    env-extra: null
    job-script-prologue: []
    job-extra: null
    job-extra-directives: []
    job-directives-skip: []
    log-directory: null
    scheduler-options: {}
"""
SECTIONS = {
    "slurm": "account: null\nwalltime: '00:30:00'\njob-cpu: null\njob-mem: null\n",
    "pbs": "account: null\nwalltime: '00:30:00'\nresource-spec: null\n",
    "sge": "project: null\nwalltime: '00:30:00'\nresource-spec: null\n",
    "lsf": "project: null\nwalltime: '00:30'\nncpus: null\nmem: null\nlsf-units: mb\n"
           "use-stdin: True\n",
    "oar": "project: null\nwalltime: '00:30:00'\nresource-spec: null\n"
           "memory-per-core-property-name: null\n",
    "htcondor": "disk: null\nsubmit-command-extra: []\ncancel-command-extra: []\n",
}
#: the directives dask-jobqueue 0.9 renders from that file (its slurm.py, pbs.py, sge.py,
#: lsf.py), apart from the differences named in test_conformance_scripts
DIRECTIVES = {
    SLURMCluster: ["#SBATCH -J dask-worker", "#SBATCH -n 1", "#SBATCH --cpus-per-task=8",
                   "#SBATCH --mem=27G", "#SBATCH -t 00:30:00"],
    PBSCluster: ["#PBS -N dask-worker", "#PBS -l select=1:ncpus=8:mem=27GB",
                 "#PBS -l walltime=00:30:00"],
    SGECluster: ["#$ -N dask-worker", "#$ -l h_rt=00:30:00", "#$ -cwd", "#$ -j y"],
    LSFCluster: ["#BSUB -J dask-worker", "#BSUB -n 8", '#BSUB -R "span[hosts=1]"',
                 "#BSUB -M 28000", "#BSUB -W 00:30"],
}


def default_jobqueue_yaml() -> str:
    out = ["jobqueue:"]
    for name, extra in SECTIONS.items():
        out.append(f"  {name}:")
        out.append(COMMON_KEYS.rstrip())
        out.append(textwrap.indent(extra, "    ").rstrip())
    return "\n".join(out) + "\n"


def test_dask_jobqueue_default_configuration_loads_and_renders_its_directives(
        Cluster, tmp_path, monkeypatch, reread_dask_config):
    home = tmp_path / "home"
    (home / ".config" / "dask").mkdir(parents=True)
    (home / ".config" / "dask" / "jobqueue.yaml").write_text(default_jobqueue_yaml())
    monkeypatch.setenv("HOME", str(home))
    reread_dask_config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # null deprecated keys warn about nothing
        with Cluster() as c:
            h = c.job_header
            s = c.job_script()
    for line in DIRECTIVES[Cluster]:
        assert line in h.splitlines() or any(ln.startswith(line + "-") for ln in h.splitlines())
    assert " --nworkers 4 " not in s and s.rstrip().endswith("--nworkers 4")
    assert " --nthreads 2 " in s and " --death-timeout 60 " in s


def test_hpcsched_configuration_wins_over_dask_configuration(tmp_path, monkeypatch,
                                                             reread_dask_config):
    dask_dir = tmp_path / "dask"
    dask_dir.mkdir()
    (dask_dir / "jq.yaml").write_text("jobqueue:\n  slurm:\n    cores: 2\n    memory: 2GB\n"
                                      "    queue: from-dask\n")
    monkeypatch.setenv("DASK_CONFIG", str(dask_dir))
    reread_dask_config()
    with SLURMCluster() as c:
        assert "#SBATCH -p from-dask" in c.job_header
    monkeypatch.setenv("DASK_JOBQUEUE__SLURM__QUEUE", "from-dask-env")
    reread_dask_config()
    with SLURMCluster() as c:
        assert "#SBATCH -p from-dask-env" in c.job_header
    with config.set({"jobqueue.slurm.queue": "from-hpcsched"}):
        with SLURMCluster() as c:
            assert "#SBATCH -p from-hpcsched" in c.job_header
        with SLURMCluster(queue="from-keyword") as c:
            assert "#SBATCH -p from-keyword" in c.job_header


def test_dask_config_set_in_the_process_counts_as_in_dask_jobqueue():
    """dask-jobqueue's documented way in a notebook: ``dask.config.set`` before the
    cluster, globally or as a context manager; hpcsched's own setting still wins."""
    dask_config = pytest.importorskip("dask.config")
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ValueError, match="You must specify how many cores and how much memory"):
        SLURMCluster()
    with dask_config.set({"jobqueue.slurm.cores": 2, "jobqueue.slurm.memory": "2GB",
                          "jobqueue.slurm.walltime": "01:00:00",
                          "jobqueue.slurm.local-directory": "/scratch/me",
                          "jobqueue.slurm.scheduler-options": {"port": port}}):
        with SLURMCluster() as c:
            assert c.scheduler_address.endswith(f":{port}")
            assert {"#SBATCH -n 1", "#SBATCH --cpus-per-task=2", "#SBATCH -t 01:00:00"} \
                <= set(c.job_header.splitlines())
            assert "--mem=" in c.job_header and " --local-directory /scratch/me" in c.job_script()
        with config.set({"jobqueue.slurm.walltime": "00:20:00"}):
            with SLURMCluster() as c:
                assert "#SBATCH -t 00:20:00" in c.job_header
    with pytest.raises(ValueError, match="You must specify how many cores"):
        SLURMCluster()  # the context manager's values are gone with it
    dask_config.set({"jobqueue.pbs.cores": 3, "jobqueue.pbs.memory": "3GB"})  # isolated_config
    with PBSCluster() as c:                                                     # undoes it
        assert "#PBS -l select=1:ncpus=3:mem=2862MB" in c.job_header


def test_without_dask_its_files_and_variables_are_still_read(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dask", None)  # import dask.config raises ImportError
    monkeypatch.setitem(sys.modules, "dask.config", None)
    (tmp_path / "jq.yaml").write_text("jobqueue:\n  slurm:\n    cores: 2\n    memory: 2GB\n")
    monkeypatch.setenv("DASK_CONFIG", str(tmp_path))
    monkeypatch.setenv("DASK_JOBQUEUE__SLURM__QUEUE", "debug")
    with SLURMCluster() as c:
        assert {"#SBATCH --cpus-per-task=2", "#SBATCH -p debug"} <= set(c.job_header.splitlines())


def test_bad_dask_configuration_file_is_named(tmp_path, monkeypatch, reread_dask_config):
    bad = tmp_path / "jobqueue.yaml"
    bad.write_text("jobqueue: [1, 2]\n")
    monkeypatch.setenv("DASK_CONFIG", str(bad))
    reread_dask_config()
    with pytest.raises(ValueError, match=re.escape(f"{bad}: 'jobqueue' must be a mapping")):
        SLURMCluster(cores=1, memory="1GB")


def test_scale_by_memory_to_none_and_adapt_by_cores_and_memory():
    """dask's ``scale(memory="0GB")`` asks for no job; ``adapt(minimum_cores=,
    maximum_memory=)`` bounds the workers by their threads and memory, as
    distributed's SpecCluster.adapt counts them (nothing is submitted here: no task)."""
    with SLURMCluster(cores=2, processes=1, memory="2GB") as cluster:
        cluster.scale(memory="0GB")
        assert cluster.book.target_jobs == 0
        with pytest.raises(ValueError, match="memory"):
            cluster.scale(memory="lots")
        adaptive = cluster.adapt(minimum_cores=3, maximum_memory="4GB")
        assert (adaptive.minimum, adaptive.maximum) == (2, 2)
        adaptive.stop()
