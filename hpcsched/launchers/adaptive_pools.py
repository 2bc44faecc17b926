"""Adaptive scaling of several pools of workers: each grown from the tasks only it can run.

A batch cluster with job templates (:mod:`hpcsched.jobqueue.templates`) has several kinds
of workers: CPU jobs, GPU jobs with ``resources={"GPU": 4}``, large-memory jobs. One
adaptive policy over all of them would hold a GPU job while CPU tasks wait, or grow the
CPU jobs for GPU tasks they cannot run. Here each pool is scaled by the one policy of
:func:`~hpcsched.launchers.adaptive_policy.recommend`, over its own part of the snapshot:

* its workers: those :class:`PoolView` says belong to it;
* its demand: the waiting tasks whose resources its workers have, each group of tasks
  given to the *first* pool (in the view's order, the default pool first) that can run
  it and may have workers at all (``maximum > 0``). CPU tasks go to the CPU pool, GPU
  tasks to the first pool with GPUs; tasks restricted to named workers go to the pool of
  a worker they may run on. So a pool grows only for tasks that would otherwise have
  no worker, and a pool none of whose tasks wait or run retires its workers after
  ``wait_count`` intervals, as any idle unit;
* its bounds: :class:`Pool.policy` (whole jobs of its own ``workers_per_unit``).

:func:`split` and :func:`recommend_pools` are pure (tests draw snapshots);
:class:`PooledAdaptive` is :class:`~hpcsched.launchers.adaptive.Adaptive` acting on each
pool's recommendation with ``cluster.scale_up(n, <pool keyword>=pool)``,
``cluster.scale_down(workers)`` and ``cluster.scale(n, <pool keyword>=pool)``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from hpcsched.launchers.adaptive import Adaptive
from hpcsched.launchers.adaptive_policy import (
    Policy,
    Recommendation,
    Snapshot,
    TaskDemand,
    WorkerSnapshot,
    recommend,
)

logger = logging.getLogger("hpcsched.adaptive")
_BOUNDS = ("minimum", "maximum", "minimum_jobs", "maximum_jobs")


@dataclass(frozen=True)
class Pool:
    """One kind of worker: its name, the resources each of its workers has, its bounds,
    and the workers asked for in it (connected or not; None: the connected ones)."""

    name: str
    policy: Policy
    resources: Mapping[str, float] = field(default_factory=dict)
    requested: int | None = None

    def could_run(self, demand: TaskDemand) -> bool:
        if self.policy.max_workers <= 0:
            return False
        return all(self.resources.get(r, 0) >= q for r, q in (demand.resources or {}).items())


class PoolView(Protocol):
    """What :class:`PooledAdaptive` asks of a cluster's pools."""

    def names(self) -> list[str]: ...
    def resources(self, pool: str) -> dict[str, float]: ...
    def workers_per_unit(self, pool: str) -> int: ...
    def pool_of(self, worker: WorkerSnapshot) -> str: ...
    def requested(self, pool: str) -> int: ...


def pool_for(demand: TaskDemand, pools: Sequence[Pool], snap: Snapshot,
             pool_of: Mapping[str, str]) -> str | None:
    """The pool that grows for ``demand`` (None: no pool can run it)."""
    if demand.workers and not demand.loose:
        for w in snap.workers:
            if demand.could_run_on(w):
                return pool_of.get(w.address, pools[0].name)
    return next((p.name for p in pools if p.could_run(demand)), None)


def split(snap: Snapshot, pools: Sequence[Pool],
          pool_of: Mapping[str, str]) -> dict[str, Snapshot]:
    """Each pool's part of ``snap``; ``pool_of``: worker address -> pool (a worker not
    named there is the first pool's).

    >>> cpu = Pool("default", Policy(maximum=4))
    >>> gpu = Pool("gpu", Policy(maximum=2), {"GPU": 4})
    >>> snap = Snapshot(demand=(TaskDemand("inc", 40, 1.0),
    ...                         TaskDemand("train", 3, 5.0, resources={"GPU": 1})))
    >>> parts = split(snap, [cpu, gpu], {})
    >>> [d.group for d in parts["default"].demand], [d.group for d in parts["gpu"].demand]
    (['inc'], ['train'])
    """
    first = pools[0].name
    demand: dict[str, list[TaskDemand]] = {p.name: [] for p in pools}
    for d in snap.demand:
        name = pool_for(d, pools, snap, pool_of)
        if name is not None:
            demand[name].append(d)
    out = {}
    for p in pools:
        workers = tuple(w for w in snap.workers if pool_of.get(w.address, first) == p.name)
        out[p.name] = Snapshot(workers=workers, demand=tuple(demand[p.name]),
                               requested=p.requested, now=snap.now)
    return out


def recommend_pools(snap: Snapshot, pools: Sequence[Pool], pool_of: Mapping[str, str],
                    close_counts: Mapping[str, Mapping[str, int]] | None = None,
                    ) -> dict[str, Recommendation]:
    """:func:`~hpcsched.launchers.adaptive_policy.recommend` for each pool over its part of
    ``snap``; ``close_counts``: pool -> that pool's hysteresis counts."""
    counts = close_counts or {}
    parts = split(snap, pools, pool_of)
    out: dict[str, Recommendation] = {}
    retiring: set[str] = set()
    for p in pools:
        # a pool's workers retire with their results moved to any pool's survivors, not
        # to those a pool before it retires now
        elsewhere = [w for q in pools if q.name != p.name for w in parts[q.name].running
                     if w.address not in retiring]
        rec = out[p.name] = recommend(parts[p.name], p.policy, counts.get(p.name), elsewhere)
        retiring.update(rec.retire)
    return out


