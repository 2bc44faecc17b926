"""An array job's output in its workers' slot logs, on a real LocalCluster of two workers
of two threads (four slots), both roads: each task's stdout and stderr read back, a
failed task's stderr tail in its error, a retry's output winning over the failed
attempt's, and a program left behind writing to its own task only."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpcsched.commands.jobs import Spec, run_entry
from hpcsched.commands.run import CommandFailed
from hpcsched.commands.slotlog import JobLogs
from hpcsched.core.client.graphs import BULK_MAP_MIN
from tests.conftest import _local_cluster, wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def slots_client() -> Iterator[Any]:
    from hpcsched.core.client.client import Client

    cluster = _local_cluster(n_workers=2, threads_per_worker=2)
    try:
        client = Client(cluster, set_as_default=False)
        try:
            yield client
        finally:
            client.close()
    finally:
        cluster.close()


def spec(tmp_path: Path, command: str) -> Spec:
    return Spec(command, 1, str(tmp_path), None, None, log_dir=str(tmp_path / "logs"))


def n_for(road: Any) -> int:
    return BULK_MAP_MIN + 8 if road.name == "bulk" else 6


def test_each_task_reads_back_its_output_and_a_failure_its_stderr_tail(slots_client, tmp_path,
                                                                       road):
    n = n_for(road)
    command = ('sleep 0.05; echo "out $HPCSCHED_TASK_ID"; echo "err $HPCSCHED_TASK_ID" >&2; '
               '[ $HPCSCHED_TASK_ID != 3 ] || { echo "bad input 3" >&2; exit 7; }')
    futures = road.map(slots_client, run_entry, [spec(tmp_path, command)] * n, range(n),
                       [None] * n, pure=False)
    wait_until(lambda: all(f.done() for f in futures), timeout=120, what="the job to end")
    with pytest.raises(CommandFailed) as info:
        futures[3].result(10)
    assert info.value.returncode == 7
    assert info.value.stderr_tail == "err 3\nbad input 3"  # its own lines only
    assert all(f.status == "finished" for i, f in enumerate(futures) if i != 3)
    logs = JobLogs(str(tmp_path / "logs"))
    for i in range(n):
        assert logs.output(i, "stdout") == f"out {i}\n".encode()
        assert logs.output(i, "stderr") == (f"err {i}\n" + ("bad input 3\n" if i == 3 else "")
                                            ).encode()
    # several slots ran the job, each with its own index; no file per task
    indexes = list((tmp_path / "logs").glob("*.index"))
    assert 2 <= len(indexes) <= 4
    assert len(list((tmp_path / "logs").iterdir())) == 3 * len(indexes)


def test_a_retry_is_the_output_read(slots_client, tmp_path, road):
    n = n_for(road)
    command = (f"m={tmp_path}/tried-$HPCSCHED_TASK_ID; [ -e $m ] || "
               "{ touch $m; echo first >&2; exit 3; }; echo second $HPCSCHED_TASK_ID")
    futures = road.map(slots_client, run_entry, [spec(tmp_path, command)] * n, range(n),
                       [None] * n, pure=False, retries=1)
    slots_client.gather(futures, timeout=120)
    logs = JobLogs(str(tmp_path / "logs"))
    for i in range(n):
        assert logs.output(i, "stdout") == f"second {i}\n".encode()
        assert logs.output(i, "stderr") == b""


def test_a_program_left_behind_writes_to_its_own_task(slots_client, tmp_path, road):
    n = n_for(road)
    release = tmp_path / "release"
    command = ("echo first $HPCSCHED_TASK_ID; [ $HPCSCHED_TASK_ID != 0 ] || { "
               f"echo $$ > {tmp_path}/group; "
               f"(while [ ! -e {release} ]; do sleep 0.02; done; echo late) & }}")
    futures = road.map(slots_client, run_entry, [spec(tmp_path, command)] * n, range(n),
                       [None] * n, pure=False)
    group = tmp_path / "group"
    try:
        slots_client.gather(futures, timeout=120)
        release.touch()
        wait_until(lambda: JobLogs(str(tmp_path / "logs")).output(0, "stdout") ==
                   b"first 0\nlate\n", timeout=30, what="the late output in task 0")
        logs = JobLogs(str(tmp_path / "logs"))
        for i in range(1, n):
            assert logs.output(i, "stdout") == f"first {i}\n".encode()
    finally:
        release.touch()
        if group.exists():
            try:
                os.killpg(int(group.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
