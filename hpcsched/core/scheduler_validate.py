"""Scheduler state, continued: read-only queries and the invariant check.

``validate()`` is called by tests after every event; it raises AssertionError
naming the first broken invariant.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpcsched.core.scheduler_model import WorkerInfo

Key = Any


class ValidationMixin:
    # ================================================================ queries
    def who_has(self, keys: Iterable[Key]) -> dict[Key, list[str]]:
        out = {}
        for k in keys:
            ts = self.tasks.get(k)
            out[k] = [ws.address for ws in ts.who_has] if ts is not None else []
        return out

    def idle_workers(self) -> list[WorkerInfo]:
        return [ws for ws in self.workers.values() if not ws.processing]

    def task_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ts in self.tasks.values():
            counts[ts.state] = counts.get(ts.state, 0) + 1
        return counts

    # ================================================================ invariants
    def validate(self) -> None:
        """Check every invariant; raises AssertionError naming the broken one."""
        total = 0
        for addr, ws in self.workers.items():
            assert ws.address == addr, (ws, addr)
            total += ws.nthreads
            for ts in ws.processing:
                assert ts.processing_on is ws and ts.state == "processing", (ts, ws)
                assert self.tasks.get(ts.key) is ts, ts
            assert ws.executing <= set(ws.processing), ws
            assert ws.long_running <= ws.executing, ws
            occ = sum(ws.processing.values())
            assert abs(ws.occupancy - occ) < 1e-6 * max(1, occ) + 1e-9, (ws, ws.occupancy, occ)
            for ts in ws.has_what:
                assert ws in ts.who_has, (ts, ws)
            nbytes = sum(max(ts.nbytes, 0) for ts in ws.has_what)
            assert ws.nbytes == nbytes, (ws, ws.nbytes, nbytes)
        assert total == self.total_nthreads, (total, self.total_nthreads)
        if self._running_cache is not None:
            assert self._running_cache == [ws for ws in self.workers.values()
                                           if ws.status == "running"], "stale running workers"
        n_queued = 0
        for key, ts in self.tasks.items():
            assert ts.key == key
            for ws in ts.who_has:
                assert self.workers.get(ws.address) is ws, (ts, ws)
                assert ts in ws.has_what, (ts, ws)
            for dts in ts.dependencies:
                assert ts in dts.dependents, (ts, dts)
                assert self.tasks.get(dts.key) is dts, (ts, dts)
            for dts in ts.dependents:
                assert ts in dts.dependencies, (ts, dts)
            for dts in ts.waiters:
                assert ts in dts.dependencies, (ts, dts)
            s = ts.state
            if s == "memory":
                assert ts.who_has, ts
                assert not ts.waiting_on, ts
            else:
                assert not ts.who_has, (ts, ts.who_has)
            if s == "processing":
                assert ts.processing_on is not None and ts in ts.processing_on.processing, ts
                assert self.workers.get(ts.processing_on.address) is ts.processing_on, ts
                assert all(d.state == "memory" for d in ts.dependencies), ts
            else:
                assert ts.processing_on is None, ts
            if s == "waiting":
                assert ts.waiting_on, ts
                for dts in ts.waiting_on:
                    assert dts.state != "memory", (ts, dts)
                    assert dts in ts.dependencies
                for dts in ts.dependencies:
                    assert ts in dts.waiters, (ts, dts)
            if s == "queued":
                n_queued += 1
                assert not ts.waiting_on, ts
            if s == "no-worker":
                assert ts in self.unrunnable, ts
            else:
                assert ts not in self.unrunnable, ts
            if s == "erred":
                assert ts.exception is not None or ts.exception_blame is not None, ts
            if s in ("waiting", "processing", "queued", "no-worker"):
                assert self._wanted(ts), ts
            if s == "released":
                # nobody wants it and nothing could need it recomputed: it leaked
                assert self._wanted(ts) or ts.dependents, ("leaked", ts)
        assert n_queued == self.n_queued, (n_queued, self.n_queued)
