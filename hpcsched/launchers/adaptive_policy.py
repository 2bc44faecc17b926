"""The adaptive policy as pure functions: scheduler state -> snapshot -> recommendation.

No threads, clocks or clusters here (the rules are listed in
:mod:`hpcsched.launchers.adaptive`): :func:`snapshot_state` reads a ``SchedulerState``
into plain dataclasses on the scheduler's thread, and :func:`recommend` turns a snapshot,
a :class:`Policy` and the previous hysteresis counts into a :class:`Recommendation`.
Tests drive them with drawn snapshots, no processes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcsched.core.settings import AdaptiveSettings


# ====================================================================== snapshot
@dataclass(frozen=True)
class WorkerSnapshot:
    """One connected worker as adaptive sees it."""

    address: str
    name: str = ""
    nthreads: int = 1
    memory_limit: int = 0  # bytes; 0 = no limit
    nbytes: int = 0  # bytes of results stored there (tasks' and bulk map elements')
    n_keys: int = 0
    processing: int = 0  # tasks and map elements assigned (executing or waiting for a thread)
    waiting_tasks: int = 0  # of those, beyond its threads
    waiting_work: float = 0.0  # expected seconds of the tasks beyond its threads
    resources: Mapping[str, float] = field(default_factory=dict)
    #: of each resource, the units its assigned tasks ask for (running and waiting)
    used_resources: Mapping[str, float] = field(default_factory=dict)
    #: resource -> (tasks, expected seconds x units) assigned here that wait for it: a
    #: worker with 4 GPUs and 16 threads given 16 one-GPU tasks runs 4 and 12 wait, with
    #: threads to spare (dask-jobqueue #230: GPU workers looked idle to adaptive scaling)
    resource_waiting: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    host: str = ""
    status: str = "running"  # running | closing_gracefully
    unit: str = ""  # the job (or other unit) it belongs to; "" = a unit of its own

    @property
    def unit_id(self) -> str:
        return self.unit or self.address


@dataclass(frozen=True)
class TaskDemand:
    """``count`` waiting tasks of TaskGroup ``group`` sharing restrictions.

    ``ready`` tasks could run now (queued, or no worker can take them); tasks still
    waiting for dependencies are recorded only when restricted (their resources make
    workers needed) and have ``ready=False``.
    """

    group: str
    count: int
    duration: float  # expected seconds per task
    ready: bool = True
    resources: Mapping[str, float] | None = None
    workers: frozenset[str] | None = None  # addresses, names or hosts allowed
    loose: bool = False  # worker restrictions may be ignored

    def could_run_on(self, ws: WorkerSnapshot) -> bool:
        if self.workers and not self.loose and not (
                ws.address in self.workers or ws.name in self.workers or ws.host in self.workers):
            return False
        if self.resources:
            return all(ws.resources.get(r, 0) >= q for r, q in self.resources.items())
        return True

    @property
    def restricted(self) -> bool:
        return bool(self.resources) or (bool(self.workers) and not self.loose)


@dataclass(frozen=True)
class Snapshot:
    """What the policy decides on; ``requested`` is the workers the cluster asked for
    (connected + still starting); ``None`` means "just the connected ones"."""

    workers: tuple[WorkerSnapshot, ...] = ()
    demand: tuple[TaskDemand, ...] = ()
    requested: int | None = None
    now: float = 0.0

    @property
    def running(self) -> list[WorkerSnapshot]:
        return [w for w in self.workers if w.status == "running"]

    @property
    def n_requested(self) -> int:
        n = len(self.running)
        return n if self.requested is None else max(self.requested, n)

    @property
    def pending(self) -> int:
        """Workers asked for that have not connected yet."""
        return self.n_requested - len(self.running)

    @property
    def n_ready(self) -> int:
        return sum(d.count for d in self.demand if d.ready)

    @property
    def n_waiting(self) -> int:
        """Tasks waiting unclaimed: ready ones and those assigned beyond a worker's threads
        or its resources (a GPU)."""
        return self.n_ready + sum(
            max(w.waiting_tasks, *(n for n, _ in w.resource_waiting.values()))
            if w.resource_waiting else w.waiting_tasks for w in self.running)

    @property
    def waiting_work(self) -> float:
        """Expected seconds of work of the waiting tasks."""
        return (sum(d.count * d.duration for d in self.demand if d.ready)
                + sum(w.waiting_work for w in self.running))

    @property
    def backlog(self) -> float:
        """Seconds the connected workers would need for the waiting work (inf: no threads):
        over their threads, or over their units of a resource the waiting work needs (GPU
        tasks wait for GPUs, however many threads are free), whichever is longer."""
        work = self.waiting_work
        threads = sum(w.nthreads for w in self.running)
        backlog = (work / threads if threads else math.inf) if work > 0 else 0.0
        for r in self.demanded_resources():
            backlog = max(backlog, self.resource_backlog(r))
        return backlog

    def demanded_resources(self) -> set[str]:
        """The resources waiting tasks ask for (ready, or waiting on a worker)."""
        out = {r for d in self.demand if d.ready and d.resources for r in d.resources}
        return out | {r for w in self.running for r in w.resource_waiting}

    def resource_backlog(self, resource: str) -> float:
        """Seconds the connected workers' units of ``resource`` would need for the waiting
        work asking for it (inf: none of them has any)."""
        work = sum(d.count * d.duration * d.resources[resource] for d in self.demand
                   if d.ready and d.resources and resource in d.resources)
        work += sum(w.resource_waiting[resource][1] for w in self.running
                    if resource in w.resource_waiting)
        units = sum(w.resources.get(resource, 0) for w in self.running)
        if work <= 0:
            return 0.0
        return work / units if units else math.inf

    def resource_units_wanted(self, resource: str) -> float:
        """Units of ``resource`` the tasks asking for it take, ready and assigned."""
        return (sum(d.count * d.resources[resource] for d in self.demand
                    if d.ready and d.resources and resource in d.resources)
                + sum(w.used_resources.get(resource, 0) for w in self.running))

    @property
    def memory_fraction(self) -> float:
        """Stored bytes over memory limits, over the workers that have a limit."""
        limited = [w for w in self.running if w.memory_limit > 0]
        limit = sum(w.memory_limit for w in limited)
        return sum(w.nbytes for w in limited) / limit if limit else 0.0

    def waiting_restrictions(self) -> list[dict]:
        """Resource restrictions of waiting tasks (for ``get_scale_up_kwargs``)."""
        return [dict(d.resources) for d in self.demand if d.resources]


def snapshot_state(state: Any, requested: int | None = None, now: float = 0.0) -> Snapshot:
    """Read a SchedulerState into a :class:`Snapshot` (call on the scheduler's thread).

    Costs one pass over the tasks, and over the elements of bulk maps given to workers
    (their queues are counted by ranges): fine at an interval of a second even with
    10^5 tasks. The elements of a bulk map (:mod:`hpcsched.core.state.bulk`) are work
    and data as tasks are: queued ones are ready demand of their TaskGroup, those a
    worker was given count as assigned to it, their results as data it holds; the tasks
    its ranges run (elements made tasks: an array job's) count as its elements do.
    """
    default = float(getattr(state, "unknown_task_duration", 0.5))

    def duration(ts: Any) -> float:
        avg = ts.group.average_duration
        return default if avg is None else avg

    # key -> [count, expected seconds of all of them]
    demand: dict[tuple, list] = {}

    def add(key: tuple, count: int, seconds: float) -> None:
        entry = demand.get(key)
        if entry is None:
            demand[key] = [count, count * seconds]
        else:
            entry[0] += count
            entry[1] += count * seconds

    for ts in state.tasks.values():
        s = ts.state
        if s in ("queued", "no-worker"):
            ready = True
        elif s == "waiting" and (ts.resource_restrictions or
                                 (ts.worker_restrictions and not ts.loose_restrictions)):
            ready = False
        else:
            continue
        res = tuple(sorted(ts.resource_restrictions.items())) if ts.resource_restrictions \
            else None
        wr = frozenset(ts.worker_restrictions) if ts.worker_restrictions else None
        add((ts.group.name, ready, res, wr, bool(ts.loose_restrictions)), 1, duration(ts))
    bulk = getattr(state, "bulk", None)
    elements: dict[str, tuple[int, int, float]] = {}
    if bulk is not None:
        if bulk.maps:
            for group, count, seconds in bulk.waiting():
                add((group, True, None, None, False), count,
                    default if seconds is None else seconds)
        # also once a map is gone from the book while its ranges still run its tasks
        elements = bulk.given_work(default)
    workers = []
    for ws in state.workers.values():
        given, ranged, given_work = elements.get(ws.address, (0, 0, 0.0))
        # the tasks a worker's ranges run (an array job's, a published map's) are in its
        # processing too, all as executing (any may have started): they wait as its
        # elements do, each its map's expected time. Their count may hold some gone since
        # (bounded: Promotions.in_range), never more than it processes.
        ranged = min(ranged, len(ws.processing))
        own = len(ws.processing) - ranged  # the tasks placed on it one by one
        held = given + ranged
        extra = own - ws.nthreads
        work = 0.0
        if extra > 0:
            left = extra
            for ts in ws.processing:
                if ts in ws.executing:
                    continue
                work += duration(ts)
                left -= 1
                if not left:
                    break
        # ranges and tasks share the worker's threads: what its ranges hold beyond the
        # threads the tasks leave waits
        waiting = max(own + held - ws.nthreads, 0)
        if held and waiting > max(extra, 0):
            work += (waiting - max(extra, 0)) * given_work / held
        workers.append(WorkerSnapshot(
            address=ws.address, name=ws.name, nthreads=ws.nthreads,
            memory_limit=ws.memory_limit, nbytes=ws.nbytes,
            n_keys=len(ws.has_what) + ws.n_elements, processing=own + held,
            waiting_tasks=waiting, waiting_work=work,
            resources=dict(ws.resources), used_resources=dict(ws.used_resources),
            resource_waiting=_resource_waiting(ws, duration),
            host=ws.host, status=ws.status))
    return Snapshot(
        workers=tuple(workers),
        demand=tuple(TaskDemand(group, count, total / count, ready, dict(res) if res else None,
                                wr, loose)
                     for (group, ready, res, wr, loose), (count, total) in demand.items()),
        requested=requested, now=now)


def _resource_waiting(ws: Any, duration: Any) -> dict[str, tuple[int, float]]:
    """resource -> (tasks, seconds x units) assigned to ``ws`` beyond its units of it: those
    its units run at once are the ones it runs first (its executing tasks, then in order)."""
    out: dict[str, tuple[int, float]] = {}
    for r, cap in ws.resources.items():
        if ws.used_resources.get(r, 0) <= cap:
            continue  # all run at once: nothing waits for r (the common case, no pass)
        needing = [ts for ts in ws.processing
                   if ts.resource_restrictions and r in ts.resource_restrictions]
        needing.sort(key=lambda ts: ts not in ws.executing)
        held, n, work = 0.0, 0, 0.0
        for ts in needing:
            q = ts.resource_restrictions[r]
            if held + q <= cap:
                held += q
            else:
                n += 1
                work += duration(ts) * q
        if n:
            out[r] = (n, work)
    return out


# ====================================================================== policy
_DEFAULT = AdaptiveSettings()


@dataclass(frozen=True)
class Policy:
    """Parameters of :func:`recommend`; ``minimum`` / ``maximum`` count workers; the rest
    default to those of :class:`~hpcsched.core.settings.AdaptiveSettings`."""

    minimum: int = 0
    maximum: float = math.inf
    target_duration: float = _DEFAULT.target_duration
    scale_factor: float = _DEFAULT.scale_factor
    memory_high: float = _DEFAULT.memory_high
    wait_count: int = _DEFAULT.wait_count
    workers_per_unit: int = 1

    def __post_init__(self) -> None:
        wpu = self.workers_per_unit
        if isinstance(wpu, bool) or not isinstance(wpu, int) or wpu < 1:
            raise ValueError(f"workers_per_unit must be a positive integer, not {wpu!r}")
        if self.minimum < 0 or self.maximum < 0:
            raise ValueError(f"adaptive bounds must not be negative (minimum={self.minimum}, "
                             f"maximum={self.maximum})")
        if self.minimum > self.maximum:
            raise ValueError(f"adaptive minimum={self.minimum} is above maximum={self.maximum}")
        if 0 < self.maximum < wpu:
            raise ValueError(f"adaptive maximum={self.maximum} workers is less than one job of "
                             f"{wpu} worker processes; pass maximum_jobs= instead")
        if self.min_workers > self.max_workers:
            raise ValueError(f"adaptive minimum={self.minimum} rounds up to {self.min_workers} "
                             f"workers (whole jobs of {wpu}), above maximum={self.maximum}")
        if not self.target_duration > 0:
            raise ValueError(f"target_duration must be positive, not {self.target_duration!r}")
        if not self.scale_factor >= 1:
            raise ValueError(f"scale_factor must be at least 1, not {self.scale_factor!r}")
        if not 0 < self.memory_high <= 1:
            raise ValueError(f"memory_high must be in (0, 1], not {self.memory_high!r}")
        if isinstance(self.wait_count, bool) or not isinstance(self.wait_count, int) \
                or self.wait_count < 1:
            raise ValueError(f"wait_count must be a positive integer, not {self.wait_count!r}")

    @property
    def min_workers(self) -> int:
        return math.ceil(self.minimum / self.workers_per_unit) * self.workers_per_unit

    @property
    def max_workers(self) -> float:
        if math.isinf(self.maximum):
            return math.inf
        return math.floor(self.maximum / self.workers_per_unit) * self.workers_per_unit

    def units_up(self, n: float) -> int:
        """``n`` workers rounded up to whole units."""
        wpu = self.workers_per_unit
        return math.ceil(n / wpu) * wpu


@dataclass(frozen=True)
class Recommendation:
    """What to do now. ``target`` is the number of workers wanted after it.

    ``close_counts`` (unit -> consecutive recommendations to retire it) is the
    hysteresis state to pass to the next :func:`recommend` call.
    """

    action: str  # "up" | "down" | "none"
    target: int
    reason: str
    kind: str  # short tag of the rule that decided: minimum, maximum, backlog, memory, ...
    retire: tuple[str, ...] = ()  # worker addresses to retire now (whole units)
    cancel_pending: int = 0  # not-yet-connected workers no longer wanted
    close_counts: Mapping[str, int] = field(default_factory=dict)


def retire_order(units: Mapping[str, list[WorkerSnapshot]], names: Iterable[str]) -> list[str]:
    """Units with the least data first (then fewest keys, then name: deterministic)."""
    return sorted(names, key=lambda u: (sum(w.nbytes for w in units[u]),
                                        sum(w.n_keys for w in units[u]), u))


def fits_in_memory(survivors: list[WorkerSnapshot], total_nbytes: int, memory_high: float) -> bool:
    """Could ``survivors`` hold all the data below the high-water mark?"""
    if any(w.memory_limit <= 0 for w in survivors):
        return True  # a worker without a limit takes the rest
    return total_nbytes <= memory_high * sum(w.memory_limit for w in survivors)


def recommend(snap: Snapshot, policy: Policy,
              close_counts: Mapping[str, int] | None = None,
              elsewhere: Iterable[WorkerSnapshot] = ()) -> Recommendation:
    """The adaptive policy: a pure function (see the module docstring for the rules).

    ``elsewhere``: running workers outside ``snap`` (another pool's) that can take the
    data of the workers it retires."""
    counts = dict(close_counts or {})
    running = snap.running
    n = len(running)
    requested = snap.n_requested
    pending = snap.pending
    lo, hi = policy.min_workers, policy.max_workers
    units: dict[str, list[WorkerSnapshot]] = {}
    for w in running:
        units.setdefault(w.unit_id, []).append(w)

    def none(reason: str, kind: str, keep: Mapping[str, int] | None = None) -> Recommendation:
        return Recommendation("none", requested, reason, kind, close_counts=dict(keep or {}))

    # 1. bounds
    if requested < lo:
        return Recommendation("up", lo, f"{requested} workers requested, below minimum {lo}",
                              "minimum")
    if requested > hi:
        excess = requested - int(hi)  # hi is finite here, a whole number of units
        cancel = min(pending, excess)
        excess -= cancel
        retire: list[str] = []
        busy_last = sorted(units, key=lambda u: (sum(w.processing for w in units[u]),
                                                 sum(w.nbytes for w in units[u]), u))
        for u in busy_last:
            if excess <= 0:
                break
            retire += [w.address for w in units[u]]
            excess -= len(units[u])
        return Recommendation("down", requested - cancel - len(retire),
                              f"{requested} workers requested, above maximum {hi:g}",
                              "maximum", tuple(retire), cancel)

    # 2. growth
    want = 0
    why: list[str] = []
    kind = ""
    if n == 0 and snap.n_ready:
        want = policy.workers_per_unit
        why.append(f"no workers and {snap.n_ready} tasks waiting")
        kind = "no-workers"
    elif n:
        grown = max(math.ceil(n * policy.scale_factor), n + 1)
        backlog = snap.backlog
        if backlog > policy.target_duration:
            threads_per_worker = sum(w.nthreads for w in running) / n
            tasks = snap.n_ready + sum(w.processing for w in running)
            useful = math.ceil(tasks / threads_per_worker)
            for r in snap.demanded_resources():  # workers the GPU tasks could keep busy
                per_worker = sum(w.resources.get(r, 0) for w in running) / n
                if per_worker > 0:
                    useful = max(useful, math.ceil(snap.resource_units_wanted(r) / per_worker))
            if useful > n:
                want = min(grown, useful)
                why.append(f"backlog {backlog:.3g} s > target {policy.target_duration:g} s "
                           f"({snap.n_waiting} tasks waiting)")
                kind = "backlog"
        memory = snap.memory_fraction
        if memory > policy.memory_high:
            want = max(want, grown)
            why.append(f"memory {memory:.0%} of limits > {policy.memory_high:.0%}")
            kind = kind or "memory"
    if want:
        target = min(policy.units_up(want), hi)
        target = max(target, lo)
        reason = "; ".join(why)
        if target > requested:
            return Recommendation("up", int(target), reason, kind)
        if pending:
            return none(f"{reason}; {pending} requested workers not yet connected", "pending")
        return none(f"{reason}; at maximum {hi:g}", "at-maximum")

    # 3. shrink: idle units, least data first, within bounds, memory and survivors
    needing = [d for d in snap.demand if d.ready or d.restricted]
    idle = [u for u, ws in units.items()
            if all(w.processing == 0 and not any(d.could_run_on(w) for d in needing)
                   for w in ws)]
    candidates: list[str] = []
    cancel = 0
    remaining = requested
    if pending and (idle or not (snap.n_ready or any(w.processing for w in running))):
        cancel = min(pending, max(requested - lo, 0))
        if cancel:
            candidates.append("<pending>")
            remaining -= cancel
    others = list(elsewhere)
    total_nbytes = sum(w.nbytes for w in running) + sum(w.nbytes for w in others)
    survivors = list(running) + others
    for u in retire_order(units, idle):
        ws = units[u]
        if remaining - len(ws) < lo:
            continue
        after = [w for w in survivors if w.unit_id != u]
        if any(w.nbytes > 0 or w.n_keys for w in ws) and not after:
            continue  # its results need somewhere to go
        if not fits_in_memory(after, total_nbytes, policy.memory_high):
            continue
        candidates.append(u)
        survivors = after
        remaining -= len(ws)
    if not candidates:
        return none("steady" if n else "no workers and nothing to do", "steady")
    new_counts = {u: counts.get(u, 0) + 1 for u in candidates}
    due = [u for u in candidates if new_counts[u] >= policy.wait_count]
    if not due:
        waited = min(new_counts.values())
        return none(f"{len(candidates)} idle units to retire after {policy.wait_count} "
                    f"intervals ({waited} so far)", "idle-wait", new_counts)
    keep = {u: c for u, c in new_counts.items() if u not in due}
    retire = [w.address for u in due if u != "<pending>" for w in units[u]]
    cancel = cancel if "<pending>" in due else 0
    parts = []
    if retire:
        parts.append(f"{len(retire)} idle workers with the least data")
    if cancel:
        parts.append(f"{cancel} pending workers not needed")
    return Recommendation(
        "down", requested - len(retire) - cancel,
        f"{' and '.join(parts)}, for {policy.wait_count} intervals", "idle",
        tuple(retire), cancel, keep)
