"""Job scripts of every system against golden files; parameters, config and validation.

Regenerate the golden files after an intended change with
``HPCSCHED_UPDATE_GOLDEN=1 python -m pytest tests/jobqueue/test_scripts.py`` and
review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcsched.core import config
from hpcsched.jobqueue.systems.lsf import LSFSystem, lsf_units
from hpcsched.jobqueue.systems.pbs import PBSSystem
from hpcsched.jobqueue.systems.sge import SGESystem
from hpcsched.jobqueue.systems.slurm import SLURMSystem

GOLDEN = Path(__file__).parent / "golden"
SYSTEMS = {"slurm": SLURMSystem, "sge": SGESystem, "pbs": PBSSystem, "lsf": LSFSystem}
ADDRESS = "tcp://10.1.2.3:8786"
SECRET = "/shared/logs/.hpcsched-abc123.secret"

FULL = dict(cores=8, memory="16GB", processes=2, walltime="01:00:00", queue="normal",
            account="proj42", python="/opt/py/bin/python3", log_directory="/shared/logs",
            local_directory="/tmp/hpcsched", job_extra_directives=[],
            job_script_prologue=["module load python/3.11", "source /opt/venv/bin/activate"])
EXTRA = {"slurm": ["--exclusive"], "sge": ["-l gpu=1"], "pbs": ["-m n"], "lsf": ["-x"]}

CASES = {
    "full": dict(FULL),
    "array": dict(FULL, processes=1),
    "minimal": dict(cores=1, memory="2GB", python="/usr/bin/python3", log_directory="/l"),
    "skip": dict(FULL, job_directives_skip=["-A ", "-P ", "-q ", "-p "]),
    "srun": dict(FULL, processes=4, launcher="srun"),
    # the shell outlives the worker to run the epilogue (dask-jobqueue's job_script_epilogue)
    "epilogue": dict(FULL, job_script_epilogue=['echo "worker exited"', "rm -rf /tmp/hpcsched"]),
    # what users copy from dask-jobqueue: variables the job's shell must expand, and a path
    # with a space that it must not split
    "vars": dict(cores=2, memory="4GB", python="$SOMEVAR/my env/bin/python",
                 local_directory="$TMPDIR", log_directory="/l",
                 worker_extra_args=["--resources", "GPU=${NGPUS}"]),
}


@pytest.fixture(autouse=True)
def _fixed_config(isolated_config):
    with config.set({"worker.death-timeout": 60, "worker.walltime-margin": 60,
                     "worker.walltime-stagger": 30}):
        yield


def render(system: str, case: str) -> str:
    kw = dict(CASES[case])
    if case in ("full", "skip"):
        kw["job_extra_directives"] = EXTRA[system]
    if system == "lsf":
        kw["lsf_units"] = "MB"
    s = SYSTEMS[system](**kw)
    return s.render("hpcsched-abc123-0", ADDRESS, SECRET, array=3 if case == "array" else None)


@pytest.mark.parametrize("system,case", [(s, c) for s in sorted(SYSTEMS) for c in sorted(CASES)
                                         if c != "srun" or s == "slurm"])
def test_golden_job_script(system, case):
    text = render(system, case)
    path = GOLDEN / f"{system}-{case}.sh"
    if os.environ.get("HPCSCHED_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}: run with HPCSCHED_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def test_script_carries_the_secret_file_never_the_secret():
    text = render("slurm", "full")
    assert f"export HPCSCHED_SECRET_FILE={SECRET}" in text
    assert "HPCSCHED_SECRET=" not in text


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_rendered_scripts_are_valid_shell(system, tmp_path):
    import subprocess

    for case in ("full", "array"):
        path = tmp_path / f"{system}-{case}.sh"
        path.write_text(render(system, case))
        subprocess.run(["bash", "-n", str(path)], check=True)


def test_srun_asks_for_one_task_per_worker():
    text = render("slurm", "srun")
    assert "#SBATCH -n 4\n#SBATCH --cpus-per-task=2\n" in text
    assert "exec srun -n 4 --cpu-bind=none /opt/py/bin/python3 -m hpcsched worker" in text


# ---------------------------------------------------------------- parameters

def test_config_then_env_then_kwargs(monkeypatch):
    with config.set({"jobqueue.slurm.queue": "from-config", "jobqueue.slurm.cores": 4,
                     "jobqueue.slurm.memory": "8GB"}):
        s = SLURMSystem()
        assert (s.queue, s.cores, s.memory_bytes) == ("from-config", 4, 8 * 10**9)
    monkeypatch.setenv("HPCSCHED_JOBQUEUE__SLURM__QUEUE", "from-env")
    monkeypatch.setenv("HPCSCHED_JOBQUEUE__SLURM__JOB_EXTRA_DIRECTIVES", "['--exclusive']")
    s = SLURMSystem(cores=2, memory="1GB")
    assert s.queue == "from-env" and s.job_extra_directives == ["--exclusive"]
    assert "#SBATCH -p from-env" in s.render("j", ADDRESS, None)
    assert SLURMSystem(cores=2, memory="1GB", queue="kwarg").queue == "kwarg"


def test_yaml_config_with_nested_scheduler_options(tmp_path, monkeypatch):
    cfg = tmp_path / "jq.yaml"
    cfg.write_text("jobqueue:\n  sge:\n    cores: 2\n    memory: 4GB\n    pe: mpi\n"
                   "    scheduler-options:\n      host: 10.9.8.7\n")
    monkeypatch.setenv("HPCSCHED_CONFIG", str(cfg))
    config.refresh()
    s = SGESystem()
    assert s.scheduler_options == {"host": "10.9.8.7"}
    assert "#$ -pe mpi 2" in s.render("j", ADDRESS, None)


def test_unknown_config_key_is_named(monkeypatch):
    monkeypatch.setenv("HPCSCHED_JOBQUEUE__PBS__QUEU", "x")
    with pytest.raises(ValueError, match=r"unknown parameter 'queu' in configuration jobqueue.pbs"):
        PBSSystem(cores=1, memory="1GB")


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(cores=2, memory="1GB", quue="x"), TypeError, "unexpected keyword argument.*quue"),
    (dict(memory="1GB"), ValueError, r"cluster = SLURMCluster\(cores=8, memory='1GB'\)"),
    (dict(cores=2), ValueError, r"cluster = SLURMCluster\(cores=2, memory='24GB'\)"),
    (dict(cores=2, memory="1GB", processes=3), ValueError, r"processes=3 > cores=2"),
    (dict(cores=2, memory="lots"), ValueError, "memory='lots' is not a size"),
    (dict(cores=2, memory="1GB", walltime="1 hour"), ValueError, "walltime='1 hour'"),
    (dict(cores=2, memory="1GB", walltime="1-01:30"), ValueError, "ambiguous"),
    (dict(cores=0, memory="1GB"), ValueError, "cores must be a positive integer"),
    (dict(cores="8", memory="1GB"), ValueError, "cores must be a positive integer"),
    (dict(cores=2, memory="1GB", job_extra_directives="--exclusive"), TypeError,
     "job_extra_directives must be a list of strings"),
    (dict(cores=2, memory="1GB", launcher="aprun"), ValueError, "launcher='aprun'"),
    (dict(cores=2, memory="1GB", job_name="9 lives"), ValueError, "job_name="),
    (dict(cores=2, memory="1GB", scheduler_options={"dashbord_address": ":0"}), ValueError,
     "scheduler_options: unknown key"),
    (dict(cores=2, memory="1GB", resource_spec="h_vmem=1G"), ValueError, "not a SLURM option"),
    (dict(cores=2, memory=16), ValueError, r"16 bytes.*did you mean '16GB'\?"),
    (dict(cores=2, memory="1000kB"), ValueError, r"less than 1 MiB"),
    (dict(cores=2, memory="1GB", protocol="tls://"), ValueError, "protocol='tls://'"),
    (dict(cores=2, memory="1GB", shebang="/bin/bash"), ValueError, "shebang"),
])
def test_bad_parameters_raise_naming_the_parameter(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SLURMSystem(**kwargs)


def test_project_is_an_alias_of_account_and_env_extra_of_prologue():
    with pytest.warns(FutureWarning) as record:
        s = PBSSystem(cores=1, memory="1GB", project="p1", env_extra=["export A=1"])
    assert sorted(str(w.message).split()[0] for w in record) == ["env_extra", "project"]
    text = s.render("j", ADDRESS, None)
    assert "#PBS -A p1" in text and "\nexport A=1\n" in text
    # on Grid Engine, project is the system's own word (-P) and account an alias of it
    assert "#$ -P p2" in SGESystem(cores=1, memory="1GB", account="p2").render("j", ADDRESS, None)
    with pytest.raises(ValueError, match="disagree"):
        SGESystem(cores=1, memory="1GB", account="a", project="b")


def test_sge_memory_is_per_slot_and_resource_configurable():
    s = SGESystem(cores=4, memory="8GiB", memory_resource="h_vmem")
    assert "#$ -l h_vmem=2048M" in s.render("j", ADDRESS, None)
    s1 = SGESystem(cores=1, memory="1GiB")
    text = s1.render("j", ADDRESS, None)
    assert "-pe" not in text and "#$ -l mem_free=1024M" in text
    with pytest.raises(ValueError, match="memory_resource"):
        SGESystem(cores=1, memory="1GB", memory_resource="ram")


def test_lsf_memory_units_from_lsf_conf(tmp_path, monkeypatch):
    (tmp_path / "lsf.conf").write_text("# site\nLSF_UNIT_FOR_LIMITS=GB\n")
    assert lsf_units(str(tmp_path)) == "GB"
    monkeypatch.setenv("LSF_ENVDIR", str(tmp_path))
    s = LSFSystem(cores=2, memory="3GiB", walltime="01:30:30")
    text = s.render("j", ADDRESS, None)
    assert "#BSUB -M 4\n" in text  # dask-jobqueue's count: 3 GiB / 1000**3, rounded up
    assert "#BSUB -W 01:31\n" in text  # rounded up to whole minutes
    monkeypatch.setenv("LSF_ENVDIR", str(tmp_path / "nowhere"))
    if not os.path.exists("/etc/lsf.conf"):
        assert LSFSystem(cores=1, memory="1MiB").lsf_units == "KB"
        assert "#BSUB -M 1049\n" in LSFSystem(cores=1, memory="1MiB").render("j", ADDRESS, None)
