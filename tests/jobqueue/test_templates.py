"""Job templates: each template's script on SLURM, SGE, PBS and LSF, the errors a bad
template gets, and the book's decisions per template (no process but the cluster's own
scheduler where a cluster is made)."""

from __future__ import annotations

import pytest

from hpcsched.core import config
from hpcsched.jobqueue.adoption import cluster_section, job_from_record, job_record
from hpcsched.jobqueue.book import Adjustment, JobBook
from hpcsched.jobqueue.job import Job, JobState
from hpcsched.jobqueue.systems.lsf import LSFSystem
from hpcsched.jobqueue.systems.pbs import PBSSystem
from hpcsched.jobqueue.systems.sge import SGESystem
from hpcsched.jobqueue.systems.slurm import SLURMSystem
from hpcsched.jobqueue.templates import JobTemplates

ADDRESS = "tcp://10.1.2.3:8786"
SECRET = "/shared/logs/.hpcsched-abc123.secret"
BASE = dict(cores=4, memory="16GB", processes=2, walltime="01:00:00", queue="cpu",
            python="/opt/py/bin/python3", log_directory="/shared/logs")
GPU = dict(queue="gpu", cores=8, memory="64GB", processes=4, resources={"GPU": 4})
BIGMEM = dict(memory="512GB", processes=1, walltime="04:00:00", job_name="fat")

#: system -> (its GPU template's extra directive, what its script says of the queue, of
#: the cores and of the memory of the GPU template)
EXPECT = {
    SLURMSystem: ("--gres=gpu:4", "#SBATCH -p gpu", "#SBATCH --cpus-per-task=8",
                  "#SBATCH --mem=60G"),
    SGESystem: ("-l gpu=4", "#$ -q gpu", "#$ -pe smp 8", "#$ -l mem_free=7630M"),
    PBSSystem: ("-l ngpus=4", "#PBS -q gpu", "select=1:ncpus=8:mem=60GB", "#PBS -q gpu"),
    LSFSystem: ('-gpu "num=4"', "#BSUB -q gpu", "#BSUB -n 8", "#BSUB -M 64000"),
}


@pytest.fixture(autouse=True)
def _fixed_config(isolated_config):
    with config.set({"worker.death-timeout": 60, "worker.walltime-margin": 60,
                     "worker.walltime-stagger": 30}):
        yield


def templates(system: type, **extra) -> JobTemplates:
    kw = dict(BASE, **({"lsf_units": "MB"} if system is LSFSystem else {}))
    gpu = dict(GPU, job_extra_directives=[EXPECT[system][0]])
    return JobTemplates(system, kw, {"gpu": gpu, "bigmem": BIGMEM, **extra})


@pytest.mark.parametrize("system", list(EXPECT), ids=lambda s: s.system)
def test_each_template_renders_its_own_job_and_workers(system):
    t = templates(system)
    extra, queue, cores, memory = EXPECT[system]
    gpu = t.system("gpu").render("hpcsched-gpu-abc123-0", ADDRESS, SECRET)
    cpu = t.system("default").render("hpcsched-abc123-0", ADDRESS, SECRET)
    for line in (extra, queue, cores, memory):
        assert line in gpu, (line, gpu)
        assert line not in cpu, (line, cpu)
    # four worker processes sharing the job's four GPUs: one each; the cluster's own
    # parameters it does not override (python, walltime) are the template's too
    assert "--resources GPU=1" in gpu and "--resources" not in cpu
    assert "--nworkers 4" in gpu and "--nworkers 2" in cpu
    assert "/opt/py/bin/python3 -m hpcsched worker" in gpu
    assert "--lifetime 3540" in gpu
    fat = t.system("bigmem")
    assert fat.params["job_name"] == "fat" and fat.params["queue"] == "cpu"
    assert fat.walltime_seconds == 4 * 3600 and fat.params["processes"] == 1


def test_a_template_that_names_cores_gets_processes_for_its_cores():
    t = JobTemplates(SLURMSystem, dict(cores=2, memory="4GB", log_directory="/l"),
                     {"wide": dict(cores=16)})
    assert t.system("default").params["processes"] == 2
    assert t.system("wide").params["processes"] == 4  # dask's default for 16 cores
    assert t.system("wide").params["nthreads"] == 4


@pytest.mark.parametrize("job_templates,error", [
    ({"default": {}}, "not a template name"),
    ({"1gpu": {}}, "not a template name"),
    ({"gpu": ["queue=gpu"]}, "must be a dict of job parameters"),
    ({"gpu": dict(log_directory="/x")}, "log_directory belong to the cluster as a whole"),
    ({"gpu": dict(scheduler_options={"port": 1})}, "belong to the cluster as a whole"),
    ({"gpu": dict(cores=0)}, "job_templates['gpu']: cores must be a positive integer"),
    ({"gpu": dict(qeue="gpu")}, "job_templates['gpu']: SLURMCluster got unexpected keyword"),
    ({"gpu": dict(resources={"GPU": -1})}, "resources['GPU']=-1: give a positive number"),
    ({"gpu": dict(resources={"GPU": 3}, cores=2, processes=2)}, "does not split evenly"),
    ({"gpu": dict(job_name="hpcsched")}, "two templates share a job_name"),
    ([("gpu", {})], "job_templates must be a dict"),
])
def test_a_bad_template_is_named_in_its_error(job_templates, error):
    with pytest.raises((TypeError, ValueError)) as info:
        JobTemplates(SLURMSystem, dict(cores=2, memory="4GB", log_directory="/l"),
                     job_templates)
    assert error in str(info.value)


