"""MPI mode end to end: ``mpiexec -n 4 python -m hpcsched <script>`` in a subprocess.

Each run is bounded and leaves no process behind (:mod:`tests.hpc.mpi_scripts`); 4 ranks
on this 2-core machine: oversubscribed, as on a login node. The scripts live in
tests/hpc/scripts/ and examples/.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from hpcsched.launchers.resources import launcher_rank, launcher_size
from tests.conftest import wait_until
from tests.hpc.mpi_scripts import Run, assert_all_gone, kill_run, run, run_members, script, start
from tests.hpc.mpirun import REPO, needs_mpiexec

PI = REPO / "examples" / "monte_carlo_pi.py"


# ------------------------------------------------------------------ pure
def test_launcher_size_from_environment():
    assert launcher_size({}) is None
    assert launcher_size({"PMI_SIZE": "4", "PMI_RANK": "0"}) == 4
    assert launcher_size({"OMPI_COMM_WORLD_SIZE": "8"}) == 8
    assert launcher_size({"PMIX_RANK": "2"}) == 0  # a launcher that does not say the size
    # a batch script's environment is not an srun step: no launcher
    assert launcher_size({"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4"}) is None
    assert launcher_size({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4",
                          "SLURM_PROCID": "1"}) == 4
    with pytest.raises(RuntimeError, match="PMI_SIZE='four'"):
        launcher_size({"PMI_SIZE": "four"})



def test_launcher_rank_only_among_several():
    """The rank `hpcsched worker` appends to its name: that of a launcher that started
    several processes, never a batch script's own SLURM_PROCID."""
    assert launcher_rank({"PMI_SIZE": "4", "PMI_RANK": "3"}) == 3
    assert launcher_rank({"MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_RANK": "1"}) == 1
    assert launcher_rank({"PMI_SIZE": "1", "PMI_RANK": "0"}) is None
    assert launcher_rank({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) is None
    assert launcher_rank({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4",
                          "SLURM_PROCID": "2"}) == 2
    assert launcher_rank({"PMI_SIZE": "four", "PMI_RANK": "1"}) is None


def test_missing_script_is_a_clear_error():
    r = run(["no/such/script.py"], nprocs=None, timeout=30)
    assert r.code == 2, r
    assert "no such script: no/such/script.py" in r.err, r


# ------------------------------------------------------------------ under mpiexec
@needs_mpiexec
@pytest.mark.timeout(90)
def test_pi_example_succeeds():
    r = run([str(PI), "4e6"])
    assert r.code == 0, r
    m = re.search(r"pi ~ (\d\.\d+) .* on 3 workers", r.out)
    assert m, r
    assert abs(float(m.group(1)) - 3.14159) < 0.01, r
    assert "Traceback" not in r.err and "WARNING" not in r.err, r


@needs_mpiexec
@pytest.mark.timeout(90)
def test_every_rank_is_gone_soon_after_the_script_ends():
    r = run([script("quick_end.py")])
    assert r.code == 0, r
    m = re.search(r"SCRIPT END (\d+\.\d+)", r.out)
    assert m, r
    assert "WARNING" not in r.err, r  # e.g. sends left behind at the endpoint's shutdown
    lag = r.ended - float(m.group(1))
    # "within a second or two"; the bound leaves room for this shared, oversubscribed VM
    assert lag < 3.0, f"ranks took {lag:.2f}s to exit after the script ended\n{r}"


@needs_mpiexec
@pytest.mark.timeout(90)
def test_script_exception_ends_every_rank_with_one_traceback():
    r = run([script("raises.py")], timeout=30)
    assert r.code == 1, r
    assert r.err.count("Traceback (most recent call last)") == 1, r
    assert r.err.count("ValueError: script failed on purpose") == 1, r
    assert 'raises.py", line 13, in <module>' in r.err, r
    assert "runpy" not in r.err and "bootstrap.py" not in r.err, r  # only the user's frames


@needs_mpiexec
@pytest.mark.timeout(90)
def test_script_exception_while_workers_are_stuck_in_tasks():
    # the tasks sleep 60 s: the ranks must not wait for them
    r = run([script("raises_while_busy.py")], timeout=40)
    assert r.code == 1, r
    assert "RuntimeError: giving up while tasks run" in r.err, r
    assert r.elapsed < 20, r


@needs_mpiexec
@pytest.mark.timeout(90)
def test_sys_exit_code_is_the_job_exit_status():
    r = run([script("exit3.py")])
    assert r.code == 3, r
    assert "exiting with 3" in r.out, r
    assert "Traceback" not in r.err, r


@needs_mpiexec
@pytest.mark.timeout(90)
def test_task_error_on_a_worker_does_not_end_the_job():
    r = run([script("task_error.py")])
    assert r.code == 0, r
    assert "caught on the client: task 7 failed on purpose" in r.out, r
    assert "workers after the error: 3" in r.out, r


@needs_mpiexec
@pytest.mark.timeout(90)
def test_initialize_runs_the_body_on_rank_0_only():
    for arg, code in (([], 0), (["4"], 4)):
        r = run([script("uses_initialize.py"), *arg], module=False)
        assert r.code == code, r
        assert r.out.count("body runs on") == 1 and "body runs on PMI_RANK=0" in r.out, r
        assert "initialize ok" in r.out, r


@needs_mpiexec
@pytest.mark.timeout(90)
def test_world_size_one_runs_on_a_local_cluster():
    r = run([str(PI), "2e6"], nprocs=None)
    assert r.code == 0, r
    assert "hpcsched: world size 1: running" in r.err and "on a LocalCluster" in r.err, r
    assert "pi ~ 3.1" in r.out, r


@needs_mpiexec
@pytest.mark.timeout(90)
def test_functions_and_classes_of_the_script_work_on_workers():
    r = run([script("classes.py"), "functions"])
    assert r.code == 0, r
    assert "functions ok" in r.out, r


@needs_mpiexec
@pytest.mark.timeout(90)
def test_instances_of_script_classes_as_task_arguments():
    r = run([script("classes.py"), "arguments"])
    assert r.code == 0, r
    assert "arguments ok" in r.out, r


@needs_mpiexec
@pytest.mark.timeout(90)
def test_worker_to_worker_numpy_transfer_is_zero_copy():
    r = run([script("transfer.py")])
    assert r.code == 0, r
    assert "transfer ok" in r.out and "'owndata': False" in r.out, r


@needs_mpiexec
@pytest.mark.timeout(90)
def test_resources_and_hostnames_in_scheduler_info():
    import socket

    def workers(r: Run) -> dict:
        assert r.code == 0, r
        m = re.search(r"^WORKERS (.*)$", r.out, flags=re.MULTILINE)
        assert m, r
        return json.loads(m.group(1))

    # from the batch system's environment (SLURM: 3 CPUs per task, 1000 MiB per CPU)
    slurm = {"SLURM_JOB_ID": "42", "SLURM_CPUS_PER_TASK": "3", "SLURM_MEM_PER_CPU": "1000"}
    w = workers(run([script("resources.py")], env=slurm))
    assert sorted(w) == ["mpi://1", "mpi://2", "mpi://3"], w
    for info in w.values():
        assert info["host"] == socket.gethostname()
        assert info["nthreads"] == 3 and info["memory_limit"] == 3000 * 2**20, w
    # from the command line
    w = workers(run(["--nthreads", "2", "--memory-limit", "1GB", script("resources.py")]))
    assert {(i["nthreads"], i["memory_limit"]) for i in w.values()} == {(2, 10**9)}, w
    assert {i["name"] for i in w.values()} == {"rank-1", "rank-2", "rank-3"}, w


@needs_mpiexec
@pytest.mark.timeout(90)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_mpiexec_ends_every_rank(signum):
    proc, mark = start([script("long_running.py")])
    lines: list[str] = []
    running = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "cluster running" in line:
                running.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert running.wait(40), f"the script did not start: {lines}"
        ranks = [p for p in run_members(mark)
                 if p.pid != proc.pid and "long_running" in " ".join(p.cmdline())]
        assert len(ranks) == 4, f"expected 4 rank processes: {ranks}"
        t0 = time.monotonic()
        proc.send_signal(signum)
        code = proc.wait(20)
        took = time.monotonic() - t0
        assert_all_gone(mark, proc)
        assert code != 0
        if signum == signal.SIGINT:
            assert code == 130, code
        assert took < 10, f"mpiexec took {took:.1f}s to end after the signal"
    finally:
        kill_run(proc, mark)
        reader.join(5)


@needs_mpiexec
@pytest.mark.timeout(90)
def test_tasks_submit_tasks_over_mpi_and_bad_results_err():
    # one thread per worker rank: a task waiting on its subtasks must secede
    r = run(["--nthreads", "1", script("tasks_submit_tasks.py")])
    assert r.code == 0, r
    assert "fib(9) = 34" in r.out and "fib_secede(8) = 21" in r.out, r
    # a worker rank's client reaches rank 0's scheduler over MPI (one per worker)
    assert "task clients reach ['mpi://0']" in r.out, r
    assert "plain Client() in a task: (5, 'mpi://0')" in r.out, r
    assert "unserializable result raised ValueError: RefusesPickling will not be " \
           "pickled" in r.out, r
    assert "dependent on another rank raised ValueError" in r.out, r
    assert "workers at the end: 3" in r.out, r


@needs_mpiexec
@pytest.mark.timeout(180)
def test_a_worker_rank_stalled_for_seconds_is_not_taken_for_lost(tmp_path):
    """On a loaded, oversubscribed node a live rank may get no CPU for seconds. A worker
    rank stopped for 12 s (twice a bound that lost such ranks) and resumed is still part of
    the job under the default ``mpi.rank-timeout``: the job goes on and ends well."""
    pids_file, resumed = tmp_path / "pids", tmp_path / "resumed"
    proc, mark = start([script("stalled_rank.py"), str(pids_file), str(resumed)], nprocs=3)
    stopped: list[int] = []
    try:
        wait_until(lambda: pids_file.exists() or proc.poll() is not None, timeout=90,
                   what="the worker ranks' pids")
        assert proc.poll() is None, proc.communicate()
        pid = int(pids_file.read_text().split()[0])
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        # the stall itself is what is tested: the rank gets no CPU for 12 s
        assert _still_running(proc, 12.0), proc.communicate()
        os.kill(pid, signal.SIGCONT)
        stopped.clear()
        resumed.touch()
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, (out, err[-5000:])
        assert "all 2 worker ranks back" in out, (out, err[-5000:])
        assert "lost" not in err, err[-5000:]
        assert_all_gone(mark, proc)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        kill_run(proc, mark)


def _still_running(proc, seconds: float) -> bool:
    """Whether ``proc`` is still running after ``seconds`` (it returns early if it ends)."""
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return True
    return False
