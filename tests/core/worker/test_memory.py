"""Memory management without processes: the plan over one sample, the spill buffer, and
pausing as a story of events through both state machines (``validate()`` after each)."""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
import pytest

from hpcsched.core import config
from hpcsched.core.state import events as ev
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.worker.memory import MemoryLimits, MemoryPlan, PeakMemory, plan, process_memory
from hpcsched.core.worker.spill import SpillBuffer, local_directory
from tests.core.state.harness import (
    compute,
    executes,
    finish,
    step,
    submit,
    success,
    to_scheduler,
    with_workers,
)

LIMITS = MemoryLimits(1000, target=0.6, spill=0.7, pause=0.8, terminate=0.95)


# ---------------------------------------------------------------- the plan
def test_defaults_are_dasks():
    limits = MemoryLimits.from_config(1000)
    assert (limits.target, limits.spill, limits.pause, limits.terminate) == (0.6, 0.7, 0.8,
                                                                            0.95)


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, "lots", float("nan")])
def test_a_bad_fraction_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="worker.memory.pause"):
        MemoryLimits(1000, pause=bad)


def test_false_turns_a_step_off_in_config_as_in_dask():
    with config.set({"worker.memory.pause": False, "worker.memory.spill": "false"}):
        limits = MemoryLimits.from_config(1000)
    assert limits.pause is None and limits.spill is None
    assert decisions(plan(limits, rss=999, spillable=500, paused=False, restartable=True)) \
        == (0, None, True)


def decisions(p: MemoryPlan) -> tuple:
    return p.evict_bytes, p.pause, p.terminate


def test_below_spill_nothing_happens():
    assert decisions(plan(LIMITS, rss=690, spillable=500, paused=False)) == (0, None, False)


def test_results_kept_in_memory_leave_room_for_what_sizeof_does_not_see():
    # 100 bytes of interpreter and libraries: up to target (600) of results
    assert plan(LIMITS, rss=300, spillable=200, paused=False).fast_bytes == 600
    # 300 bytes unmanaged: only 400 of results fit below the spill fraction (700)
    assert plan(LIMITS, rss=500, spillable=200, paused=False).fast_bytes == 400
    assert plan(LIMITS, rss=900, spillable=0, paused=False).fast_bytes == 0


def test_past_spill_results_go_until_process_memory_would_be_at_target():
    assert plan(LIMITS, rss=750, spillable=500, paused=False).evict_bytes == 150
    # no more than is there to spill
    assert plan(LIMITS, rss=750, spillable=40, paused=False).evict_bytes == 40


def test_pause_past_the_fraction_and_resume_below_it():
    assert plan(LIMITS, rss=850, spillable=0, paused=False).pause is True
    assert plan(LIMITS, rss=850, spillable=0, paused=True).pause is None  # stays paused
    assert plan(LIMITS, rss=500, spillable=0, paused=True).pause is False
    assert plan(LIMITS, rss=500, spillable=0, paused=False).pause is None


def test_terminate_restarts_at_once_where_a_restart_is_possible():
    p = plan(LIMITS, rss=960, spillable=300, paused=False, restartable=True)
    assert p.terminate


def test_terminate_without_restart_spills_everything_first_then_gives_up():
    """An MPI rank: spilling and pausing must be tried before ending the job."""
    p = plan(LIMITS, rss=960, spillable=300, paused=False, restartable=False)
    assert decisions(p) == (300, True, False)
    p = plan(LIMITS, rss=960, spillable=0, paused=True, restartable=False)
    assert p.terminate


def test_no_memory_limit_manages_nothing():
    assert plan(MemoryLimits(0), rss=10**12, spillable=10**9, paused=False) == MemoryPlan()


# ---------------------------------------------------------------- the spill buffer
@pytest.fixture
def buffer(tmp_path):
    buf = SpillBuffer(str(tmp_path), target=250)
    yield buf
    buf.close()


def test_results_past_target_spill_least_recently_used_first(buffer):
    for k in "abc":
        buffer.store(k, np.full(10, ord(k), dtype=np.float64), 100)
    assert buffer.spilled == {"a"}  # 300 > 250: the oldest went to disk
    assert buffer.memory_bytes == 200 and buffer.disk_bytes == 100
    assert buffer["a"][0] == ord("a")  # comes back transparently (b goes out)
    assert buffer.spilled == {"b"}
    assert os.listdir(buffer.directory)  # on disk, under the worker's directory


def test_peek_serves_a_spilled_result_without_pushing_others_out(buffer):
    for k in "abc":
        buffer.store(k, bytes([ord(k)]) * 100, 100)
    assert buffer.peek("a") == b"a" * 100
    assert buffer.spilled == {"a"}


def test_evict_spills_on_demand_and_a_deleted_key_leaves_the_disk(buffer):
    buffer.store("a", b"x" * 100, 100)
    buffer.store("b", b"y" * 100, 100)
    assert buffer.evict(150) == 200 and buffer.memory_bytes == 0
    del buffer["a"]
    assert "a" not in buffer and buffer.spilled == {"b"}
    assert len(os.listdir(buffer.directory)) == 1


