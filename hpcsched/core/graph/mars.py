"""Initial worker assignment by breadth-first search (Mars).

Only initial tasks (those with no dependencies) are placed ahead of time; the
workers of the others follow from where their inputs end up. Placement must
be balanced (every worker gets about the same number of initial tasks) and
local (initial tasks whose results meet downstream should share a worker, so
little data crosses the network). Mars' heuristic trades one for the other:

1. select the first worker that has no task assigned yet;
2. breadth-first search the graph taken as undirected, starting from an
   unassigned initial task;
3. assign every unassigned initial task visited to that worker;
4. stop once that worker holds its share (the average number of initial tasks
   per worker, counting tasks it already holds);
5. go to 1 while workers are left.

A breadth-first search from ``a0`` reaches its siblings through the task they
feed before it reaches anything further away::

        r0      r1
       /  \\    /  \\        two workers: {a0, a1} -> w0, {a2, a3} -> w1
      a0  a1  a2  a3

Each search starts from the unassigned initial task that
:func:`hpcsched.core.graph.order.order` runs first, so the result follows the graph's
structure, not key names or insertion order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping, Sequence

from hpcsched.core.graph.dsk import Key
from hpcsched.core.graph.order import order

__all__ = ["assign_initial"]


def assign_initial(dependencies: Mapping[Key, Collection[Key]], workers: Sequence[str],
                   loads: Mapping[str, int] | None = None) -> dict[Key, str]:
    """``{initial key: worker}`` for every task of the graph without dependencies.

    ``dependencies``: ``{key: dependencies}``; dependencies outside the
    mapping are ignored (already computed), so a task depending only on those
    is initial. ``workers``: candidate workers, in order of preference.
    ``loads``: number of tasks each worker already holds (counted in the
    average; workers holding none are chosen first).

    >>> assign_initial({"a0": [], "a1": [], "r": ["a0", "a1"], "b": []}, ["w0", "w1"])
    {'a0': 'w0', 'a1': 'w0', 'b': 'w1'}
    """
    workers = list(workers)
    if len(set(workers)) != len(workers):
        raise ValueError(f"duplicate worker names in {workers!r}")
    loads = dict(loads or {})
    unknown = set(loads) - set(workers)
    if unknown:
        raise ValueError(f"loads given for unknown workers: {sorted(unknown)!r}")
    bad = {w: n for w, n in loads.items() if not isinstance(n, int) or n < 0}
    if bad:
        raise ValueError(f"loads must be non-negative integers, got {bad!r}")

    # The undirected graph, restricted to the mapping.
    neighbours: dict[Key, list[Key]] = {k: [] for k in dependencies}
    initial: list[Key] = []
    for k, ds in dependencies.items():
        has_deps = False
        for d in ds:
            if d in neighbours and d != k:
                has_deps = True
                neighbours[k].append(d)
                neighbours[d].append(k)
        if not has_deps:
            initial.append(k)
    if not initial:
        return {}
    if not workers:
        raise ValueError(f"no workers to assign {len(initial)} initial tasks to")

    is_initial = set(initial)
    priority = order(dependencies)
    starts = sorted(initial, key=priority.__getitem__)
    next_start = 0  # starts[:next_start] are assigned
    assigned: dict[Key, str] = {}
    # Step 1's order: workers holding nothing first (in the given order),
    # then the least loaded.
    position = {w: i for i, w in enumerate(workers)}
    queue = sorted(workers, key=lambda w: (loads.get(w, 0) > 0, loads.get(w, 0), position[w]))
    load_left = sum(loads.values())  # held by the workers not yet served
    for served, worker in enumerate(queue):
        if len(assigned) == len(initial):
            break
        load = loads.get(worker, 0)
        # Step 4's share: the average over the workers left, counting what
        # they hold, so shares differ by at most one (10 tasks on 3 workers:
        # 4, 3, 3) and the last worker takes whatever is left.
        unassigned = len(initial) - len(assigned)
        quota = min(unassigned,
                    math.ceil((unassigned + load_left) / (len(queue) - served)) - load)
        load_left -= load
        count = 0
        while count < quota:
            # Steps 2 and 3. A search that exhausts its connected component
            # goes on from the next unassigned initial task.
            while starts[next_start] in assigned:
                next_start += 1
            start = starts[next_start]
            seen = {start}
            frontier = deque([start])
            while frontier:
                k = frontier.popleft()
                if k in is_initial and k not in assigned:
                    assigned[k] = worker
                    count += 1
                    if count >= quota:
                        break
                for nb in neighbours[k]:
                    if nb not in seen:
                        seen.add(nb)
                        frontier.append(nb)
    return assigned
