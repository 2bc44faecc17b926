"""A batch cluster's process dies and comes back: its jobs are adopted, not lost or leaked.

The process holding a ``SLURMCluster(..., scheduler_journal=J)`` (a notebook kernel, here
a child process) is killed in the middle of a graph that a client in another process
(this one) submitted. The same code run again with the same journal -- as a user re-runs
the notebook's cells -- adopts the jobs still running: the batch system lists the same
job ids, none was cancelled, their workers come back with the results they hold, the
client's ``gather`` returns the right results and no task ran twice; ``close()`` then
leaves no job. A cluster whose process never comes back: its jobs end within the
workers' reconnect timeout + 10 s.

Each task appends a byte to a file of its own, so the files count executions. Every
process a test starts is killed, and every job it submitted cancelled, also when it fails.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpcsched import Client
from hpcsched.core import config
from tests.jobqueue.batch import CLASSES, ROOT, Batch, numeric, unfinished
from tests.launchers.counting import counted, runs

N = 2000
#: the batch system's own cancel command: what the tests fall back on when they fail
CANCEL = {"slurm": ["scancel"], "sge": ["qdel"], "pbs": ["qdel"], "lsf": ["bkill"]}

OWNER = """
import json, os, shlex, sys, time
from hpcsched.core import config
from hpcsched.core.comm.scheduler_file import write_scheduler_file
from hpcsched.jobqueue.clusters import {cls} as C

journal, logs, sfile, name, reconnect, jobs, stop, job_kwargs, scaling = sys.argv[1:10]
with config.set({{"jobqueue.poll-interval": 0.2}}):
    cluster = C(memory="300MB", walltime="00:10:00", log_directory=logs, **json.loads(job_kwargs),
                job_name=name, scheduler_journal=journal,
                worker_extra_args=["--scheduler-reconnect-timeout", reconnect],
                # PBS does not pass the environment on: the tasks' module must import
                job_script_prologue=["export PYTHONPATH=" +
                                     shlex.quote(os.environ.get("PYTHONPATH", ""))])
if scaling == "scale":  # run again, the cell asks for what it asked for before
    cluster.scale(jobs=int(jobs))
elif scaling == "adapt":
    cluster.adapt(minimum_jobs=int(jobs), maximum_jobs=int(jobs), interval="200ms")
cluster.wait_for_workers(int(jobs), timeout=150)
write_scheduler_file(sfile, cluster.scheduler_address, cluster.security)
if cluster.adaptive is not None:
    print("adapt", cluster.adaptive.policy.minimum, cluster.adaptive.policy.maximum, flush=True)
print("jobs", " ".join(sorted(cluster.jobs)), flush=True)
while not os.path.exists(stop):  # the test says when the campaign is over
    if os.path.exists(stop + "-exit"):  # or that the process ends without close()
        os.unlink(stop + "-exit")
        sys.exit(0)
    time.sleep(0.1)
print("at-close", " ".join(sorted(j.job_id for j in cluster.jobs.values() if not j.ended)),
      flush=True)
