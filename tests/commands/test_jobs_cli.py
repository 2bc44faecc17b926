"""``hpcsched submit`` and ``hpcsched job ...`` as a user runs them: a scheduler and two
one-thread workers started from a shell, jobs submitted and followed by other commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from hpcsched.commands.slotlog import JobLogs
from tests.conftest import wait_until
from tests.launchers.procs import WORKER_OPTS, Procs, hpcsched_cmd, start_scheduler

pytestmark = pytest.mark.timeout(240)


def hs(*args: str, sfile: Path, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    head = 2 if args[0] == "job" else 1  # the option goes after `submit` / `job WHAT`
    return subprocess.run([*hpcsched_cmd(), *args[:head], "--scheduler-file", str(sfile),
                           *args[head:]],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def start_workers(procs: Procs, sfile: Path, n: int = 2, name: str = "workers") -> None:
    procs.start([*hpcsched_cmd(), "worker", "--scheduler-file", str(sfile), *WORKER_OPTS,
                 "--nworkers", str(n)], name)


@pytest.fixture
def cluster(procs: Procs, tmp_path: Path) -> Path:
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    start_workers(procs, sfile)
    return sfile


def job_id(submitted: subprocess.CompletedProcess) -> str:
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().rsplit(" ", 1)[-1]


def test_an_array_job_runs_every_task_and_keeps_each_output(cluster, tmp_path):
    j = job_id(hs("submit", "--array", "1-2000", "--", "sh", "-c", "echo $HPCSCHED_TASK_ID",
                  sfile=cluster, cwd=tmp_path))
    waited = hs("job", "wait", j, sfile=cluster, cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr
    assert "2000/2000 finished" in waited.stderr
    cat = hs("job", "cat", j, "--task", "1234", "stdout", sfile=cluster, cwd=tmp_path)
    assert cat.returncode == 0 and cat.stdout == "1234\n"
    assert hs("job", "cat", j, "--task", "2000", sfile=cluster, cwd=tmp_path).stdout == "2000\n"
    empty = hs("job", "cat", j, "--task", "2000", "stderr", sfile=cluster, cwd=tmp_path)
    assert empty.returncode == 0 and empty.stdout == ""
    # packed into a log pair per worker slot, with its index: no file per task
    assert len(list((tmp_path / "hpcsched-jobs" / j).iterdir())) <= 3 * 2
    listed = hs("job", "list", sfile=cluster, cwd=tmp_path)
    assert listed.returncode == 0
    row = next(line.split() for line in listed.stdout.splitlines() if line.split()[:1] == [j])
    assert row[2:5] == ["2000", "2000", "0"]


def test_a_failing_task_makes_wait_fail_and_info_name_it(cluster, tmp_path):
    j = job_id(hs("submit", "--array", "1-40", "--", "sh", "-c",
                  'echo "no input $HPCSCHED_TASK_ID" >&2; [ $HPCSCHED_TASK_ID != 17 ] || exit 3',
                  sfile=cluster, cwd=tmp_path))
    waited = hs("job", "wait", j, sfile=cluster, cwd=tmp_path)
    assert waited.returncode == 1
    assert "39/40 finished, 1 failed" in waited.stderr
    info = hs("job", "info", j, sfile=cluster, cwd=tmp_path)
    assert "task 17 failed" in info.stdout and "status 3" in info.stdout
    assert info.stdout.count("failed:") == 1
    err = hs("job", "cat", j, "stderr", "--task", "17", sfile=cluster, cwd=tmp_path)
    assert err.stdout == "no input 17\n"


def test_a_single_failing_task_fails_its_job(cluster, tmp_path):
    """One task: the task road rather than a bulk map's."""
    j = job_id(hs("submit", "--", "sh", "-c", "echo oops >&2; exit 3",
                  sfile=cluster, cwd=tmp_path))
    waited = hs("job", "wait", j, sfile=cluster, cwd=tmp_path)
    assert waited.returncode == 1 and "0/1 finished, 1 failed" in waited.stderr
    info = hs("job", "info", j, sfile=cluster, cwd=tmp_path)
    assert "task 0 failed" in info.stdout and "status 3" in info.stdout
    assert hs("job", "cat", j, "stderr", sfile=cluster, cwd=tmp_path).stdout == "oops\n"


