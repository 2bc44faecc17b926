"""Running a task's spec: its function and arguments are unpickled before the run is
timed, so a task's measured duration (what the scheduler's estimates of its group are
made of) leaves out what unpickling costs, such as the imports of a function's first
task on a worker."""

from __future__ import annotations

import time

import pytest

from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.protocol.serialize import dumps_function, dumps_object
from hpcsched.core.worker.execution import load_call, run_spec_call

UNPICKLED: list[float] = []  # when each SlowToUnpickle was unpickled, in this process
SLOW = 1.0  # seconds unpickling one takes


def _rebuild() -> SlowToUnpickle:
    time.sleep(SLOW)  # as the import of a large module would
    UNPICKLED.append(time.monotonic())
    return SlowToUnpickle()


class SlowToUnpickle:
    """A callable that takes ``SLOW`` seconds to unpickle and none to call."""

    def __reduce__(self):
        return _rebuild, ()

    def __call__(self, x: int) -> int:
        return x + 1


def test_the_call_is_loaded_before_it_runs():
    spec = RunSpec(dumps_function(SlowToUnpickle()), dumps_object(((41,), {})), False)
    UNPICKLED.clear()

    call = load_call(spec, {})

    assert len(UNPICKLED) == 1  # unpickled, not run yet
    assert call() == 42
    assert run_spec_call(spec, {}) == 42


@pytest.mark.timeout(120)
def test_a_tasks_duration_leaves_out_its_unpickling(shared_client):
    fut = shared_client.submit(SlowToUnpickle(), 1, pure=False)
    assert fut.result(timeout=60) == 2

    def group_mean(dask_scheduler, key=fut.key):
        tg = dask_scheduler.state.tasks[key].group
        return tg.duration_total / tg.n_durations

    assert shared_client.run_on_scheduler(group_mean) < SLOW / 2