cluster.close()
print("closed", flush=True)
"""


class Owner:
    """The process holding the cluster, started (and started again) with one journal."""

    def __init__(self, b: Batch, tmp: Path, reconnect: float, jobs: int,
                 job_kwargs: dict | None = None):
        self.batch, self.tmp = b, tmp
        self.name = f"adopt{secrets.token_hex(3)}"  # its jobs' names: found even if it fails
        self.sfile, self.stop = tmp / "scheduler.json", tmp / "stop"
        self.code = OWNER.format(cls=CLASSES[b.system].__name__)
        self.args = [str(tmp / "journal"), str(b.log_dir), str(self.sfile), self.name,
                     str(reconnect), str(jobs), str(self.stop),
                     json.dumps(job_kwargs or {"cores": 1})]
        self.procs: list[subprocess.Popen] = []
        self.ids: set[str] = set()

    def start(self, scaling: str = "scale") -> subprocess.Popen:
        """Run the cluster's code; ``scaling``: call ``scale``, ``adapt``, or neither."""
        n = len(self.procs)
        out = open(self.tmp / f"owner-{n}.log", "wb")  # noqa: SIM115 - closed below
        env = dict(self.batch.env, PYTHONPATH=str(ROOT) + os.pathsep +
                   self.batch.env.get("PYTHONPATH", ""))
        p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(self.code), *self.args,
                              scaling],
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, cwd=ROOT)
        out.close()
        self.procs.append(p)
        return p

    def log(self, n: int) -> str:
        return (self.tmp / f"owner-{n}.log").read_text(errors="replace")

    def line(self, n: int, word: str, timeout: float = 180) -> list[str]:
        """The words after ``word`` on the line the ``n``-th run prints starting with it."""
        deadline = time.monotonic() + timeout
        while True:
            line = next((ln for ln in self.log(n).splitlines()
                         if ln.startswith(f"{word} ")), None)
            if line is not None:
                return line.split()[1:]
            if self.procs[n].poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"run {n} of the cluster's process printed no "
                                     f"{word!r}:\n{self.log(n)[-3000:]}")
            time.sleep(0.2)

    def jobs(self, n: int, timeout: float = 180) -> set[str]:
        """The job ids the ``n``-th run prints once its workers are connected."""
        deadline = time.monotonic() + timeout
        while True:
            line = next((ln for ln in self.log(n).splitlines() if ln.startswith("jobs ")), None)
            if line is not None:
                ids = set(line.split()[1:])
                self.ids |= ids
                self.batch.ids |= {numeric(i) for i in ids}
                return ids
            if self.procs[n].poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"run {n} of the cluster's process printed no jobs:\n"
                                     f"{self.log(n)[-3000:]}")
            time.sleep(0.2)

    def kill(self, n: int, sig: int = signal.SIGKILL) -> None:
        self.procs[n].send_signal(sig)
        self.procs[n].wait(60)

    def cleanup(self) -> None:
        """Kill what runs, cancel what is queued: this test's jobs, by id and by name."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        ids = {numeric(i) for i in self.ids} | self._ids_by_name()
        ids &= unfinished(self.batch.system, self.batch.env)
        if ids:
            subprocess.run([*CANCEL[self.batch.system], *sorted(ids)], capture_output=True,
                           timeout=30, env=self.batch.env)

    def _ids_by_name(self) -> set[str]:
        if self.batch.system != "slurm":
            return set()
        out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                             timeout=30, env=self.batch.env).stdout
        return {ln.split()[0] for ln in out.splitlines()
                if len(ln.split()) == 2 and ln.split()[1].startswith(self.name)}


@pytest.fixture
def owner_of(batch, tmp_path):
    made: list[Owner] = []

    def make(reconnect: float, jobs: int) -> Owner:
        made.append(Owner(batch, tmp_path, reconnect, jobs))
        return made[-1]

    try:
        yield make
    finally:
        for o in made:
            o.cleanup()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("batch,how,scaling", [
    pytest.param("slurm", "sigkill", "scale", marks=pytest.mark.slurm),
    pytest.param("slurm", "sigterm", "adapt", marks=pytest.mark.slurm),
    pytest.param("slurm", "exit", "scale", marks=pytest.mark.slurm),
    pytest.param("sge", "sigkill", "scale", marks=pytest.mark.sge),
    ("pbs", "sigkill", "scale"), ("lsf", "sigkill", "scale"),
], indirect=["batch"])
def test_a_restarted_cluster_adopts_its_jobs_and_the_client_gets_its_results(
        batch, how, scaling, owner_of, tmp_path):
    """SIGKILL (or SIGTERM, or the interpreter's exit: a process ending without close())
    mid-graph; the same code with the same journal adopts the jobs; the client's gather
    is right; nothing ran twice.
    A cluster that adapted adapts again after the restart without being asked, counting
    the adopted jobs: it neither submits nor cancels one."""
    owner = owner_of(reconnect=120, jobs=2)
    done = tmp_path / "runs"
    done.mkdir()
    owner.start(scaling)
    first = owner.jobs(0)
    assert len(first) == 2 and {numeric(i) for i in first} <= \
        unfinished(batch.system, batch.env)
    with config.set({"client.scheduler-reconnect-timeout": 120}):
        client = Client(str(owner.sfile), set_as_default=False)
    try:
        futures = client.map(counted, range(N), directory=str(done))
        deadline = time.monotonic() + 120
        while len(list(done.iterdir())) < N // 2:
            assert time.monotonic() < deadline, "half the tasks did not run in 120 s"
            erred = next((f for f in futures if f.status == "error"), None)
            assert erred is None, erred.exception()
            time.sleep(0.05)
        if how == "exit":
            Path(f"{owner.stop}-exit").touch()
            assert owner.procs[0].wait(60) == 0, owner.log(0)
        else:
            owner.kill(0, signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
        assert len(runs(done)) < N, "the graph finished before the process was killed"
        # the jobs run on without their scheduler
        assert {numeric(i) for i in first} <= unfinished(batch.system, batch.env)
        # the notebook run again (a cluster that adapted is not told to adapt again)
        owner.start("scale" if scaling == "scale" else "neither")
        restarted = time.monotonic()
        again = owner.jobs(1)
        assert again == first, (first, again, owner.log(1))  # adopted: the same jobs
        if scaling == "adapt":
            assert owner.line(1, "adapt") == ["2", "2"]  # the journal's adapt settings
        results = client.gather(futures, timeout=120)
        took = time.monotonic() - restarted
        assert results == [2 * i for i in range(N)]
        assert took < 30, f"the results came {took:.1f} s after the restart"
        after = runs(done)
        assert len(after) == N
        rerun = sorted(k for k, n in after.items() if n > 1)
        assert not rerun, f"{len(rerun)} tasks ran again: {rerun[:10]}"
        assert {numeric(i) for i in first} <= unfinished(batch.system, batch.env)  # none cancelled
    finally:
        client.close(timeout=2)
    owner.stop.touch()
    assert set(owner.line(1, "at-close")) == first  # none submitted, none cancelled since
    assert owner.procs[1].wait(60) == 0, owner.log(1)
    assert "closed" in owner.log(1)
    batch.assert_queue_empty({numeric(i) for i in first})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("batch", [pytest.param("slurm", marks=pytest.mark.slurm),
                                   pytest.param("sge", marks=pytest.mark.sge)],
                         indirect=True)
def test_the_jobs_of_a_cluster_that_never_returns_end_after_the_reconnect_timeout(
        batch, owner_of):
    reconnect = 5.0
    owner = owner_of(reconnect=reconnect, jobs=1)
    owner.start()
    ids = {numeric(i) for i in owner.jobs(0)}
    assert ids <= unfinished(batch.system, batch.env)
    owner.kill(0)
    killed = time.monotonic()
    batch.assert_queue_empty(ids, timeout=reconnect + 10)
    assert time.monotonic() - killed < reconnect + 10


@pytest.mark.timeout(10)
def test_what_the_journal_keeps_of_a_job_and_which_jobs_are_adopted():
    from hpcsched.jobqueue.adoption import adoptable, check_section, job_from_record, job_record
    from hpcsched.jobqueue.base import JobStatus
    from hpcsched.jobqueue.job import Job, JobState

    served = Job("41", "w-abc-0", "/logs/w-abc-0.out", 2)
    served.workers_seen.add("w-abc-0-1")
    pending = Job("42", "w-abc-1", "/logs/w-abc-1.out", 2)
    back = [job_from_record(job_record(j)) for j in (served, pending)]
    assert [(j.job_id, j.name, j.log_file, j.expected_workers) for j in back] == \
        [("41", "w-abc-0", "/logs/w-abc-0.out", 2), ("42", "w-abc-1", "/logs/w-abc-1.out", 2)]
    # a job whose workers had connected is not taken for one that never started them
    assert back[0].workers_seen == {"w-abc-0-0", "w-abc-0-1"} and not back[1].workers_seen
    # a job replaced ahead of its end stays out of the target after a restart
    served.replaced = True
    assert job_from_record(job_record(served)).replaced and not back[1].replaced
    gone = Job("43", "w-abc-2", "/logs/w-abc-2.out", 1)
    keep, ended = adoptable([*back, gone], {
        "41": JobStatus(JobState.RUNNING, "R"), "42": JobStatus(JobState.PENDING, "PD")})
    assert [j.job_id for j in keep] == ["41", "42"] and [j.job_id for j in ended] == ["43"]
    assert keep[0].state is JobState.RUNNING
    done = Job("44", "w-abc-3", "/logs/w-abc-3.out", 1)
    assert adoptable([done], {"44": JobStatus(JobState.DONE, "CD")}) == ([], [done])
    assert adoptable([done], None) == ([done], [])  # the batch system did not answer
    with pytest.raises(ValueError, match="'sge' cluster, not of a 'slurm' one"):
        check_section({"system": "sge", "jobs": []}, "slurm", "SLURMCluster")


@pytest.fixture
def nodes_batch(tmp_path, monkeypatch, fast_poll):
    """The SLURM of the emulated nodes (partition ``multi``, node1-3 on their own network)."""
    from tests.nodes import SLURM_CONF, missing_slurm, require

    require(missing_slurm(3), "sudo bash ci/batch/start-slurm.sh && sudo bash "
            "ci/nodes/start-nodes.sh 3 && sudo bash ci/nodes/start-slurm-nodes.sh 3", slurm=True)
    monkeypatch.setenv("SLURM_CONF", SLURM_CONF)
    b = Batch("slurm", tmp_path / "logs", dict(os.environ))
    yield b
    b.assert_queue_empty()


@pytest.mark.timeout(420)
@pytest.mark.slurm
def test_jobs_on_other_nodes_are_adopted_and_reach_the_restarted_scheduler(
        nodes_batch, tmp_path):
    """Workers on compute nodes (their own network) find the restarted scheduler at the
    address the journal kept, and the restart adopts their jobs."""
    owner = Owner(nodes_batch, tmp_path, reconnect=120, jobs=2,
                  job_kwargs={"queue": "multi", "cores": 2, "processes": 1})
    done = tmp_path / "runs"
    done.mkdir()
    try:
        owner.start()
        first = owner.jobs(0)
        with config.set({"client.scheduler-reconnect-timeout": 120}):
            client = Client(str(owner.sfile), set_as_default=False)
        try:
            hosts = client.run(lambda: __import__("socket").gethostname())
            assert len(set(hosts.values())) == 2 and "node" in " ".join(hosts.values()), hosts
            futures = client.map(counted, range(N), directory=str(done))
            deadline = time.monotonic() + 120
            while len(list(done.iterdir())) < N // 2:
                assert time.monotonic() < deadline, "half the tasks did not run in 120 s"
                time.sleep(0.05)
            owner.kill(0)
            owner.start()
            assert owner.jobs(1) == first
            assert client.gather(futures, timeout=60) == [2 * i for i in range(N)]
            assert all(n == 1 for n in runs(done).values()) and len(runs(done)) == N
        finally:
            client.close(timeout=2)
        owner.stop.touch()
        assert owner.procs[1].wait(60) == 0, owner.log(1)
        nodes_batch.assert_queue_empty({numeric(i) for i in first})
    finally:
        owner.cleanup()