def test_output_templates_give_each_task_files_of_its_own(cluster, tmp_path):
    j = job_id(hs("submit", "--array", "1-3", "--stdout", "out/%{TASK_ID}.txt", "--", "sh",
                  "-c", "echo $HPCSCHED_TASK_ID; echo e$HPCSCHED_TASK_ID >&2",
                  sfile=cluster, cwd=tmp_path))
    assert hs("job", "wait", j, sfile=cluster, cwd=tmp_path).returncode == 0
    assert (tmp_path / "out" / "2.txt").read_text() == "2\n"
    assert (tmp_path / "hpcsched-jobs" / j / "2.stderr").read_text() == "e2\n"
    assert hs("job", "cat", j, sfile=cluster, cwd=tmp_path).stdout == "1\n2\n3\n"
    info = hs("job", "info", j, sfile=cluster, cwd=tmp_path).stdout
    assert "output: out/%{TASK_ID}.txt, hpcsched-jobs/%{JOB_ID}/%{TASK_ID}.stderr" in info
    packed = job_id(hs("submit", "--array", "1-3", "--", "true", sfile=cluster, cwd=tmp_path))
    info = hs("job", "info", packed, sfile=cluster, cwd=tmp_path).stdout
    assert f"output: {tmp_path / 'hpcsched-jobs' / packed}, a log per worker slot" in info


def test_each_line_and_json_entries_reach_the_tasks(cluster, tmp_path):
    lines = tmp_path / "inputs.txt"
    lines.write_text("alpha\n\nbeta gamma\n")
    j = job_id(hs("submit", "--each-line", str(lines), "--", "sh", "-c", 'echo "[$HPCSCHED_ENTRY]"',
                  sfile=cluster, cwd=tmp_path))
    assert hs("job", "wait", j, sfile=cluster, cwd=tmp_path).returncode == 0
    assert hs("job", "cat", j, sfile=cluster, cwd=tmp_path).stdout == "[alpha]\n[beta gamma]\n"
    items = tmp_path / "items.json"
    items.write_text(json.dumps([{"seed": 1}, {"seed": 2}]))
    j = job_id(hs("submit", "--from-json", str(items), "--", "echo", "%{TASK_ID}=%{ENTRY}",
                  sfile=cluster, cwd=tmp_path))
    assert hs("job", "wait", j, sfile=cluster, cwd=tmp_path).returncode == 0
    assert hs("job", "cat", j, sfile=cluster, cwd=tmp_path).stdout == \
        '0={"seed": 1}\n1={"seed": 2}\n'


def test_cancel_stops_a_job(cluster, tmp_path):
    nap = f"sleep 300.{os.getpid()}"  # this test's programs alone, on a shared machine
    j = job_id(hs("submit", "--array", "1-50", "--", "sh", "-c", nap,
                  sfile=cluster, cwd=tmp_path))
    assert hs("job", "cancel", j, sfile=cluster, cwd=tmp_path).returncode == 0
    waited = hs("job", "wait", j, sfile=cluster, cwd=tmp_path, timeout=60)
    assert waited.returncode == 1 and "50 cancelled" in waited.stderr
    wait_until(lambda: subprocess.run(["pgrep", "-f", f"^{nap}$"]).returncode == 1,
               timeout=30, what="the cancelled job's programs to end")


def test_bad_input_gets_a_clear_error(cluster, tmp_path):
    r = hs("submit", "--array", "5-1", "--", "true", sfile=cluster, cwd=tmp_path)
    assert r.returncode != 0 and "empty range" in r.stderr
    r = hs("submit", "--array", "1-3", sfile=cluster, cwd=tmp_path)
    assert r.returncode != 0 and "no command" in r.stderr
    r = hs("job", "info", "99", sfile=cluster, cwd=tmp_path)
    assert r.returncode == 2 and "no job '99'" in r.stderr


def test_a_job_survives_a_restart_of_a_journaled_scheduler(procs, tmp_path):
    sfile, journal = tmp_path / "scheduler.json", tmp_path / "journal"
    sched = start_scheduler(procs, sfile, "--journal", str(journal))
    start_workers(procs, sfile)
    j = job_id(hs("submit", "--array", "1-60", "--", "sh", "-c",
                  "sleep 0.2; echo $HPCSCHED_TASK_ID", sfile=sfile, cwd=tmp_path))
    wait_until(lambda: len(JobLogs(str(tmp_path / "hpcsched-jobs" / j)).records) >= 5,
               timeout=60, what="some tasks to run")
    os.kill(sched.pid, signal.SIGKILL)
    sched.wait(10)
    procs.start([*hpcsched_cmd(), "scheduler", "--host", "127.0.0.1", "--port", "0",
                 "--scheduler-file", str(sfile), "--journal", str(journal)], "scheduler2")
    waited = hs("job", "wait", j, sfile=sfile, cwd=tmp_path, timeout=180)
    assert waited.returncode == 0, waited.stderr
    out = hs("job", "cat", j, sfile=sfile, cwd=tmp_path).stdout.split()
    assert out == [str(i) for i in range(1, 61)]


