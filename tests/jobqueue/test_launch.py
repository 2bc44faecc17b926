"""In-allocation launchers: a pure function from a worker command to a shell line."""

from __future__ import annotations

import subprocess

import pytest

from hpcsched.jobqueue.launch import join_command, launch_command, shell_literal, shell_word

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


def shell_words(line: str, env: dict[str, str]) -> list[str]:
    """The words a real shell makes of ``line`` (one per output line)."""
    out = subprocess.run(["bash", "-c", "printf '%s\\n' " + line],
                         env={"PATH": "/usr/bin:/bin", **env},
                         capture_output=True, text=True, check=True).stdout
    return out.splitlines()


@pytest.mark.parametrize("launcher", ["fork", "srun", "mpiexec"])
def test_arguments_with_spaces_and_quotes_stay_one_word_each(launcher):
    cmd = ["/path with space/python", "-c", "print('a b')", "*", "`id`", "$(id)", 'say "hi"',
           "back\\slash", "$1", "${X:-default}", ""]
    # the shell sees the same words: no splitting, no globbing, no command substitution
    words = shell_words(launch_command(cmd, 2, launcher), {"X": "x"})
    assert words[-len(cmd) - (2 if launcher == "fork" else 0):][:len(cmd)] == cmd


def test_variables_expand_in_the_job_shell_and_nothing_else():
    env = {"TMPDIR": "/scratch/job 42", "SOMEVAR": "/opt/my env", "SGE_TASK_ID": "7",
           "HOME": "/home/u"}
    cmd = ["$TMPDIR", "$SOMEVAR/bin/python", "job-3.${SGE_TASK_ID}", "${SOMEVAR}/*.py",
           "~/venv/bin/python", "$TMPDIR/$(id)", "cost$5"]
    assert shell_words(join_command(cmd), env) == [
        "/scratch/job 42", "/opt/my env/bin/python", "job-3.7", "/opt/my env/*.py",
        "/home/u/venv/bin/python", "/scratch/job 42/$(id)", "cost$5"]
    assert shell_word("$TMPDIR") == '"$TMPDIR"'
    assert shell_word("/plain/path-1.0") == "/plain/path-1.0"  # no quotes when none are needed
    # an unset variable is an empty word, not a missing one
    assert shell_words(shell_word("$UNSET"), {}) == [""]


def test_literal_words_never_expand():
    assert shell_words(shell_literal("/logs/$HOME/x y"), {"HOME": "/h"}) == ["/logs/$HOME/x y"]


@pytest.mark.parametrize("processes", [0, -1, 1.5, True])
def test_bad_process_counts(processes):
    with pytest.raises(ValueError, match="processes"):
        launch_command(WORKER, processes, "fork")


def test_unknown_launcher_and_string_command():
    with pytest.raises(ValueError, match="launcher='aprun' is not one of fork, srun, mpiexec"):
        launch_command(WORKER, 1, "aprun")
    with pytest.raises(TypeError, match="list of arguments"):
        launch_command("python -m hpcsched worker", 1, "fork")
