"""A worker slot's output logs (hpcsched.commands.slotlog): real programs run by
``run_command`` in this process, their output read back as ``hpcsched job cat`` reads it,
and the programs a command leaves behind kept out of the next command's output."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from hpcsched.commands.run import CommandFailed, run_command
from hpcsched.commands.slotlog import SLOTS, JobLogs, Record

pytestmark = pytest.mark.timeout(60)


def run(log_dir: Path, task_id: int, command: str) -> None:
    run_command(command, cwd=str(log_dir), task_id=task_id, log_dir=str(log_dir))


def output(log_dir: Path, task_id: int, stream: str = "stdout") -> bytes | None:
    return JobLogs(str(log_dir)).output(task_id, stream)


def wait_for(predicate, what: str, timeout: float = 20.0):
    from tests.conftest import wait_until

    return wait_until(predicate, timeout=timeout, what=what)


@pytest.fixture
def left_behind():
    """The process groups of programs a test leaves running on purpose: killed at its end."""
    groups: list[int] = []
    yield groups
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_each_task_reads_back_its_own_stdout_and_stderr(tmp_path):
    for i in range(1, 6):
        run(tmp_path, i, f"echo out{i}; echo err{i} >&2")
    run(tmp_path, 6, "true")
    for i in range(1, 6):
        assert output(tmp_path, i) == f"out{i}\n".encode()
        assert output(tmp_path, i, "stderr") == f"err{i}\n".encode()
    assert output(tmp_path, 6) == b"" and output(tmp_path, 6, "stderr") == b""
    assert output(tmp_path, 7) is None  # never ran
    # one pair of logs and one index for the five tasks: no file per task
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".err", ".index", ".out"]
    with pytest.raises(ValueError, match="no stream 'both'"):
        output(tmp_path, 1, "both")


def test_a_running_task_shows_its_output_so_far(tmp_path):
    release = tmp_path / "release"
    errors: list[BaseException] = []

    def slot() -> None:
        try:
            run(tmp_path, 1, f"echo part; while [ ! -e {release} ]; do sleep 0.02; done; echo rest")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=slot)
    t.start()
    try:
        wait_for(lambda: output(tmp_path, 1) == b"part\n", "the running task's first line")
    finally:
        release.touch()
        t.join(30)
    assert not errors and not t.is_alive()
    assert output(tmp_path, 1) == b"part\nrest\n"


def test_a_command_that_could_not_start_shows_no_one_elses_output(tmp_path):
    with pytest.raises(CommandFailed, match="could not start"):
        run_command(["/nonexistent/simulate"], task_id=1, log_dir=str(tmp_path))
    run(tmp_path, 2, "echo two")
    assert output(tmp_path, 1) == b"" and output(tmp_path, 2) == b"two\n"


def test_a_failing_command_names_its_stderr_tail_from_the_log(tmp_path):
    run(tmp_path, 1, "echo before >&2")
    with pytest.raises(CommandFailed) as info:
        run(tmp_path, 2, "for i in 1 2 3; do echo line$i >&2; done; exit 3")
    e = info.value
    assert e.returncode == 3 and e.stderr_tail == "line1\nline2\nline3"  # not task 1's line
    assert "exited with status 3" in str(e) and "for i in 1 2 3" in str(e)
    assert output(tmp_path, 2, "stderr") == b"line1\nline2\nline3\n"


def test_the_last_run_of_a_task_is_the_one_read(tmp_path):
    """A retry runs the task again: its output, not the failed attempt's, is the task's."""
    marker = tmp_path / "tried"
    command = f"[ -e {marker} ] || {{ touch {marker}; echo first >&2; exit 3; }}; echo second"
    with pytest.raises(CommandFailed):
        run(tmp_path, 1, command)
    run(tmp_path, 1, command)
    assert output(tmp_path, 1) == b"second\n" and output(tmp_path, 1, "stderr") == b""


def test_a_program_left_in_the_group_keeps_writing_to_its_own_task(tmp_path, left_behind):
    """``cmd &`` outlives its command in the command's process group: its later output
    is its task's, and the next command writes to new logs."""
    release = tmp_path / "release"
    run(tmp_path, 1, f"echo first; (while [ ! -e {release} ]; do sleep 0.02; done; "
                     "echo late) & echo $$ > group.pid")  # the command's group: its shell's pid
    left_behind.append(int((tmp_path / "group.pid").read_text()))
    run(tmp_path, 2, "echo second")
    release.touch()
    wait_for(lambda: output(tmp_path, 1) == b"first\nlate\n", "the late output in task 1")
    assert output(tmp_path, 2) == b"second\n"
    assert len(list(tmp_path.glob("*.out"))) == 2


def test_a_program_that_left_the_group_is_seen_at_the_next_command(tmp_path, left_behind):
    """``setsid`` takes the program out of the group, so the slot learns of it only
    from the log having grown when the next command starts."""
    release = tmp_path / "release"
    run(tmp_path, 1, "echo first; setsid sh -c 'echo $$ > escaped.pid; "
                     f"while [ ! -e {release} ]; do sleep 0.02; done; echo late' & "
                     "until [ -s escaped.pid ]; do sleep 0.01; done")  # out of the group
    left_behind.append(int((tmp_path / "escaped.pid").read_text()))
    assert output(tmp_path, 1) == b"first\n"
    (out_log,) = tmp_path.glob("*.out")  # no group member was left: the logs stayed
    release.touch()
    wait_for(lambda: out_log.stat().st_size == len(b"first\nlate\n"), "the late write")
    run(tmp_path, 2, "echo second")
    assert output(tmp_path, 1) == b"first\nlate\n"
    assert output(tmp_path, 2) == b"second\n"