DIAMOND = """
name = "diamond"

[[task]]
id = 0
command = ["sh", "-c", "echo base > base.txt"]

[[task]]
id = 1
command = "echo left-$(cat base.txt)"
deps = [0]

[[task]]
id = 2
command = "echo right-$(cat base.txt) >&2"
env = { SIDE = "right" }
stderr = "own/%{TASK_ID}.err"
deps = [0]

[[task]]
id = 3
command = "cat hpcsched-jobs/$HPCSCHED_JOB_ID/1.stdout own/2.err"
deps = [1, 2]
"""


def test_a_job_file_runs_its_tasks_after_their_dependencies(cluster, tmp_path):
    (tmp_path / "diamond.toml").write_text(DIAMOND)
    j = job_id(hs("submit", "--file", "diamond.toml", sfile=cluster, cwd=tmp_path))
    waited = hs("job", "wait", j, sfile=cluster, cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr
    assert "4/4 finished" in waited.stderr
    assert hs("job", "cat", j, "--task", "3", sfile=cluster, cwd=tmp_path).stdout == \
        "left-base\nright-base\n"
    # a task's own output template is what `job cat` reads
    assert hs("job", "cat", j, "stderr", "--task", "2", sfile=cluster,
              cwd=tmp_path).stdout == "right-base\n"
    listed = hs("job", "list", sfile=cluster, cwd=tmp_path).stdout
    assert any(line.split()[:2] == [j, "diamond"] for line in listed.splitlines())


def test_a_failed_dependency_fails_its_dependents_without_running_them(cluster, tmp_path):
    (tmp_path / "chain.toml").write_text("""
[[task]]
command = "echo broken >&2; exit 3"

[[task]]
command = "touch ran.txt"
deps = [0]

[[task]]
command = "echo independent"
""")
    j = job_id(hs("submit", "--file", "chain.toml", sfile=cluster, cwd=tmp_path))
    waited = hs("job", "wait", j, sfile=cluster, cwd=tmp_path)
    assert waited.returncode == 1 and "1/3 finished, 2 failed" in waited.stderr
    info = hs("job", "info", j, sfile=cluster, cwd=tmp_path).stdout
    assert "task 0 failed" in info and "status 3" in info and "task 1 failed" in info
    assert not (tmp_path / "ran.txt").exists()
    assert hs("job", "cat", j, "--task", "2", sfile=cluster, cwd=tmp_path).stdout == \
        "independent\n"


def test_a_job_file_array(cluster, tmp_path):
    (tmp_path / "array.toml").write_text("""
[array]
ids = "1-40"
command = ["sh", "-c", "echo $((HPCSCHED_TASK_ID * 2))"]
""")
    j = job_id(hs("submit", "--file", "array.toml", "--wait", sfile=cluster, cwd=tmp_path))
    assert hs("job", "cat", j, "--task", "21", sfile=cluster, cwd=tmp_path).stdout == "42\n"


@pytest.mark.parametrize(("text", "message"), [
    ("[[task]]\ncommand = ['true']\nnice = 3\n", "unknown key(s) 'nice'"),
    ("[[task]]\ncommand = ['true']\ndeps = [1]\n", "task 0 depends on [1], not in the file"),
    ("[[task]]\ncommand = 'true'\ndeps = [1]\n[[task]]\ncommand = 'true'\ndeps = [0]\n",
     "the dependencies make a cycle: 0 -> 1 -> 0"),
    ("[[task]]\nid = 4\ncommand = 'true'\n[[task]]\nid = 4\ncommand = 'true'\n",
     "two tasks have id 4"),
    ("[[task]]\ncommand = []\n", "'command' must be a non-empty list"),
    ("[[task]\ncommand = 'true'\n", "not valid TOML"),
])
def test_a_bad_job_file_is_named_and_nothing_is_submitted(cluster, tmp_path, text, message):
    (tmp_path / "bad.toml").write_text(text)
    r = hs("submit", "--file", "bad.toml", sfile=cluster, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    listed = hs("job", "list", sfile=cluster, cwd=tmp_path)
    assert len(listed.stdout.strip().splitlines()) == 1  # the header alone


def test_a_reader_that_stops_early_gets_no_traceback(cluster, tmp_path):
    """``hpcsched job list | head -0``: the pipe's reader is gone before the first line."""
    job_id(hs("submit", "--array", "1-3", "--", "true", sfile=cluster, cwd=tmp_path))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        listed = subprocess.run([*hpcsched_cmd(), "job", "list", "--scheduler-file",
                                 str(cluster)], cwd=tmp_path, stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=120,
                                stdin=subprocess.DEVNULL)
    finally:
        os.close(write_end)
    assert listed.returncode == 1
    assert "Traceback" not in listed.stderr and "BrokenPipe" not in listed.stderr, listed.stderr
