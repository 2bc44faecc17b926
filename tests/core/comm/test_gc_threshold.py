"""A process running a scheduler or worker loop raises CPython's young-generation GC
threshold (config ``admin.gc-threshold``), never lowers it, and leaves it alone when the
setting is None. Each case runs in a fresh interpreter: the threshold is process-wide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

START_A_LOOP = """
import gc, sys
gc.set_threshold(int(sys.argv[1]), 10, 10)
from hpcsched.core.comm.loop import Loop
loop = Loop("gc-test", lambda work: None, lambda: None)
loop.start()
print(gc.get_threshold()[0])
loop.stop()
"""


def threshold_after_start(initial: int, **env: str) -> int:
    out = subprocess.run([sys.executable, "-c", START_A_LOOP, str(initial)],
                         env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=50, check=True)
    return int(out.stdout.strip())


def test_a_loop_raises_the_young_generation_threshold():
    assert threshold_after_start(700) == 20_000


def test_a_higher_threshold_is_kept():
    assert threshold_after_start(50_000) == 50_000


def test_the_setting_chooses_the_threshold():
    assert threshold_after_start(700, HPCSCHED_ADMIN__GC_THRESHOLD="5000") == 5000


@pytest.mark.parametrize("off", ["null", "None"])
def test_none_leaves_the_collector_alone(off):
    assert threshold_after_start(700, HPCSCHED_ADMIN__GC_THRESHOLD=off) == 700


def test_a_wrong_setting_is_named():
    with pytest.raises(subprocess.CalledProcessError) as e:
        threshold_after_start(700, HPCSCHED_ADMIN__GC_THRESHOLD="lots")
    assert "admin.gc-threshold" in e.value.stderr and "'lots'" in e.value.stderr


AFTER_A_PAUSED_BUILD = """
import gc, sys
from hpcsched.core.graph.dsk import gc_paused
if sys.argv[1] == "frozen":
    gc.freeze()  # the program froze objects of its own: they must stay frozen
frozen_before = gc.get_freeze_count()
with gc_paused(5000):
    graph = [[i] for i in range(50_000)]
oldest = {id(o) for o in gc.get_objects(generation=2)}
print(gc.isenabled(), gc.get_count()[0] < 1000, sum(id(x) in oldest for x in graph),
      gc.get_freeze_count() == frozen_before)
"""


@pytest.mark.parametrize("case", ["plain", "frozen"])
def test_a_graph_built_with_the_collector_paused_is_not_left_for_a_young_collection(case):
    """After ``gc_paused``, what the build allocated sits in the oldest generation and the
    young count is reset (no collection walks the new graph at the next allocation); a
    program that froze objects itself keeps them frozen (the move is skipped)."""
    out = subprocess.run([sys.executable, "-c", AFTER_A_PAUSED_BUILD, case],
                         capture_output=True, text=True, timeout=50, check=True)
    enabled, count_reset, in_oldest, freeze_kept = out.stdout.split()
    assert enabled == "True" and freeze_kept == "True" and count_reset == "True"
    if case == "plain":
        assert in_oldest == "50000"
    else:  # left to the young collections, as before
        assert in_oldest == "0"
