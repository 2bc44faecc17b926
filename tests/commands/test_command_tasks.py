"""Command tasks from Python (``Client.submit_command`` / ``map_command``) on a real
LocalCluster: results, output files, errors that name the command, cancellation and the
death of a worker ending the program."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from hpcsched import LocalCluster
from hpcsched.commands.run import CommandFailed, CommandResult
from hpcsched.core.client.graphs import BULK_MAP_MIN
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)


def test_a_command_gives_its_status_and_its_output(client):
    r = client.submit_command(["sh", "-c", "echo out; echo err >&2"]).result(60)
    assert isinstance(r, CommandResult)
    assert r.returncode == 0 and r.stdout == b"out\n" and r.stderr == b"err\n"
    assert r.args == ("sh", "-c", "echo out; echo err >&2")
    assert client.submit_command("echo $((6 * 7))").result(60).stdout == b"42\n"


def test_captured_output_keeps_its_last_bytes_and_a_killed_program_its_signal(client):
    from hpcsched.commands.run import KEEP_BYTES

    big = KEEP_BYTES + 4096
    script = f"import sys; sys.stdout.write('x' * {big} + 'END'); sys.stdout.flush()"
    r = client.submit_command([sys.executable, "-c", script]).result(60)
    assert len(r.stdout) == KEEP_BYTES and r.stdout.endswith(b"xEND")
    with pytest.raises(CommandFailed) as info:  # the status os.wait4 gave: killed by a signal
        client.submit_command("echo bye >&2; kill -9 $$").result(60)
    assert info.value.returncode == -signal.SIGKILL and "bye" in info.value.stderr_tail


def test_output_goes_to_the_files_named(client, tmp_path):
    out, err = tmp_path / "o" / "%{TASK_ID}.out", tmp_path / "o" / "x.err"
    r = client.submit_command("echo hi; echo oops >&2", stdout=str(out), stderr=str(err),
                              cwd=str(tmp_path)).result(60)
    assert r.stdout is None and r.stdout_path == str(tmp_path / "o" / ".out")
    assert (tmp_path / "o" / ".out").read_text() == "hi\n"
    assert err.read_text() == "oops\n"


def test_a_failing_command_names_itself_its_status_and_its_stderr(client):
    f = client.submit_command(["sh", "-c", "for i in 1 2 3; do echo line$i >&2; done; exit 3"])
    with pytest.raises(CommandFailed) as info:
        f.result(60)
    e = info.value
    assert e.returncode == 3 and "line3" in e.stderr_tail
    text = str(e)
    assert "exited with status 3" in text and "for i in 1 2 3" in text
    assert "line1\nline2\nline3" in text


def test_a_program_that_does_not_exist_fails_its_future_clearly(client):
    with pytest.raises(CommandFailed, match="could not start.*FileNotFoundError"):
        client.submit_command(["/nonexistent/simulate", "--seed", "17"]).result(60)


def test_map_command_gives_each_element_its_id_and_entry(client, road):
    n = BULK_MAP_MIN + 8 if road.name == "bulk" else 5
    entries = [f"e{i}" for i in range(n)]
    if road.name == "bulk":
        futures = client.map_command("echo %{TASK_ID}:$HPCSCHED_ENTRY", entries)
        assert futures[0].key.rpartition("-")[0] + "-" in client.run_on_scheduler(
            lambda dask_scheduler: list(dask_scheduler.state.bulk.maps))
    else:
        futures = [client.submit_command(f"echo {i}:$X", env={"X": e})
                   for i, e in enumerate(entries)]
    results = client.gather(futures)
    assert [r.stdout.decode() for r in results] == [f"{i}:e{i}\n" for i in range(n)]


@pytest.mark.parametrize("calls", [1, BULK_MAP_MIN + 8])  # a map above the bulk threshold too
def test_a_command_holding_many_slots_runs_once_from_its_first_member(client, tmp_path, calls):
    # the program starts its processes on every slot itself (HPCSCHED_MPI_PREFIX): the
    # other members hold their slots and run nothing
    if len(client.scheduler_info()["workers"]) < 2:
        pytest.skip("needs two workers")
    log = tmp_path / "runs"
    cmd = f'echo "$HPCSCHED_GANG_MEMBER $HPCSCHED_NRANKS %{{ENTRY}}" >> {log}'
    if calls == 1:
        futures = [client.submit_command(cmd.replace("%{ENTRY}", "e0"), ranks=2)]
    else:
        futures = client.map_command(cmd, [f"e{i}" for i in range(calls)], ranks=2)
    results = client.gather(futures, timeout=60)
    assert all(isinstance(r, CommandResult) and r.returncode == 0 for r in results), results
    assert sorted(log.read_text().splitlines()) == sorted(f"0 2 e{i}" for i in range(calls))


def _pid_in(path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead: read its state
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_cancelling_a_command_kills_its_process_group(client, tmp_path):
    pidfile = tmp_path / "pid"
    # the program and a child of its own: both must go
    f = client.submit_command(f"sleep 300 & echo $! > {pidfile}; wait")
    pid = wait_until(lambda: _pid_in(pidfile), timeout=60, what="the command to start")
    assert _alive(pid)
    f.cancel()
    wait_until(lambda: not _alive(pid), timeout=30, what="the cancelled command's child to end")
    assert client.submit_command("echo next").result(60).stdout == b"next\n"


def test_cancelling_a_map_of_commands_kills_those_running(client, tmp_path, road):
    n = BULK_MAP_MIN + 8 if road.name == "bulk" else 4
    if road.name == "bulk":
        futures = client.map_command(f"sleep 300 & echo $! > {tmp_path}/%{{TASK_ID}}; wait",
                                     range(n))
    else:
        futures = [client.submit_command(f"sleep 300 & echo $! > {tmp_path}/{i}; wait")
                   for i in range(n)]

    def started() -> list[int]:
        return [p for p in (_pid_in(f) for f in tmp_path.iterdir()) if p]

    wait_until(lambda: started(), timeout=60, what="a command to start")
    client.cancel(futures)
    wait_until(lambda: not any(_alive(p) for p in started()), timeout=30,
               what="every started command to end")


def test_a_workers_death_ends_its_commands(tmp_path):
    pidfile = tmp_path / "pid"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, cluster.get_client() as client:
        f = client.submit_command(f"sleep 300 & echo $! > {pidfile}; wait")
        pid = wait_until(lambda: _pid_in(pidfile), timeout=60, what="the command to start")
        worker_pid = client.run(os.getpid)
        (wpid,) = worker_pid.values()
        os.kill(wpid, signal.SIGKILL)
        wait_until(lambda: not _alive(pid), timeout=30,
                   what="the command of a killed worker to end")
        del f


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_command_task_runs_off_the_workers_loop_thread(client):
    # commands block: even a tiny one never runs on the loop thread (TaskNeedsThread moves it)
    t0 = time.monotonic()
    futures = [client.submit_command("true") for _ in range(20)]
    assert all(r.returncode == 0 for r in client.gather(futures))
    assert time.monotonic() - t0 < 60
