r"""Static priorities of a task graph: which ready task to run first.

``order(dependencies)`` numbers every task (0 = run first). Schedulers use the
number to break ties between ready tasks: the single-machine scheduler pushes
newly ready tasks on a LIFO stack in this order, the distributed scheduler
sorts its queues by it. The goal is a small memory footprint: finish what was
started before starting something new, so results can be released early.

The numbering is the order in which a sequential executor following these
rules would run the graph:

1. Depth-first from the outputs (tasks nothing depends on): a task is emitted
   once all its dependencies are emitted (post-order), so one branch is
   finished before the next is started::

        c   f        order: a b c d e f
        |   |        (not a d b e c f, which holds a and d together)
        b   e
        |   |
        a   d

2. Among the dependencies of a task, the one on which the most depends comes
   first: the longest critical path through it (chain of dependencies below
   plus chain of dependents above), then the most transitive dependents (a
   cheap over-counting proxy: sums over dependents), then the longest chain
   below, then the biggest subgraph below (a big subtree computed first is
   held while a small one is computed, not the other way round). Outputs
   start by the longest chain, then the smallest subgraph (an end of a
   map-overlap rather than its middle). Ties fall back to the graph's
   insertion order, never to key names. (On random DAGs the critical path
   first gave lower peaks than dependents first; both are in the key.)

3. Eager reductions: when a task is emitted, any ready task that would be the
   last consumer of one of its inputs, or that is an output (handed over at
   once), is emitted next: running it never raises the number of results
   held for long::

        ab  cd           a b ab c d cd: ab runs as soon as a and b exist
        /\  /\
       a  b c  d

4. Stay local: when a depth-first walk ends, the next walk starts from a
   not-yet-emitted dependent of the most recently emitted tasks (the one with
   the fewest missing inputs), so neighbouring outputs of a map-overlap are
   computed one after another instead of in an arbitrary order. Only when
   nothing started remains does a new output begin.

Everything is linear in the graph size except a sort of all nodes by the
metrics of rule 2 (n log n). :func:`peak_memory` simulates sequential execution
in a given order and returns the maximum number of results held at once; tests
and benchmarks compare it with ``dask.order``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from hpcsched.core.graph.dsk import GraphError, Key, check_acyclic

__all__ = ["order", "peak_memory"]

# Sums of dependents grow exponentially on lattice-like graphs; capping keeps
# the arithmetic on small ints (the comparison only needs "much larger").
_CAP = 1 << 60


def _index(dependencies: Mapping[Key, Collection[Key]]) -> tuple[list[Key], list[list[int]]]:
    """Keys in insertion order and, per node, the indices of its in-graph dependencies."""
    keys = list(dependencies)
    index = dict(zip(keys, range(len(keys)), strict=True))
    deps: list[list[int]] = []
    get = index.get
    for k in keys:
        v = dependencies[k]
        ds = [j for j in map(get, v) if j is not None]
        if len(ds) > 1 and not isinstance(v, (set, frozenset, dict)) and len(set(ds)) < len(ds):
            ds = list(dict.fromkeys(ds))  # a dependency listed twice is one edge
        deps.append(ds)
    return keys, deps


def order(dependencies: Mapping[Key, Collection[Key]]) -> dict[Key, int]:
    """Static priorities, 0 = run first, for a ``{key: dependencies}`` mapping.

    Dependencies that are not keys of the mapping are ignored (already
    computed). Raises :class:`GraphError` on a cycle.

    >>> order({"a": [], "b": ["a"], "c": [], "d": ["b", "c"]})
    {'a': 0, 'b': 1, 'c': 2, 'd': 3}
    """
    keys, deps = _index(dependencies)
    n = len(keys)
    if not n:
        return {}
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(deps):
        for d in ds:
            dependents[d].append(i)

    # Kahn's topological sort, computing the downward metrics on the way.
    depth = [1] * n  # longest chain of dependencies below, this node included
    size = [1] * n  # nodes below, over-counted on shared subgraphs
    missing = [len(ds) for ds in deps]
    topo = [i for i in range(n) if not missing[i]]
    for i in topo:  # topo grows while iterated: a queue without popping
        ds = deps[i]
        if ds:
            s = 1
            h = 0
            for d in ds:
                s += size[d]
                if depth[d] > h:
                    h = depth[d]
            size[i] = s if s < _CAP else _CAP
            depth[i] = h + 1
        for p in dependents[i]:
            missing[p] -= 1
            if not missing[p]:
                topo.append(p)
    if len(topo) != n:
        check_acyclic(dependencies)  # raises, naming the cycle
        raise GraphError("cycle in graph")  # pragma: no cover

    # Upward metrics in reverse topological order.
    total_dependents = [0] * n
    height = [1] * n  # longest chain of dependents above, this node included
    for i in reversed(topo):
        ps = dependents[i]
        if ps:
            s = len(ps)
            h = 0
            for p in ps:
                s += total_dependents[p]
                if height[p] > h:
                    h = height[p]
            total_dependents[i] = s if s < _CAP else _CAP
            height[i] = h + 1

    # Rank by the metrics of rule 2 (lexsort: last key is the primary one);
    # numpy keeps this n log n step a small part of the total.
    depth_a = np.array(depth, dtype=np.int64)
    ranked = np.lexsort((
        np.arange(n),
        -np.array(size, dtype=np.int64),
        -depth_a,
        -np.array(total_dependents, dtype=np.int64),
        -(depth_a + np.array(height, dtype=np.int64)),
    ))
    rank_a = np.empty(n, dtype=np.int64)
    rank_a[ranked] = np.arange(n)
    rank = rank_a.tolist()  # lower = preferred
    rank_of = rank.__getitem__

    missing = [len(ds) for ds in deps]  # dependencies not yet emitted
    waiting = [len(ps) for ps in dependents]  # dependents not yet emitted
    done = [False] * n
    result = [0] * n
    count = 0
    stack: list[int] = []  # depth-first work: top is processed next
    push = stack.append
    later: list[int] = []  # where to start the next walk (rule 4), top first
    # Outputs: the longest critical path first, then the smallest subgraph
    # (an end of a map-overlap rather than its middle), best last.
    outputs = sorted((i for i in range(n) if not waiting[i]),
                     key=lambda i: (depth[i], -size[i], -i))

    while count < n:
        if not stack:
            while later and done[later[-1]]:
                later.pop()
            if later:
                push(later.pop())
            else:
                while done[outputs[-1]]:
                    outputs.pop()
                push(outputs.pop())
        i = stack.pop()
        if done[i]:
            continue
        if missing[i]:
            # Come back to i once its dependencies are emitted: push them above
            # it, the preferred one on top.
            push(i)
            todo = [d for d in deps[i] if not done[d]]
            if len(todo) > 1:
                todo.sort(key=rank_of, reverse=True)
            stack.extend(todo)
            continue

        done[i] = True
        result[i] = count
        count += 1

        take: list[int] = []  # ready tasks to emit next (rule 3)
        for d in deps[i]:
            waiting[d] -= 1
            if waiting[d] == 1:
                # d's last consumer, if ready, releases d
                for p in dependents[d]:
                    if not done[p]:
                        if not missing[p]:
                            take.append(p)
                        break
        rest: list[int] = []
        for p in dependents[i]:
            missing[p] -= 1
            if missing[p] or done[p]:
                if not done[p]:
                    rest.append(p)
            elif not waiting[p] or any(waiting[d] == 1 for d in deps[p]):
                take.append(p)  # an output, or the last consumer of an input
            else:
                rest.append(p)
        if rest:
            # Fewest missing inputs on top: closest to releasing memory.
            if len(rest) > 1:
                rest.sort(key=lambda p: missing[p] * n + rank[p], reverse=True)
            later.extend(rest)
        if take:
            if len(take) > 1:
                # Outputs on top (they are handed over at once), then by rank.
                take.sort(key=lambda p: (not waiting[p], -rank[p]))
            stack.extend(take)

    return dict(zip(keys, result, strict=True))


def peak_memory(dependencies: Mapping[Key, Collection[Key]], priorities: Mapping[Key, int]) -> int:
    """Most results held at once when running the graph one task at a time by priority.

    A task's result is counted from the moment it runs (its inputs are still
    held then) until all its dependents have run; a result nothing depends on
    (an output) is counted when produced and handed over at once. Dependencies
    outside the mapping are ignored. Raises ``ValueError`` if ``priorities``
    misses a key or runs a task before one of its dependencies.
    """
    keys = list(dependencies)
    missing_keys = [k for k in keys if k not in priorities]
    if missing_keys:
        raise ValueError(f"priorities missing for keys: {missing_keys[:5]!r}")
    waiting: dict[Key, int] = dict.fromkeys(keys, 0)
    in_graph: dict[Key, list[Key]] = {}
    for k in keys:
        ds = [d for d in set(dependencies[k]) if d in waiting]
        in_graph[k] = ds
        for d in ds:
            waiting[d] += 1
    held = 0
    peak = 0
    ran: set[Key] = set()
    for k in sorted(keys, key=priorities.__getitem__):
        held += 1
        if held > peak:
            peak = held
        for d in in_graph[k]:
            if d not in ran:
                raise ValueError(f"priorities run {k!r} before its dependency {d!r}")
            waiting[d] -= 1
            if waiting[d] == 0:
                held -= 1
        if waiting[k] == 0:
            held -= 1
        ran.add(k)
    return peak
