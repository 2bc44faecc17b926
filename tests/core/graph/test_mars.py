r"""Mars initial worker assignment (hpcsched.core.graph.mars.assign_initial) on drawn
graphs, dependencies below their dependents. ``relabel`` reruns each test with
keys renamed at random and shuffled: placement follows structure, not names.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from hpcsched.core.graph.mars import assign_initial


def tree(leaves: int) -> dict:
    """Leaves ("a", i) reduced pairwise by ("r", j)."""
    g: dict = {("a", i): [] for i in range(leaves)}
    level = list(g)
    j = 0
    while len(level) > 1:
        nxt = []
        for k in range(0, len(level), 2):
            g[("r", j)] = level[k:k + 2]
            nxt.append(("r", j))
            j += 1
        level = nxt
    return g


def groups(assignment: dict) -> list[set]:
    by_worker: dict = {}
    for k, w in assignment.items():
        by_worker.setdefault(w, set()).add(k)
    return sorted(by_worker.values(), key=lambda s: sorted(map(repr, s)))


def test_siblings_share_a_worker(relabel):
    r"""::

                      r6
                /            \
            r4                  r5
          /    \              /    \
        r0      r1          r2      r3
        / \     / \         / \     / \
      a0   a1 a2   a3     a4   a5 a6   a7

    Four workers: each pair feeding the same reduction lands on one worker.
    Two workers: each half of the tree.
    """
    g = tree(8)
    four = relabel(assign_initial, g, ["w0", "w1", "w2", "w3"])
    assert set(four) == {("a", i) for i in range(8)}
    assert groups(four) == [{("a", 2 * i), ("a", 2 * i + 1)} for i in range(4)]
    two = relabel(assign_initial, g, ["w0", "w1"])
    assert groups(two) == [{("a", i) for i in range(4)}, {("a", i) for i in range(4, 8)}]


def test_neighbours_of_a_map_overlap_stay_together(relabel):
    r"""y_i needs x_{i-1}, x_i, x_{i+1}; 12 inputs on 3 workers::

        y0  y1  y2  y3 ... y11
        |\ /|\ /|\ /|
        | X | X | X |
        |/ \|/ \|/ \|
        x0  x1  x2  x3 ... x11

    Each worker gets 4 consecutive inputs, so only the outputs at the two
    borders need data from another worker.
    """
    g: dict = {("x", i): [] for i in range(12)}
    for i in range(12):
        g[("y", i)] = [("x", j) for j in (i - 1, i, i + 1) if 0 <= j < 12]
    a = relabel(assign_initial, g, ["w0", "w1", "w2"])
    for group in groups(a):
        idx = sorted(k[1] for k in group)
        assert len(idx) == 4 and idx == list(range(idx[0], idx[0] + 4)), idx
    crossing = [y for y in range(12) if len({a[("x", j)] for j in (y - 1, y, y + 1)
                                              if 0 <= j < 12}) > 1]
    assert len(crossing) == 4


def test_balance_within_one(relabel):
    r"""Ten independent roots, each with its own dependent::

        b0  b1 ... b9
        |   |      |
        a0  a1 ... a9

    On 3 workers: shares of 4, 3 and 3 (never 4, 4, 2).
    """
    g: dict = {("a", i): [] for i in range(10)}
    g.update({("b", i): [("a", i)] for i in range(10)})
    a = relabel(assign_initial, g, ["w0", "w1", "w2"])
    assert sorted(Counter(a.values()).values()) == [3, 3, 4]


def test_first_workers_without_load_are_served_first():
    r"""The tree of ``test_siblings_share_a_worker`` (8 leaves); w0 already holds 4 tasks.

    The average, counting what workers hold, is (8 + 4) / 3 = 4: w1 and w2,
    holding nothing, get 4 each; w0 gets none.
    """
    a = assign_initial(tree(8), ["w0", "w1", "w2"], loads={"w0": 4})
    assert sorted(Counter(a.values()).items()) == [("w1", 4), ("w2", 4)]
    # A smaller load is topped up to the average: (8 + 1) / 3 = 3, so w0 gets 2.
    a = assign_initial(tree(8), ["w0", "w1", "w2"], loads={"w0": 1})
    assert Counter(a.values()) == {"w1": 3, "w2": 3, "w0": 2}


def test_disconnected_parts_are_all_assigned(relabel):
    r"""Three separate pairs, two workers::

        r0      r1      r2
        / \     / \     / \
       a0  a1  a2  a3  a4  a5

    A search that runs out of graph goes on from the next unassigned task;
    pairs are never split when the shares allow it.
    """
    g: dict = {("a", i): [] for i in range(6)}
    g.update({("r", i): [("a", 2 * i), ("a", 2 * i + 1)] for i in range(3)})
    a = relabel(assign_initial, g, ["w0", "w1"])
    assert len(a) == 6
    assert sorted(Counter(a.values()).values()) == [3, 3]
    split = [i for i in range(3) if a[("a", 2 * i)] != a[("a", 2 * i + 1)]]
    assert len(split) == 1  # 3 + 3 cannot keep all three pairs whole


def test_more_workers_than_initial_tasks():
    a = assign_initial({"a": [], "b": [], "c": ["a", "b"]}, ["w0", "w1", "w2", "w3"])
    assert set(a) == {"a", "b"}
    assert len(set(a.values())) == 2


def test_dependencies_outside_the_graph_are_ignored():
    r"""``b`` depends only on ``x``, computed earlier: ``b`` is initial too::

        c
        |\
        a b
          |
          x (not in the graph)
    """
    a = assign_initial({"a": [], "b": ["x"], "c": ["a", "b"]}, ["w0"])
    assert a == {"a": "w0", "b": "w0"}


def test_empty_graph_and_bad_input():
    assert assign_initial({}, []) == {}
    with pytest.raises(ValueError, match="no workers"):
        assign_initial({"a": []}, [])
    with pytest.raises(ValueError, match="duplicate worker"):
        assign_initial({"a": []}, ["w0", "w0"])
    with pytest.raises(ValueError, match="unknown workers.*w9"):
        assign_initial({"a": []}, ["w0"], loads={"w9": 1})
    with pytest.raises(ValueError, match="non-negative"):
        assign_initial({"a": []}, ["w0"], loads={"w0": -1})


def test_large_graph():
    """100,000 tasks (50,000 inputs of a map-overlap) on 64 workers: balanced
    and in bounded time."""
    n = 50_000
    g: dict = {("x", i): [] for i in range(n)}
    g.update({("y", i): [("x", j) for j in (i - 1, i, i + 1) if 0 <= j < n] for i in range(n)})
    t = time.process_time()
    a = assign_initial(g, [f"w{i}" for i in range(64)])
    elapsed = time.process_time() - t
    counts = Counter(a.values())
    assert len(a) == n and max(counts.values()) - min(counts.values()) <= 1
    assert elapsed < 10, f"{elapsed:.1f}s"