class Unpicklable:
    def __reduce__(self):
        raise pickle.PicklingError("not today")


def test_a_result_that_cannot_be_spilled_stays_in_memory(buffer):
    value = Unpicklable()
    buffer.store("u", value, 100)
    buffer.store("a", b"x" * 200, 200)  # pushes u out: writing it fails
    assert buffer["u"] is value


def test_closing_removes_the_spill_directory(tmp_path):
    buf = SpillBuffer(str(tmp_path), target=10)
    buf.store("a", b"x" * 100, 100)
    buf.close()
    assert os.listdir(tmp_path) == []


def test_local_directory_defaults_to_tmpdir(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    assert local_directory() == str(tmp_path)
    with config.set({"worker.local-directory": "$TMPDIR/spill"}):
        assert local_directory() == f"{tmp_path}/spill"


def test_worker_state_stores_results_in_the_buffer_with_their_measured_size(buffer):
    s = WorkerState("tcp://me", 1, data=buffer)
    step(s, compute("x"))
    step(s, success("x", b"v" * 10, nbytes=300))  # 300 > target: on disk at once
    assert buffer.spilled == {"x"} and s.tasks["x"].state == "memory"


# ---------------------------------------------------------------- pausing: the worker
def test_a_paused_worker_starts_nothing_and_tells_the_scheduler():
    s = WorkerState("tcp://me", 2)
    out = step(s, compute("a"))
    assert executes(out) == ["a"]
    out = step(s, ev.PauseWorker(True))
    assert to_scheduler(out, "worker-status-change", status="paused")
    out = step(s, compute("b"))  # a free thread, but paused
    assert executes(out) == []
    out = step(s, success("a"))  # a running task finishes as usual
    assert to_scheduler(out, "task-finished", key="a") and executes(out) == []
    out = step(s, ev.PauseWorker(False))
    assert to_scheduler(out, "worker-status-change", status="running")
    assert executes(out) == ["b"]


def test_a_paused_worker_fetches_no_dependency():
    s = WorkerState("tcp://me", 1)
    step(s, ev.PauseWorker(True))
    out = step(s, compute("y", deps={"x": ["tcp://p1"]}))
    assert not [c for c in out if type(c) is ev.GatherDep]
    out = step(s, ev.PauseWorker(False))
    assert [c.keys for c in out if type(c) is ev.GatherDep] == [["x"]]


def test_pausing_twice_says_it_once():
    s = WorkerState("tcp://me", 1)
    assert to_scheduler(step(s, ev.PauseWorker(True)), "worker-status-change")
    assert not step(s, ev.PauseWorker(True))


# ---------------------------------------------------------------- pausing: the scheduler
def roots(n: int) -> dict[str, Any]:
    return {f"r-{i}": {"run_spec": f"spec-{i}", "deps": []} for i in range(n)}


def on(out: list, worker: str) -> list:
    return [m.wire()["key"] for m in out if m.to == worker and m.wire().get("op") == "compute-task"]


def test_the_scheduler_sends_a_paused_worker_nothing_until_it_resumes():
    A, B = "tcp://a", "tcp://b"
    s = with_workers(A, B)
    step(s, ev.WorkerStatusChange(A, "paused"))
    assert s.workers[A].status == "paused"
    out = submit(s, roots(6), [f"r-{i}" for i in range(6)])
    assert on(out, A) == [] and on(out, B)
    out = step(s, ev.WorkerStatusChange(A, "running"))
    assert on(out, A), "queued work flows to the resumed worker"


def test_a_task_that_must_run_on_a_paused_worker_waits_for_it():
    A, B = "tcp://a", "tcp://b"
    s = with_workers(A, B)
    step(s, ev.WorkerStatusChange(A, "paused"))
    out = submit(s, {"x": {"run_spec": "f", "deps": []}}, ["x"], workers=[A])
    assert on(out, A) == [] and s.tasks["x"].state == "no-worker"
    out = step(s, ev.WorkerStatusChange(A, "running"))
    assert on(out, A) == ["x"]
    finish(s, A, "x")


def test_a_retiring_worker_stays_retiring_whatever_its_memory_says():
    A, B = "tcp://a", "tcp://b"
    s = with_workers(A, B)
    step(s, ev.RetireWorkers("r", "internal", [A], close=True))
    if A in s.workers:
        step(s, ev.WorkerStatusChange(A, "running"))
        assert s.workers[A].status == "closing_gracefully"
    step(s, ev.WorkerStatusChange(B, "bogus"))  # unknown statuses are ignored
    assert s.workers[B].status == "running"


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux only")
def test_the_peak_since_a_reset_counts_what_was_touched_then_and_no_earlier_peak():
    peak = PeakMemory()
    peak.reset()
    held = b"\1" * (64 << 20)  # touched: resident
    high = peak.peak()
    assert high >= process_memory() >= len(held)
    seen, rss = peak.sample  # the current RSS, read with the peak: a fresh sample
    assert seen > 0 and len(held) <= rss <= high
    del held
    peak.reset()  # the earlier peak is gone; what is left is the current RSS
    assert 0 < peak.peak() < high - (48 << 20)
