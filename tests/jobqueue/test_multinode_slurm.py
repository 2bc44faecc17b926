"""``SLURMCluster`` on the login side, its jobs on three compute nodes.

SLURM runs over the emulated nodes of :mod:`tests.nodes` (``ci/nodes/start-slurm-nodes.sh``:
partition ``multi``, nodes node1-3 at 10.77.0.11-13). The login side has three networks --
its default route's, the cluster's (hsbr0) and one the nodes cannot reach (hsbr1) -- so the
address the scheduler names is a real choice: by itself the cluster must take the one the
nodes reach, and when told the wrong one, say so within half a minute.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest

from hpcsched.core.client.client import Client
from hpcsched.jobqueue.cluster import SchedulerUnreachableError
from hpcsched.jobqueue.clusters import SLURMCluster
from tests.conftest import wait_until, worker_env
from tests.nodes import (
    BUSY,
    LOGIN,
    SLURM_CONF,
    UNREACHABLE,
    crash_node,
    in_node,
    missing_slurm,
    require,
)

REPO = Path(__file__).resolve().parents[2]

NODES = 3


@pytest.fixture
def multi(monkeypatch, fast_poll, tmp_path):
    """SLURM_CONF of the nodes' SLURM; cancels whatever a failing test leaves."""
    require(missing_slurm(NODES), "sudo bash ci/batch/start-slurm.sh && sudo bash "
            "ci/nodes/start-nodes.sh 3 && sudo bash ci/nodes/start-slurm-nodes.sh 3", slurm=True)
    monkeypatch.setenv("SLURM_CONF", SLURM_CONF)
    clusters: list[SLURMCluster] = []

    def make(**kwargs) -> SLURMCluster:
        # cores=2: a node's whole CPUs, so that SLURM puts each job on a node of its own
        kw = dict(queue="multi", cores=2, processes=1, memory="300MB", walltime="00:10:00",
                  death_timeout=40, log_directory=str(tmp_path / "logs"))
        c = SLURMCluster(**{**kw, **kwargs})
        clusters.append(c)
        return c

    yield make
    for c in clusters:
        c.close()
    ids = {j.split("_")[0] for c in clusters for j in c.jobs}
    wait_until(lambda: not (unfinished() & ids), timeout=30,
               what=f"jobs {sorted(ids)} to leave the queue")