def pool_policies(default: Policy, view: PoolView,
                  bounds: Mapping[str, Any] | None) -> dict[str, Policy]:
    """Each pool's policy: ``default`` for the first pool, and for the others its bounds
    of ``bounds`` (``minimum``, ``maximum`` in workers, or ``minimum_jobs``,
    ``maximum_jobs``), else between none and as many units as ``default`` allows."""
    names = view.names()
    bounds = dict(bounds or {})
    unknown = sorted(set(bounds) - set(names))
    if unknown:
        raise ValueError(f"adapt(templates=...): no template {', '.join(map(repr, unknown))} "
                         f"(this cluster has {', '.join(map(repr, names))})")
    units = default.max_workers / default.workers_per_unit
    out = {}
    for name in names:
        given = bounds.get(name) or {}
        if not isinstance(given, Mapping) or set(given) - set(_BOUNDS):
            raise ValueError(f"adapt(templates={{{name!r}: {given!r}}}): give a dict of "
                             f"{', '.join(_BOUNDS)}")
        wpu = view.workers_per_unit(name)
        base = default if name == names[0] else replace(
            default, minimum=0, maximum=units * wpu if math.isfinite(units) else math.inf,
            workers_per_unit=wpu)
        lo = given.get("minimum", base.minimum)
        hi = given.get("maximum", base.maximum)
        if given.get("minimum_jobs") is not None:
            lo = given["minimum_jobs"] * wpu
        if given.get("maximum_jobs") is not None:
            hi = given["maximum_jobs"] * wpu
        try:
            out[name] = replace(base, minimum=lo, maximum=hi, workers_per_unit=wpu)
        except ValueError as e:
            raise ValueError(f"adapt: template {name!r}: {e}") from None
    return out


class PooledAdaptive(Adaptive):
    """:class:`~hpcsched.launchers.adaptive.Adaptive` over the pools of ``view``, each
    scaled by its own part of the load (see the module docstring).

    ``pool_keyword`` names the keyword with which ``cluster.scale_up`` and
    ``cluster.scale`` take a pool (``template`` for a batch cluster).
    """

    def __init__(self, scheduler: Any, cluster: Any, view: PoolView, minimum: int = 0,
                 maximum: float = math.inf, pools: Mapping[str, Any] | None = None,
                 pool_keyword: str = "pool", start: bool = True, **kwargs: Any) -> None:
        super().__init__(scheduler, cluster, minimum=minimum, maximum=maximum,
                         workers_per_unit=view.workers_per_unit(view.names()[0]),
                         start=False, **kwargs)
        self.view = view
        self.pool_keyword = pool_keyword
        self.policies = pool_policies(self.policy, view, pools)
        self.pool_counts: dict[str, dict[str, int]] = {}
        self.last_recommendations: dict[str, Recommendation] = {}
        self._pool_logged: dict[str, tuple | None] = {}
        if start:
            self._thread.start()

    def pools(self) -> list[Pool]:
        return [Pool(n, self.policies[n], self.view.resources(n), self.view.requested(n))
                for n in self.view.names()]

    def recommendations(self, snap: Snapshot | None = None) -> Recommendation:
        """The first pool's recommendation now (the others: :meth:`pool_recommendations`)."""
        return next(iter(self.pool_recommendations(snap).values()))

    def pool_recommendations(self, snap: Snapshot | None = None) -> dict[str, Recommendation]:
        """What the policy recommends for each pool now (does not act)."""
        snap = snap or self.snapshot()
        pool_of = {w.address: self.view.pool_of(w) for w in snap.workers}
        return recommend_pools(snap, self.pools(), pool_of, self.pool_counts)

    def adapt(self) -> Recommendation:
        """One step for every pool: snapshot, policies, act, record."""
        with self._step_lock:
            snap = self.snapshot()
            recs = self.pool_recommendations(snap)
            self.last_snapshot, self.last_recommendations = snap, recs
            self.last_recommendation = next(iter(recs.values()))
            if self._stop.is_set():
                return self.last_recommendation
            self.pool_counts = {n: dict(r.close_counts) for n, r in recs.items()}
            for name, rec in recs.items():
                self._act(name, rec, snap)
            return self.last_recommendation

    def _act(self, name: str, rec: Recommendation, snap: Snapshot) -> None:
        error = ""
        keyword = {self.pool_keyword: name}
        try:
            if rec.action == "up":
                self._call(self.cluster.scale_up, rec.target, **keyword,
                           **self.get_scale_up_kwargs())
            elif rec.action == "down":
                if rec.retire:
                    self._call(self.cluster.scale_down, list(rec.retire))
                if rec.cancel_pending:
                    self._call(self.cluster.scale, rec.target, **keyword)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            logger.exception("adaptive: %s of %s to %d workers failed", rec.action, name,
                             rec.target)
        self._last_logged = self._pool_logged.get(name)
        self._record(replace(rec, reason=f"{name}: {rec.reason}"), snap, error)
        self._pool_logged[name] = self._last_logged
