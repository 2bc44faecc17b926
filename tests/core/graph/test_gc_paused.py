"""graph.gc_paused: the collector is off while a large graph is built, and always restored."""

from __future__ import annotations

import gc

import pytest

from hpcsched.core.graph.dsk import gc_paused


def test_large_graphs_pause_the_collector_and_restore_it():
    assert gc.isenabled()
    with gc_paused(5000):
        assert not gc.isenabled()
    assert gc.isenabled()


def test_small_graphs_leave_it_alone():
    with gc_paused(10):
        assert gc.isenabled()


def test_restored_after_an_error():
    with pytest.raises(KeyError):
        with gc_paused(5000):
            raise KeyError("x")
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        with gc_paused(5000):
            pass
        assert not gc.isenabled()  # not ours to turn on
    finally:
        gc.enable()