def unfinished() -> set[str]:
    """Ids of the jobs the nodes' SLURM has not finished, from squeue itself."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True,
                         timeout=30).stdout
    return {line.split()[0] for line in out.splitlines()
            if line.split()[1:] and line.split()[1] not in ("COMPLETED", "CANCELLED", "FAILED",
                                                            "TIMEOUT")}


def block(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(500_000)


def total(*blocks: np.ndarray) -> tuple[str, float]:
    return socket.gethostname(), float(sum(b.sum() for b in blocks))


@pytest.mark.timeout(180)
def test_three_jobs_on_three_nodes_reach_the_scheduler_on_the_cluster_network(multi):
    c = multi()
    # not the default route's address: the one this host reaches the nodes from
    assert c.scheduler_address.startswith(f"tcp://{LOGIN}:"), c.scheduler_address
    assert "route to the compute node 10.77.0.1" in c.address_choice.how
    c.scale(jobs=NODES)
    with Client(c, set_as_default=False) as client:
        c.wait_for_workers(NODES, timeout=120)
        hosts = client.run(socket.gethostname)
        assert sorted(hosts.values()) == ["node1", "node2", "node3"]
        by_host = {h: a for a, h in hosts.items()}
        parts = [client.submit(block, i, workers=[by_host[f"node{i + 1}"]], pure=False)
                 for i in range(NODES)]
        # every node sums every block: each fetches the other two over the bridge
        sums = [client.submit(total, *parts, workers=[by_host[f"node{i + 1}"]], pure=False)
                for i in range(NODES)]
        expected = float(sum(block(i).sum() for i in range(NODES)))
        results = client.gather(sums, timeout=60)
        assert [h for h, _ in results] == ["node1", "node2", "node3"]
        assert all(s == pytest.approx(expected) for _, s in results)
    ids = set(c.jobs)
    c.close()
    wait_until(lambda: not (unfinished() & ids), timeout=30, what="the jobs to leave the queue")


@pytest.mark.timeout(300)
def test_a_multi_node_job_runs_an_mpi_command_on_the_hosts_of_its_slots(multi, hello,
                                                                         tmp_path):
    # one job over the three nodes, a worker a core (two a node); a command task holding
    # six slots starts its MPI program once, through the launcher prefix (srun inside the
    # job), one rank on each slot. The nodes' SLURM has no MPI plugin by default
    # (MpiDefault=none): the command names MPICH's, as a site's default would.
    c = multi(cores=6, processes=6, memory="600MB", launcher="srun",
              job_extra_directives=["-N 3"])
    c.scale(jobs=1)
    with Client(c, set_as_default=False) as client:
        c.wait_for_workers(6, timeout=150)
        hosts = client.run(socket.gethostname)
        assert sorted(hosts.values()) == ["node1", "node1", "node2", "node2", "node3", "node3"]
        assert len(set(client.run(lambda: os.environ["SLURM_JOB_ID"]).values())) == 1
        starts = tmp_path / "starts"  # the file system is shared, as on a cluster
        res = client.submit_command(f'echo x >> {starts}; cat "$HPCSCHED_HOSTFILE"; '
                                    f'$HPCSCHED_MPI_PREFIX {hello}',
                                    ranks=6, env={"SLURM_MPI_TYPE": "pmi2"}).result(timeout=120)
    assert starts.read_text() == "x\n"  # started once, by one member, for all six slots
    lines = res.stdout.decode().split("\n")[:-1]
    slots, hellos = lines[:6], sorted((line.split() for line in lines[6:]),
                                      key=lambda w: int(w[1]))
    assert sorted(slots) == sorted(hosts.values()), lines
    assert [w[:3] for w in hellos] == [["HELLO", str(r), "6"] for r in range(6)], lines
    assert {w[4] for w in hellos} == {"15"}, lines  # the allreduce over all six ranks
    assert [w[3] for w in hellos] == slots, lines  # rank r on the host of slot r
    assert res.host == slots[0]  # run by the task's first member


def note_job(log: str, i: int) -> None:
    """A gang member's line: its task and the batch job it runs in; then it holds its
    slot a while (the task ends with its first member: a member that had not started by
    then would not run)."""
    with open(log, "a") as f:
        f.write(f"{i} {os.environ['SLURM_JOB_ID']}\n")
    time.sleep(2)


@pytest.mark.timeout(300)
def test_with_two_multi_node_jobs_each_gang_takes_its_slots_from_one(multi, tmp_path):
    # two jobs over the same three nodes, a worker a node each: six workers, three of
    # each job. Gangs of three may run two at a time, each on one job's workers
    c = multi(cores=3, processes=3, memory="300MB", launcher="srun",
              job_extra_directives=["-N 3"])
    c.scale(jobs=2)
    log = tmp_path / "members"
    with Client(c, set_as_default=False) as client:
        c.wait_for_workers(6, timeout=150)
        jobs = client.run(lambda: os.environ["SLURM_JOB_ID"])
        assert len(set(jobs.values())) == 2, jobs
        client.gather(client.map(note_job, [str(log)] * 6, range(6), ranks=3, pure=False),
                      timeout=120)
    by_task: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        i, job = line.split()
        by_task.setdefault(i, []).append(job)
    assert sorted(by_task) == [str(i) for i in range(6)], by_task
    assert all(len(js) == 3 and len(set(js)) == 1 for js in by_task.values()), by_task


@pytest.mark.timeout(120)
def test_a_network_the_nodes_cannot_reach_is_a_clear_error_within_30_s(multi):
    c = multi(scheduler_options={"interface": "hsbr1"})
    assert c.scheduler_address.startswith(f"tcp://{UNREACHABLE}:")
    t0 = time.monotonic()
    c.scale(jobs=1)
    with pytest.raises(SchedulerUnreachableError) as info:
        c.wait_for_workers(1, timeout=90)
    took = time.monotonic() - t0
    assert took <= 30, took
    msg = str(info.value)
    assert f"cannot reach the scheduler at {c.scheduler_address}" in msg
    assert "Network is unreachable" in msg
    assert "the address of interface hsbr1" in msg
    assert f"hsbr0 {LOGIN}" in msg and "scheduler_options={'interface'" in msg
    assert "cannot reach the scheduler" in repr(c)
    assert os.path.exists(c.jobs[next(iter(c.jobs))].log_file)


TREE = textwrap.dedent("""
    import operator
    import socket

    from hpcsched import Client


    def leaf(i):
        return i


    def tree(leaves):
        dsk = {("leaf", i): (leaf, i) for i in range(leaves)}
        names, level = [("leaf", i) for i in range(leaves)], 0
        while len(names) > 1:  # leaves: a power of two
            level += 1
            pairs = range(len(names) // 2)
            for i in pairs:
                dsk[("add", level, i)] = (operator.add, names[2 * i], names[2 * i + 1])
            names = [("add", level, i) for i in pairs]
        return dsk, names[0]


    with Client() as client:
        hosts = client.run(socket.gethostname)
        print("hosts", " ".join(sorted(set(hosts.values()))), flush=True)
        dsk, root = tree(8192)
        print("tasks", len(dsk), "total", client.get(dsk, root), flush=True)
""")


def srun_cmd(*command: str) -> tuple[list[str], str]:
    """``srun -N 3 -n 6 --mpi=pmi2 COMMAND`` in the partition ``multi`` (two ranks a node:
    0-1 on node1, 2-3 on node2, 4-5 on node3) and the job's name, to cancel it by."""
    name = f"hpcsched-test-{uuid.uuid4().hex[:8]}"
    return ["srun", "-p", "multi", "-N", "3", "-n", "6", "--mpi=pmi2", "-J", name,
            "--time=5", *command], name


SRUN_ENV = {**os.environ, **worker_env(), "SLURM_CONF": SLURM_CONF}


def srun(*command: str, timeout: float = 120) -> tuple[int, str]:
    """Run :func:`srun_cmd`: its exit status and output; a step that does not end in time
    is cancelled."""
    cmd, name = srun_cmd(*command)
    env = SRUN_ENV
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate()[0]
        pytest.fail(f"`{' '.join(cmd)}` did not end within {timeout}s:\n{out[-5000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        subprocess.run(["scancel", "-n", name], env=env, timeout=30, capture_output=True)
    return proc.returncode, out


# what the MPI library (MPICH, UCX, libfabric) says when something is left over at exit
LIBRARY_WARNING = re.compile(r"UCX +(WARN|ERROR)|was not matched|leaked|libfabric:\d+")


@pytest.mark.timeout(300)
def test_srun_runs_the_pi_example_and_a_tree_on_three_nodes(multi, tmp_path):
    code, out = srun(sys.executable, "-m", "hpcsched", "examples/monte_carlo_pi.py", "1e7")
    assert code == 0, out[-5000:]
    pi = re.search(r"pi ~ (\d\.\d+) .* in 10 tasks on 5 workers", out)
    assert pi and abs(float(pi.group(1)) - 3.14159) < 0.01, out[-5000:]
    assert not LIBRARY_WARNING.search(out), out[-5000:]
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    code, out = srun(sys.executable, "-m", "hpcsched", str(script))
    assert code == 0, out[-5000:]
    # ranks 0-1 on node1, 2-3 on node2, 4-5 on node3: the five workers on all three
    assert "hosts node1 node2 node3" in out, out[-5000:]
    assert f"tasks 16383 total {sum(range(8192))}" in out, out[-5000:]
    assert not LIBRARY_WARNING.search(out), out[-5000:]



@pytest.mark.timeout(300)
def test_srun_ends_the_job_within_10_s_naming_ranks_killed_on_a_node(multi, tmp_path):
    """Both ranks on node 3 killed: srun reports them but, without --kill-on-bad-exit, lets
    the step run on; rank 0 misses them and ends the job, naming them and node 3.

    With ``mpi.rank-timeout`` 6 s (the default, 30 s, would make it 30 s and more): the
    watch of lost ranks is what this times, as in tests/hpc/test_mpi_multinode.py."""
    script, log = tmp_path / "busy.py", tmp_path / "out.log"
    script.write_text(BUSY)
    cmd, name = srun_cmd(sys.executable, "-m", "hpcsched", str(script))
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**SRUN_ENV, "HPCSCHED_MPI__RANK_TIMEOUT": "6"})
    try:
        # (the step may wait for the nodes while other jobs hold them)
        wait_until(lambda: log.read_text().count("busy on") == 5 or proc.poll() is not None,
                   timeout=200, what="every worker rank busy")
        assert proc.poll() is None, log.read_text()[-5000:]
        ranks = [p.pid for p in psutil.process_iter(["cmdline"])
                 if str(script) in " ".join(p.info["cmdline"] or []) and in_node(p.pid, 3)]
        assert len(ranks) == 2, ranks
        assert sorted(crash_node(3, ranks)) == sorted(ranks)
        t0 = time.monotonic()
        code = proc.wait(30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        subprocess.run(["scancel", "-n", name], env=SRUN_ENV, timeout=30, capture_output=True)
    text = log.read_text(errors="replace")
    assert code != 0, text[-5000:]
    assert took <= 10, (took, text[-5000:])
    assert "node3: tasks 4-5: Killed" in text, text[-5000:]
    assert "rank 0 lost worker ranks 4, 5 on node3" in text, text[-5000:]


SERVE = """#!/bin/bash
#SBATCH -p multi -N 3 -n 6 -J {name} --time=5 -o {log}
cd {repo}
srun --mpi=pmi2 {python} -m hpcsched --scheduler-file {sfile} --nthreads 1 --memory-limit 1GB
"""


def job_state(job_id: str) -> str:
    """``JobState`` and ``ExitCode`` of a job SLURM still remembers, from scontrol."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                         env=SRUN_ENV, timeout=30).stdout
    found = re.findall(r"(?:JobState|ExitCode)=(\S+)", out)
    return " ".join(found)


def inc(x: int) -> int:
    return x + 1


@pytest.mark.timeout(400)
def test_an_sbatch_job_serves_a_client_on_the_login_side_until_its_shutdown(multi, tmp_path):
    """``srun python -m hpcsched --scheduler-file F`` in an sbatch script over the three
    nodes: a client on the login side reads F, computes (single tasks, a bulk map, a dask
    array, blocks moved between workers on different nodes over MPI), and its shutdown()
    ends the job with every rank. (Each rank's share of a node's memory, what the worker
    ranks would take by themselves, is below what numpy and dask take in a rank: the
    test names a limit.)"""
    import dask
    import dask.array as da

    sfile, log = tmp_path / "sched.json", tmp_path / "serve.out"
    name = f"hpcsched-test-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "serve.sh"
    script.write_text(SERVE.format(name=name, log=log, repo=REPO, python=sys.executable,
                                   sfile=sfile))
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                               text=True, env=SRUN_ENV, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        # (the job may wait for the nodes while other jobs hold them)
        with Client(scheduler_file=str(sfile), timeout=240, set_as_default=False) as client:
            # the scheduler on node1, reached over the cluster network
            assert client.scheduler_comm.address.startswith("tcp://10.77.0.11:"), \
                client.scheduler_comm.address
            hosts = client.run(socket.gethostname)
            assert all(a.startswith("mpi://") for a in hosts), hosts
            assert sorted(set(hosts.values())) == ["node1", "node2", "node3"], hosts
            assert client.gather([client.submit(inc, i) for i in range(10)]) == \
                list(range(1, 11))
            assert sum(client.gather(client.map(inc, range(200)), timeout=60)) == \
                sum(range(1, 201))
            # one block on a worker of each node, then each sums all three: two come over
            # MPI from the other nodes
            by_host = {h: a for a, h in sorted(hosts.items())}
            pinned = [by_host[f"node{i + 1}"] for i in range(NODES)]
            parts = [client.submit(block, i, workers=[w], pure=False)
                     for i, w in enumerate(pinned)]
            sums = [client.submit(total, *parts, workers=[w], pure=False) for w in pinned]
            expected = float(sum(block(i).sum() for i in range(NODES)))
            results = client.gather(sums, timeout=60)
            assert [h for h, _ in results] == ["node1", "node2", "node3"]
            assert all(s == pytest.approx(expected) for _, s in results)
            x = da.random.RandomState(1).random((300, 300), chunks=100)
            arr = (x @ x.T).mean(axis=0)
            np.testing.assert_allclose(client.compute(arr).result(timeout=60),
                                       dask.compute(arr, scheduler="sync")[0])
            client.shutdown()
        wait_until(lambda: job_id not in unfinished(), timeout=60,
                   what=f"job {job_id} to end after the client's shutdown()")
        assert job_state(job_id) in ("COMPLETED 0:0", ""), job_state(job_id)
        # no rank left on any node (the nodes' processes are this host's)
        left = [p.pid for p in psutil.process_iter(["cmdline"])
                if str(sfile) in " ".join(p.info["cmdline"] or [])]
        assert left == [], left
        assert not sfile.exists()
        text = log.read_text(errors="replace")
        assert "ending the job: a client asked for shutdown" in text, text[-5000:]
        assert "Traceback" not in text and not LIBRARY_WARNING.search(text), text[-5000:]
    finally:
        subprocess.run(["scancel", job_id], env=SRUN_ENV, timeout=30, capture_output=True)
