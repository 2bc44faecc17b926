"""What tasks print: kept with a failed task's error, forwarded to a client that asked
(``forward_print``, ``forward_logging``, ``hpcsched.print`` / ``warn``), on both roads,
with real worker processes."""

from __future__ import annotations

import logging
import sys

import pytest

import hpcsched
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(180)

N = 40  # above the bulk threshold: the `road` fixture sends them as one map or as tasks


def chatty(i: int, fail: int) -> int:
    for j in range(30):
        print(f"line {j} of task {i}")
    print(f"and to stderr from {i}", file=sys.stderr)
    if i == fail:
        raise ValueError(f"task {i} gives up")
    return i


def quiet_failure(i: int) -> int:
    raise KeyError(i)


def test_a_failed_task_carries_the_last_lines_it_printed(shared_client, road):
    futures = road.calls(shared_client, chatty, N, fail=7)
    with pytest.raises(ValueError, match="task 7 gives up") as info:
        futures[7].result(timeout=60)
    (note,) = info.value.__notes__
    lines = note.splitlines()[1:]
    assert lines[-1] == "and to stderr from 7"
    assert len(lines) == 20 and lines[0] == "line 11 of task 7"  # bounded: the last 20
    assert all(line.endswith(" 7") for line in lines), "another task's output came along"
    assert [f.result(timeout=60) for i, f in enumerate(futures) if i != 7] == \
        [i for i in range(N) if i != 7]


def test_a_failed_task_that_printed_nothing_has_no_note(shared_client, road):
    futures = road.calls(shared_client, chatty, N, fail=-1)  # the threads printed before
    assert sorted(f.result(timeout=60) for f in futures) == list(range(N))
    failed = road.calls(shared_client, quiet_failure, N)
    with pytest.raises(KeyError) as info:
        failed[0].result(timeout=60)
    assert not getattr(info.value, "__notes__", None)


def greet(i: int) -> int:
    print(f"hello from {i}")
    hpcsched.print(f"explicit {i}")
    hpcsched.warn(f"warning {i}")
    return i


class Collected:
    def __init__(self, capsys):
        self.capsys = capsys
        self.out = ""
        self.err = ""

    def has(self, expected_out: set, expected_err: set) -> bool:
        got = self.capsys.readouterr()
        self.out += got.out
        self.err += got.err
        return expected_out <= set(self.out.splitlines()) and \
            expected_err <= set(self.err.splitlines())


def test_forward_print_shows_what_tasks_print(client, road, capsys):
    client.forward_print()
    futures = road.calls(client, greet, N)
    assert sorted(f.result(timeout=60) for f in futures) == list(range(N))
    seen = Collected(capsys)
    wait_until(lambda: seen.has({f"hello from {i}" for i in range(N)}
                                | {f"explicit {i}" for i in range(N)},
                                {f"warning {i}" for i in range(N)}),
               timeout=30, what="every task's lines on the client")
    assert seen.out.count("hello from 3\n") == 1


def test_forward_print_of_explicit_lines_only(client, road, capsys):
    client.forward_print(tasks=False)
    futures = road.calls(client, greet, N)
    assert sorted(f.result(timeout=60) for f in futures) == list(range(N))
    seen = Collected(capsys)
    wait_until(lambda: seen.has({f"explicit {i}" for i in range(N)},
                                {f"warning {i}" for i in range(N)}),
               timeout=30, what="hpcsched.print's lines on the client")
    # the batches of a worker arrive in order: the explicit lines came, plain ones did not
    assert "hello from" not in seen.out


def log_something(i: int) -> int:
    logging.getLogger("tests.tasks").warning("task %d logs", i)
    logging.getLogger("tests.tasks").debug("task %d whispers", i)
    return i


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_forward_logging_hands_task_records_to_the_clients_loggers(client, road):
    handler = ListHandler()
    logger = logging.getLogger("tests.tasks")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        client.forward_logging("tests.tasks", level=logging.INFO)
        futures = road.calls(client, log_something, N)
        assert sorted(f.result(timeout=60) for f in futures) == list(range(N))
        wait_until(lambda: len(handler.records) >= N, timeout=30,
                   what="every task's record on the client")
        messages = sorted(r.getMessage() for r in handler.records)
        assert messages == sorted(f"task {i} logs" for i in range(N))
        assert all(r.levelno == logging.WARNING for r in handler.records)
    finally:
        logger.removeHandler(handler)


def test_bad_arguments_are_named(client):
    with pytest.raises(TypeError, match="level must be an int"):
        client.forward_logging(level="INFO")  # type: ignore[arg-type]
