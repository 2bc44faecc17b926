"""In-allocation launchers: a pure function from a worker command to a shell line."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from hpcsched.jobqueue.launch import Expand, join_command, launch_command

WORKER = ["/opt/py/bin/python", "-m", "hpcsched", "worker", "tcp://10.0.0.1:8786",
          "--name", "job-0"]


def test_fork_starts_p_workers_with_one_command():
    assert launch_command(WORKER, 4, "fork") == (
        "/opt/py/bin/python -m hpcsched worker tcp://10.0.0.1:8786 --name job-0 --nworkers 4")


def test_srun_starts_one_task_per_worker():
    assert launch_command(WORKER, 2, "srun") == (
        "srun -n 2 --cpu-bind=none /opt/py/bin/python -m hpcsched worker "
        "tcp://10.0.0.1:8786 --name job-0")


def test_mpiexec():
    assert launch_command(WORKER, 3, "mpiexec") == (
        "mpiexec -n 3 /opt/py/bin/python -m hpcsched worker tcp://10.0.0.1:8786 --name job-0")


@pytest.mark.parametrize("launcher", ["fork", "srun", "mpiexec"])
def test_arguments_with_spaces_and_quotes_survive_the_shell(launcher):
    cmd = ["/path with space/python", "-c", "print('a b')", "$HOME", "`id`"]
    line = launch_command(cmd, 2, launcher)
    words = shlex.split(line)
    assert words[-len(cmd) - (2 if launcher == "fork" else 0):][:len(cmd)] == cmd
    # the shell itself sees the same words (no expansion, no command substitution)
    out = subprocess.run(["sh", "-c", "printf '%s\\n' " + join_command(cmd)],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == cmd


def test_expand_arguments_are_expanded_by_the_shell_only_for_variables():
    cmd = ["echo", Expand("job-3.${SGE_TASK_ID}")]
    line = join_command(cmd)
    assert line == 'echo "job-3.${SGE_TASK_ID}"'
    out = subprocess.run(["sh", "-c", line], env={"SGE_TASK_ID": "7", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert out == "job-3.7\n"
    for bad in ("$(id)", "`id`", 'a"b', "a\\b"):
        with pytest.raises(ValueError, match="only"):
            Expand(bad)


@pytest.mark.parametrize("processes", [0, -1, 1.5, True])
def test_bad_process_counts(processes):
    with pytest.raises(ValueError, match="processes"):
        launch_command(WORKER, processes, "fork")


def test_unknown_launcher_and_string_command():
    with pytest.raises(ValueError, match="launcher='aprun' is not one of fork, srun, mpiexec"):
        launch_command(WORKER, 1, "aprun")
    with pytest.raises(TypeError, match="list of arguments"):
        launch_command("python -m hpcsched worker", 1, "fork")
