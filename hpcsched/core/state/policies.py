"""Pure scheduling decisions over scheduler state.

They follow dask.distributed's scheduling policies ("Choosing Workers",
https://distributed.dask.org/en/stable/scheduling-policies.html).

Every function here reads :class:`~hpcsched.core.state.model.TaskState` /
``WorkerInfo`` objects and returns a decision; none of them changes state.

* :func:`is_rootish` — a task whose TaskGroup is larger than
  ``rootish_factor x`` the cluster's threads and has fewer than
  ``rootish_max_deps`` distinct dependencies, and no restrictions.
* :func:`queue_slots` — how many tasks a worker holds under queuing: its slots,
  ``ceil(worker_saturation x threads)``, or milliseconds of a group of short tasks.
* :func:`worker_objective` — when would ``ts`` start on ``ws``: occupancy per
  thread plus bytes to transfer over the bandwidth; ties by bytes stored.
* :func:`decide_worker` — among workers holding a dependency (when none does, a
  random sample of at most ``SAMPLE_LIMIT`` valid ones), the one with the smallest
  objective.
* :func:`co_assign_worker` — queuing off: consecutive root-ish tasks (in
  priority order) go to one worker in batches, so siblings land together.
* :func:`plan_steals` — idle workers take not-yet-started work from
  saturated ones when moving it (bytes and a latency, :func:`move_time`) costs
  little next to its runtime.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcsched.core.state.model import TaskGroup, TaskState, WorkerInfo

SAMPLE_LIMIT = 20  # workers inspected for a task whose inputs no candidate holds
#: at most this many tasks move per round of stealing (and as many idle workers are read)
STEAL_MOVES = 100
#: seconds a stolen task's inputs take to reach the thief besides their bytes (messages,
#: a connection, wake-ups): dask.distributed's ``LATENCY`` in ``stealing.py``, by which
#: a task of microseconds whose inputs must move is never worth stealing
STEAL_LATENCY = 0.1


def is_rootish(ts: TaskState, total_nthreads: int, factor: float = 2, max_deps: int = 5) -> bool:
    if ts.resource_restrictions or ts.worker_restrictions:
        return False
    tg = ts.group
    return tg.n_tasks > factor * total_nthreads and len(tg.dep_keys) < max_deps


def worker_slots(ws: WorkerInfo, saturation: float) -> int:
    """Tasks a worker may hold at once under queuing: ceil(saturation x nthreads), at least 1."""
    if math.isinf(saturation):
        return 2**62
    return max(math.ceil(saturation * ws.nthreads), 1)


def busy_slots(ws: WorkerInfo) -> int:
    """Tasks holding a thread slot of ``ws``: those processing there, except the ones that
    seceded (``long_running``), which wait on other tasks and give their thread back."""
    return len(ws.processing) - len(ws.long_running)


def worker_full(ws: WorkerInfo, saturation: float) -> bool:
    """Whether ``ws`` holds :func:`worker_slots` tasks already (called several times per
    task: written out, without the calls)."""
    if saturation == math.inf:
        return False
    slots = math.ceil(saturation * ws.nthreads)
    return len(ws.processing) - len(ws.long_running) >= (slots if slots > 1 else 1)


#: free workers one event hands queued tasks of a group none of whose tasks has finished
#: yet (:meth:`~hpcsched.core.state.placement.Placement.fill_slots`): the next ones get
#: theirs in the server's next iteration, after the first results may have come back
FIRST_WAVE_WORKERS = 16

#: seconds of work a worker may hold of queued root-ish tasks known to be short: each
#: task a worker holds beyond its slots spares it the round trip to the scheduler that
#: refilling a slot costs (a message each way and two wake-ups, which on a busy node take
#: longer than a task of microseconds), and lets one message carry many tasks each way
SHORT_RUN = 0.01
#: ... and at most this many tasks per thread
SHORT_RUN_TASKS = 256


def queue_slots(ws: WorkerInfo, saturation: float, group: TaskGroup, max_bytes: int) -> int:
    """Tasks ``ws`` may hold while queued tasks of ``group`` wait for it: its
    :func:`worker_slots`, or more when the group's tasks are known to be short and their
    results small -- as many as its threads run in :data:`SHORT_RUN` seconds, no more
    than ``max_bytes`` of results at the group's mean (``scheduler.queue-block-bytes``).

    dask's queuing holds a worker to its slots so that root tasks do not run far ahead
    of the tasks that consume their results ("root task overproduction",
    https://distributed.dask.org/en/stable/scheduling-policies.html#queuing); a few
    milliseconds of small results are no such pile, while a round trip per task keeps
    the workers of tasks of microseconds waiting on the scheduler most of the time.

    >>> from hpcsched.core.state.model import TaskGroup, WorkerInfo
    >>> ws, tg = WorkerInfo("tcp://a:1", nthreads=2), TaskGroup("x")
    >>> queue_slots(ws, 1.1, tg, 2**20)  # nothing measured yet: the slots
    3
    >>> tg.duration_total, tg.n_durations, tg.nbytes_total, tg.n_nbytes = 0.001, 10, 800, 10
    >>> queue_slots(ws, 1.1, tg, 2**20)  # 2 threads x 10 ms / 100 us
    200
    >>> queue_slots(ws, 1.1, tg, 4_000)  # 4 kB of 80-byte results
    50
    >>> tg.duration_total = 0.1  # 10 ms each: a round trip is nothing next to that
    >>> queue_slots(ws, 1.1, tg, 2**20)
    3
    """
    slots = worker_slots(ws, saturation)
    if not group.n_durations or not group.n_nbytes:
        return slots
    mean = group.duration_total / group.n_durations
    run = ws.nthreads * SHORT_RUN_TASKS if mean <= 0 else \
        min(int(ws.nthreads * SHORT_RUN / mean), ws.nthreads * SHORT_RUN_TASKS)
    nbytes = group.nbytes_total / group.n_nbytes
    if nbytes > 0:
        run = min(run, int(max_bytes // nbytes))
    return max(slots, run)


def has_resources(ws: WorkerInfo, needed: dict | None) -> bool:
    """Whether ``ws`` declares (not: has free) every resource in ``needed``."""
    if not needed:
        return True
    return all(ws.resources.get(r, 0) >= q for r, q in needed.items())


def valid_workers(ts: TaskState, workers: Iterable[WorkerInfo]) -> list[WorkerInfo] | None:
    """Workers allowed by restrictions, or None when the task has none."""
    if not ts.worker_restrictions and not ts.resource_restrictions:
        return None
    out = []
    for ws in workers:
        if ws.status != "running" or ws.reserved is not None:
            continue
        if ts.worker_restrictions and not (
            ws.address in ts.worker_restrictions or ws.name in ts.worker_restrictions
            or ws.host in ts.worker_restrictions
        ):
            continue
        if not has_resources(ws, ts.resource_restrictions):
            continue
        out.append(ws)
    return out


def transfer_bytes(ts: TaskState, ws: WorkerInfo) -> int:
    return sum(dts.nbytes for dts in ts.dependencies if ws not in dts.who_has and dts.nbytes > 0)


def worker_objective(ts: TaskState, ws: WorkerInfo, bandwidth: float
                     ) -> tuple[float, int, str]:
    """(estimated start time, bytes stored, address): smaller is better. The address
    breaks ties the same way every time (candidates come from sets of workers, whose
    order changes from run to run), so that a run of events can be replayed."""
    stack_time = ws.occupancy / max(ws.nthreads, 1)
    start_time = stack_time + transfer_bytes(ts, ws) / bandwidth
    return (start_time, ws.nbytes, ws.address)


def decide_worker(
    ts: TaskState,
    running: list[WorkerInfo],
    valid: list[WorkerInfo] | None,
    bandwidth: float,
    rng: random.Random,
) -> WorkerInfo | None:
    """Where ``ts`` (not root-ish) starts soonest; None when no worker may run it."""
    pool = valid if valid is not None else running
    if not pool:
        return None
    holders: set[WorkerInfo] = set()
    if ts.dependencies:
        # an unrestricted task: not on a worker kept for tasks needing its resources
        unrestricted = valid is None
        holders = {ws for dts in ts.dependencies for ws in dts.who_has
                   if ws.status == "running" and ws.reserved is None
                   and not (unrestricted and ws.resources_only)}
        if valid is not None:
            holders &= set(valid)
    if holders:
        candidates: list[WorkerInfo] = list(holders)
    elif len(pool) > SAMPLE_LIMIT:
        # no worker holds an input: a bounded sample of the pool, whether or not the task
        # has dependencies, so that one decision costs the same on any number of workers
        candidates = rng.sample(pool, SAMPLE_LIMIT)
    else:
        candidates = pool
    if len(candidates) == 1:
        return candidates[0]
    return min(candidates, key=lambda ws: worker_objective(ts, ws, bandwidth))


def co_assign_worker(
    ts: TaskState, tg: TaskGroup, running: list[WorkerInfo], total_nthreads: int,
    least_busy: WorkerInfo | None,
) -> WorkerInfo | None:
    """Queuing off: keep giving a TaskGroup's root-ish tasks to the worker that got the last one
    until its batch (its share of threads, in tasks) is used up, then the least-busy worker."""
    last = tg.last_worker
    if last is not None and tg.last_worker_tasks_left > 0 and last.status == "running" \
            and last.reserved is None and not last.resources_only:
        tg.last_worker_tasks_left -= 1
        return last
    ws = least_busy
    if ws is None:
        return None
    per_thread = tg.n_tasks / max(total_nthreads, 1)
    tg.last_worker = ws
    tg.last_worker_tasks_left = max(math.floor(per_thread * ws.nthreads) - 1, 0)
    return ws


def move_time(ts: TaskState, ws: WorkerInfo, bandwidth: float) -> float:
    """Seconds until the inputs of ``ts`` are on ``ws``: the bytes it lacks over the
    bandwidth, plus :data:`STEAL_LATENCY` when anything must move at all."""
    nbytes = 0
    missing = False
    for dts in ts.dependencies:
        if ws not in dts.who_has:
            missing = True
            if dts.nbytes > 0:
                nbytes += dts.nbytes
    return nbytes / bandwidth + STEAL_LATENCY if missing else 0.0


def plan_steals(
    victims: Iterable[WorkerInfo], thieves: Iterable[WorkerInfo], bandwidth: float,
    max_moves: int = STEAL_MOVES, ratio: float = 0.5,
) -> list[tuple[TaskState, WorkerInfo, WorkerInfo]]:
    """(task, victim, thief) moves: ``thieves`` with idle threads take tasks that have not
    started from ``victims`` holding more tasks than threads, when moving one costs less
    than ``ratio`` x its expected runtime (:func:`move_time`). Reads at most ``max_moves``
    thieves, and each victim once: the caller hands it the backlogged workers and a few
    idle ones, not the cluster."""
    free: list[tuple[int, int, WorkerInfo]] = []  # heap: most free threads first
    for ws in thieves:
        n = ws.nthreads - busy_slots(ws)
        if ws.status == "running" and n > 0:
            free.append((-n, len(free), ws))
            if len(free) >= max_moves:
                break
    if not free:
        return []
    heapq.heapify(free)
    backlogged = [ws for ws in victims
                  if ws.status == "running" and len(ws.processing) > ws.nthreads
                  and len(ws.processing) - len(ws.executing) > 0]
    backlogged.sort(key=lambda ws: len(ws.processing) / ws.nthreads, reverse=True)
    moves: list[tuple[TaskState, WorkerInfo, WorkerInfo]] = []
    for victim in backlogged:
        backlog = len(victim.processing) - victim.nthreads
        # lowest priority first: the victim would run those last
        stealable = sorted(
            (ts for ts in victim.processing if ts not in victim.executing and not ts.stealing
             and not ts.worker_restrictions and not ts.resource_restrictions
             and ts.width == 1),  # a wide task's slots were gathered for it: it stays
            key=lambda ts: ts.priority, reverse=True,
        )
        for ts in stealable:
            if backlog <= 0 or len(moves) >= max_moves:
                break
            if not free:
                return moves
            n, seq, thief = free[0]
            if thief is victim:
                continue
            if move_time(ts, thief, bandwidth) > ratio * victim.processing[ts]:
                continue
            moves.append((ts, victim, thief))
            if n + 1 < 0:
                heapq.heapreplace(free, (n + 1, seq, thief))
            else:
                heapq.heappop(free)
            backlog -= 1
    return moves
