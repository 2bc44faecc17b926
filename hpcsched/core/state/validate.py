"""The invariant check of the scheduler's state.

:func:`validate` (``SchedulerState.validate()``) is called by tests after every
event; it raises AssertionError naming the first broken invariant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcsched.core.state.scheduler_state import SchedulerState


def validate(s: SchedulerState) -> None:
    """Check every invariant of ``s``; raises AssertionError naming the broken one."""
    total = 0
    for addr, ws in s.workers.items():
        assert ws.address == addr, (ws, addr)
        total += ws.nthreads
        for ts in ws.processing:
            assert ts.processing_on is ws and ts.state == "processing", (ts, ws)
            assert s.tasks.get(ts.key) is ts, ts
        assert ws.executing <= set(ws.processing), ws
        assert ws.long_running <= ws.executing, ws
        occ = sum(ws.processing.values())
        assert abs(ws.occupancy - occ) < 1e-6 * max(1, occ) + 1e-9, (ws, ws.occupancy, occ)
        for ts in ws.has_what:
            assert ws in ts.who_has, (ts, ws)
        nbytes = sum(max(ts.nbytes, 0) for ts in ws.has_what)
        assert ws.nbytes == nbytes, (ws, ws.nbytes, nbytes)
    assert total == s.total_nthreads, (total, s.total_nthreads)
    if s.running_cache is not None:
        assert s.running_cache == [ws for ws in s.workers.values()
                                       if ws.status == "running"], "stale running workers"
    n_queued = 0
    for key, ts in s.tasks.items():
        assert ts.key == key
        for ws in ts.who_has:
            assert s.workers.get(ws.address) is ws, (ts, ws)
            assert ts in ws.has_what, (ts, ws)
        for dts in ts.dependencies:
            assert ts in dts.dependents, (ts, dts)
            assert s.tasks.get(dts.key) is dts, (ts, dts)
        for dts in ts.dependents:
            assert ts in dts.dependencies, (ts, dts)
        for dts in ts.waiters:
            assert ts in dts.dependencies, (ts, dts)
        st = ts.state
        if st == "memory":
            assert ts.who_has, ts
            assert not ts.waiting_on, ts
        else:
            assert not ts.who_has, (ts, ts.who_has)
        if st == "processing":
            assert ts.processing_on is not None and ts in ts.processing_on.processing, ts
            assert s.workers.get(ts.processing_on.address) is ts.processing_on, ts
            assert all(d.state == "memory" for d in ts.dependencies), ts
        else:
            assert ts.processing_on is None, ts
        if st == "waiting":
            assert ts.waiting_on, ts
            for dts in ts.waiting_on:
                assert dts.state != "memory", (ts, dts)
                assert dts in ts.dependencies
            for dts in ts.dependencies:
                assert ts in dts.waiters, (ts, dts)
        if st == "queued":
            n_queued += 1
            assert not ts.waiting_on, ts
            assert ts.block is None or ts in ts.block.tasks, ts
        else:
            assert ts.block is None, ("in a block of the queue, not queued", ts)
        if st == "no-worker":
            assert ts in s.unrunnable, ts
        else:
            assert ts not in s.unrunnable, ts
        if st == "erred":
            assert ts.exception is not None or ts.exception_blame is not None, ts
        if st in ("waiting", "processing", "queued", "no-worker"):
            assert s.wanted(ts), ts
        if st == "released":
            # nobody wants it and nothing could need it recomputed: it leaked
            assert s.wanted(ts) or ts.dependents, ("leaked", ts)
    assert n_queued == s.n_queued, (n_queued, s.n_queued)
    if not n_queued:
        assert not s.blocks.free and not s.blocks.owned, "blocks of an empty queue"
    for blk in s.blocks.owned:
        assert blk.owner is not None and blk.owner.root_block is blk, blk