def test_an_unknown_template_is_named_with_those_there_are():
    t = templates(SLURMSystem)
    with pytest.raises(ValueError, match="no job template 'gpus'; this cluster has "
                                         "'default', 'gpu', 'bigmem'"):
        t.system("gpus")
    assert t.check(None) == "default" and t.named
    assert t.resources("gpu") == {"GPU": 1.0} and t.workers_per_job("gpu") == 4


# ---------------------------------------------------------------- the book, per template
def book_with_gpu() -> JobBook:
    book = JobBook(workers_per_job=2, job_name="w", cluster_id="c0")
    book.add_template("gpu", "w-gpu")
    return book


def submit(book: JobBook, todo: Adjustment) -> list[Job]:
    """What the cluster does for one Adjustment: jobs of its template, ids counting up."""
    jobs = []
    for _ in range(todo.submit):
        name = book.take_name(todo.template)
        jobs.append(Job(str(book.next_index), name, f"/l/{name}.out", 2,
                        submit_time=book.next_index, template=todo.template))
    book.add(jobs)
    return jobs


def test_each_template_meets_its_own_target_with_its_own_jobs():
    book = book_with_gpu()
    book.set_target(2)
    book.set_target(1, "gpu")
    todos = book.adjustments()
    assert [(a.template, a.submit) for a in todos] == [("default", 2), ("gpu", 1)]
    jobs = [j for todo in todos for j in submit(book, todo)]
    assert [j.name for j in jobs] == ["w-c0-0", "w-c0-1", "w-gpu-c0-2"]
    assert book.adjustments() == []
    # fewer GPU jobs wanted: a GPU job goes, the CPU jobs stay
    book.set_target(0, "gpu")
    (todo,) = book.adjustments()
    assert todo.template == "gpu" and [j.name for j in todo.cancel] == ["w-gpu-c0-2"]
    assert len(book.active("default")) == 2 and book.active("gpu") == []


def test_retiring_a_job_lowers_its_own_templates_target_only():
    book = book_with_gpu()
    book.set_target(1)
    book.set_target(2, "gpu")
    for todo in book.adjustments():
        submit(book, todo)
    gpu_job = book.active("gpu")[0]
    book.worker_joined("tcp://n1:1", gpu_job.worker_names()[0])
    (stopped,) = book.stop(["tcp://n1:1"])
    assert stopped is gpu_job
    assert book.targets == {"default": 1, "gpu": 1} and book.adjustments() == []
    book.stop_all()
    assert book.targets == {"default": 0, "gpu": 0}
    assert all(j.cancel_requested for j in book.live())


def test_the_summary_counts_each_templates_jobs():
    book = book_with_gpu()
    assert book.summary() == "default: none; gpu: none"
    book.set_target(1, "gpu")
    (job,) = submit(book, book.adjustment("gpu"))
    job.state = JobState.RUNNING
    assert book.summary() == "default: none; gpu: 1 running"
    with pytest.raises(ValueError, match="no job template 'tpu'"):
        book.set_target(1, "tpu")


def test_a_journal_keeps_each_jobs_template():
    job = Job("7", "w-gpu-c0-3", "/l/w-gpu-c0-3.out", 4, template="gpu")
    again = job_from_record(job_record(job))
    assert again.template == "gpu" and again.expected_workers == 4
    section = cluster_section("slurm", "c0", 4, 1, [job], None, {"gpu": 2})
    assert section["targets"] == {"gpu": 2}
    # a record written before templates existed reads as the default template's
    old = {k: v for k, v in job_record(job).items() if k != "template"}
    assert job_from_record(old).template == "default"


def test_a_templates_workers_keep_to_its_resources_unless_it_says_otherwise():
    t = JobTemplates(SLURMSystem, dict(cores=2, memory="4GB", log_directory="/l"),
                     {"gpu": dict(resources={"GPU": 2}),
                      "shared": dict(resources={"GPU": 2}, resources_only=False)})
    render = {n: t.system(n).render(f"w-{n}-0", ADDRESS, SECRET) for n in t.names}
    assert "--resources GPU=1 --resources-only" in render["gpu"]
    assert "--resources GPU=1" in render["shared"] and "--resources-only" not in render["shared"]
    assert "--resources" not in render["default"]
    with pytest.raises(TypeError, match="resources_only must be True or False"):
        JobTemplates(SLURMSystem, dict(cores=2, memory="4GB", log_directory="/l"),
                     {"gpu": dict(resources={"GPU": 2}, resources_only="yes")})