def test_parallel_slots_write_logs_of_their_own(tmp_path):
    """Threads of one worker are slots: each appends to its own logs, never to another's."""
    barrier = threading.Barrier(3, timeout=30)
    errors: list[BaseException] = []

    def slot(k: int) -> None:
        try:
            barrier.wait()
            for i in range(k * 100, k * 100 + 20):
                run(tmp_path, i, f"echo {i}; echo e{i} >&2")
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    threads = [threading.Thread(target=slot, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert len(list(tmp_path.glob("*.index"))) == 3
    logs = JobLogs(str(tmp_path))
    for k in range(3):
        for i in range(k * 100, k * 100 + 20):
            assert logs.output(i, "stdout") == f"{i}\n".encode()
            assert logs.output(i, "stderr") == f"e{i}\n".encode()


def test_a_torn_or_foreign_index_line_is_skipped(tmp_path):
    run(tmp_path, 1, "echo one")
    index = next(tmp_path.glob("*.index"))
    with open(index, "ab") as f:
        f.write(b"2\t1.0\t../../etc/passwd\t0\t10\tx.err\t0\t0\n")  # a path out of the job's
        f.write(b"3\t1.0\tx.out\t0")  # the torn line of a worker that died writing it
    assert output(tmp_path, 1) == b"one\n"
    assert output(tmp_path, 2) is None and output(tmp_path, 3) is None
    assert Record.parse(b"4\t1.0\tx.out\t-5\t1\tx.err\t0\t0\n") is None


def test_a_task_id_that_cannot_be_indexed_is_refused(tmp_path):
    with pytest.raises(ValueError, match="tab or a newline"):
        run_command("true", task_id="a\tb", log_dir=str(tmp_path))


def test_a_slot_keeps_a_few_directories_open(tmp_path):
    from hpcsched.commands.slotlog import OPEN_DIRECTORIES

    for d in range(OPEN_DIRECTORIES + 2):
        run(tmp_path / str(d), 1, f"echo {d}")
    for d in range(OPEN_DIRECTORIES + 2):
        assert output(tmp_path / str(d), 1) == f"{d}\n".encode()
    assert len(SLOTS._local.logs) == OPEN_DIRECTORIES


def test_a_removed_job_directory_is_made_again(tmp_path):
    """A slot keeps its logs open: removing them (or the job's directory) must not send
    the next command's output to a file no one can read."""
    import shutil

    run(tmp_path / "job", 1, "echo one")
    shutil.rmtree(tmp_path / "job")
    run(tmp_path / "job", 2, "echo two")
    assert output(tmp_path / "job", 2) == b"two\n" and output(tmp_path / "job", 1) is None


def captured(command: str) -> tuple[bytes, bytes]:
    r = run_command(command)
    assert r is not None and r.stdout is not None and r.stderr is not None
    return r.stdout, r.stderr


def test_captured_output_reuses_the_slots_files_and_keeps_commands_apart(tmp_path):
    assert captured("echo one; echo e1 >&2") == (b"one\n", b"e1\n")
    first = SLOTS.scratch().files
    assert captured("echo two") == (b"two\n", b"")
    assert SLOTS.scratch().files == first  # no file made per command
    with pytest.raises(CommandFailed) as info:
        run_command("echo bad >&2; exit 4")
    assert info.value.stderr_tail == "bad"  # not the stderr of the commands before


def test_a_program_left_behind_does_not_write_into_the_next_capture(tmp_path, left_behind):
    release, done = tmp_path / "release", tmp_path / "done"
    out, _ = captured(f"echo first; (while [ ! -e {release} ]; do sleep 0.02; done; "
                      f"echo late; touch {done}) & echo $$ > {tmp_path}/group")
    left_behind.append(int((tmp_path / "group").read_text()))
    assert out == b"first\n"
    release.touch()
    wait_for(done.exists, "the late write")
    assert captured("echo second") == (b"second\n", b"")


def test_a_program_that_left_the_group_does_not_write_into_the_next_capture(tmp_path,
                                                                           left_behind):
    release = tmp_path / "release"
    out, _ = captured(f"echo first; setsid sh -c 'echo $$ > {tmp_path}/escaped.pid; "
                      f"while [ ! -e {release} ]; do sleep 0.02; done; "
                      f"echo late; touch {tmp_path}/done' & "
                      f"until [ -s {tmp_path}/escaped.pid ]; do sleep 0.01; done")
    left_behind.append(int((tmp_path / "escaped.pid").read_text()))
    assert out == b"first\n"
    release.touch()
    wait_for((tmp_path / "done").exists, "the late write")
    assert captured("echo second") == (b"second\n", b"")


def test_capture_files_are_emptied_once_large(monkeypatch):
    from hpcsched.commands import slotlog

    monkeypatch.setattr(slotlog, "SCRATCH_LIMIT", 100)
    for i in range(10):
        assert captured(f"printf '%040d' {i}") == (b"%040d" % i, b"")
    assert os.fstat(SLOTS.scratch().files[0].fileno()).st_size <= 140
