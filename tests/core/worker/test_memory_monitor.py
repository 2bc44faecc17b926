"""A worker's memory part (hpcsched.core.worker.memory_monitor.MemoryMonitor): the data
store it opens for the worker's results, by its limits, on a real directory."""

from __future__ import annotations

import os

import pytest

from hpcsched.core.worker.memory import MemoryLimits
from hpcsched.core.worker.memory_monitor import MemoryMonitor
from hpcsched.core.worker.spill import SpillBuffer

pytestmark = pytest.mark.timeout(30)


def test_managed_results_live_in_a_spill_buffer_closed_with_the_worker(tmp_path):
    memory = MemoryMonitor(MemoryLimits(100_000, target=0.5))
    buf = memory.open(str(tmp_path))
    assert isinstance(buf, SpillBuffer) and memory.spill_buffer is buf
    assert buf.target == 50_000  # the target fraction of memory_limit
    for i in range(4):  # more than the target: the oldest go to disk
        buf[f"x{i}"] = b"1" * 20_000
    assert buf.disk_bytes > 0 and any(tmp_path.rglob("*"))
    assert buf["x0"] == b"1" * 20_000
    memory.close()  # the worker closed: its spilled results go too
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())


@pytest.mark.parametrize("limits", [MemoryLimits(0), MemoryLimits(10_000_000, target=False,
                                                                    spill=False)],
                         ids=["no-memory_limit", "target-and-spill-off"])
def test_unmanaged_results_need_no_spill_buffer(tmp_path, limits):
    memory = MemoryMonitor(limits)
    assert memory.open(str(tmp_path)) is None and memory.spill_buffer is None
    memory.close()
    assert not any(tmp_path.iterdir())


def test_a_directory_it_cannot_use_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    where = os.path.join(str(blocker), "spill")
    memory = MemoryMonitor(MemoryLimits(10_000_000))
    with pytest.raises(OSError, match="worker cannot spill to local_directory .*a-file"):
        memory.open(where)
    assert memory.spill_buffer is None
