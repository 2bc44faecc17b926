"""The one shell-command function: output, errors with stderr, timeouts, missing commands."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from hpcsched.jobqueue.runner import (
    BatchCommandError,
    BatchCommandNotFound,
    BatchCommandTimeout,
    require_executable,
    run_command,
)


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_returns_stdout():
    assert run_command(["echo", "hello", "world"], timeout=5) == "hello world\n"


def test_input_goes_to_stdin():
    assert run_command(["cat"], timeout=5, input="#BSUB -J x\n") == "#BSUB -J x\n"


def test_env_is_added_to_the_environment():
    out = run_command(["sh", "-c", 'echo "$FOO:$HOME"'], timeout=5, env={"FOO": "bar"})
    assert out.strip() == f"bar:{os.environ['HOME']}"


def test_nonzero_exit_names_command_status_and_stderr_tail(tmp_path):
    lines = "".join(f"echo line{i} >&2\n" for i in range(40))
    cmd = _script(tmp_path, "sbatch", lines + "echo 'sbatch: error: Invalid account' >&2\nexit 7\n")
    with pytest.raises(BatchCommandError) as info:
        run_command([cmd, "--parsable", "job.sh"], timeout=5)
    e = info.value
    msg = str(e)
    assert "--parsable job.sh" in msg and cmd in msg
    assert "exit status 7" in msg
    assert "sbatch: error: Invalid account" in msg
    assert "line39" in msg and "line5\n" not in msg  # only the tail
    assert e.returncode == 7 and "Invalid account" in e.stderr


def test_missing_executable_says_which_system(monkeypatch):
    with pytest.raises(BatchCommandNotFound, match="sbatch not found on PATH: is SLURM installed"):
        run_command(["/nonexistent/bin/sbatch", "x"], timeout=5)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(FileNotFoundError, match="bsub not found on PATH: is LSF installed"):
        require_executable("bsub")
    with pytest.raises(BatchCommandNotFound, match="qsub not found on PATH"):
        run_command(["qsub", "job.sh"], timeout=5)


@pytest.mark.timeout(20)
def test_hanging_command_times_out_and_its_process_group_is_killed(tmp_path):
    pidfile = tmp_path / "child.pid"
    cmd = _script(tmp_path, "squeue", f"sleep 300 &\necho $! > {pidfile}\nwait\n")
    t0 = time.monotonic()
    with pytest.raises(BatchCommandTimeout, match=r"did not finish within 1 s") as info:
        run_command([cmd, "-h"], timeout=1)
    assert time.monotonic() - t0 < 8
    assert isinstance(info.value, TimeoutError)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the command's child survived the timeout"
        time.sleep(0.05)


def test_bad_arguments():
    with pytest.raises(ValueError, match="empty command"):
        run_command([], timeout=1)
    with pytest.raises(ValueError, match="timeout"):
        run_command(["true"], timeout=0)
