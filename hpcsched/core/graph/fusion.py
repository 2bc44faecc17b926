"""Linear-chain fusion (Mars): merge tasks that form a single chain without branches.

A task ``x`` is merged into its dependent ``y`` when ``x`` has exactly one
dependent (``y``), ``y`` has exactly one dependency (``x``) and ``x`` is not a
key the user asked for::

    a   b                 a   b
     \\ /                   \\ /
     add        ->      sum(add(a, b))   (key: sum)
      |
     sum

``a`` and ``b`` stay: they do not form a line with ``add`` (``add`` has two
dependencies). The fused task keeps the key of the chain's end and runs the
whole chain as one nested expression, so the scheduler handles one task
instead of many and no intermediate result crosses the network. Chains
longer than 100 tasks are cut into consecutive fused tasks of 100, so that
evaluating one stays far from Python's recursion limit.
"""

from __future__ import annotations

from collections.abc import Collection

from hpcsched.core.graph.dsk import Key, Task, substitute

__all__ = ["fuse_linear"]

# Longest chain fused into one task (evaluation recurses once per level; a
# longer chain becomes several consecutive fused tasks).
_MAX_CHAIN = 100


def fuse_linear(tasks: dict[Key, Task], keep: Collection[Key] = ()) -> dict[Key, Task]:
    """Fuse every linear chain of ``tasks`` into the task at its end.

    ``keep``: keys that must survive as tasks (requested by the user, or
    wanted by other graphs). Returns a new dict; ``tasks`` is not mutated.
    Linear in the size of the graph.

    >>> from hpcsched.core.graph.dsk import normalize, evaluate
    >>> inc = lambda x: x + 1
    >>> fused = fuse_linear(normalize({"a": 1, "b": (inc, "a"), "c": (inc, "b")}), keep={"c"})
    >>> list(fused), evaluate(fused["c"].expr, {})
    (['c'], 3)
    """
    keep = keep if isinstance(keep, (set, frozenset, dict)) else set(keep)
    dependents: dict[Key, list[Key]] = {k: [] for k in tasks}
    for k, t in tasks.items():
        for d in t.dependencies:
            if d in dependents:
                dependents[d].append(k)

    # into[x] = y: x is merged into y.
    into: dict[Key, Key] = {}
    for x, ps in dependents.items():
        if len(ps) == 1 and x not in keep:
            y = ps[0]
            if len(tasks[y].dependencies) == 1:
                into[x] = y
    if not into:
        return dict(tasks)
    prev = {y: x for x, y in into.items()}  # unique: y has one dependency

    out: dict[Key, Task] = {}
    for k, t in tasks.items():
        if k in into:
            continue  # lives on inside the task at the end of its chain
        if k not in prev:
            out[k] = t
            continue
        chain = [k]
        while chain[-1] in prev:
            chain.append(prev[chain[-1]])
        chain.reverse()  # head first
        # Segments of at most _MAX_CHAIN tasks: a fused task is a nested
        # expression, evaluated recursively, so it must stay shallow.
        for start in range(0, len(chain), _MAX_CHAIN):
            segment = chain[start:start + _MAX_CHAIN]
            head = tasks[segment[0]]
            expr = head.expr
            # Each step walks only that task's own expression: a chain costs
            # the sum of its expressions' sizes.
            for below, above in zip(segment, segment[1:], strict=False):
                expr = substitute(tasks[above].expr, below, expr)
            end = segment[-1]
            out[end] = Task(end, expr, head.dependencies) if len(segment) > 1 else head
    return out
