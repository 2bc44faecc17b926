"""Static priorities (hpcsched.core.graph.order): each test draws its graph, bottom-up
(dependencies below their dependents), and says which order it expects and why.

Graphs are ``{key: [dependencies]}``. Most tests take the ``relabel`` fixture, which
reruns them with keys renamed at random and shuffled: the order must follow the
structure, not key names or insertion order.
"""

from __future__ import annotations

import time

import pytest

from hpcsched.core.graph.dsk import GraphError
from hpcsched.core.graph.order import order, peak_memory


def sequence(o: dict) -> list:
    return sorted(o, key=o.__getitem__)


def assert_topological(dependencies: dict, o: dict) -> None:
    assert sorted(o.values()) == list(range(len(dependencies)))
    for k, deps in dependencies.items():
        for d in deps:
            if d in dependencies:
                assert o[d] < o[k], f"{k!r} runs before its dependency {d!r}"


# --- shapes (also used by the comparison with dask.order) ---------------------------


def trees(n: int = 4, depth: int = 3) -> dict:
    """n independent binary reduction trees of 2**depth leaves each."""
    g: dict = {}
    for t in range(n):
        level = []
        for i in range(2 ** depth):
            g[(f"leaf{t}", i)] = []
            level.append((f"leaf{t}", i))
        j = 0
        while len(level) > 1:
            nxt = []
            for a in range(0, len(level), 2):
                k = (f"node{t}", j)
                j += 1
                g[k] = level[a:a + 2]
                nxt.append(k)
            level = nxt
    return g


def tree_reduction(leaves: int = 16) -> dict:
    """Leaves ("x", i) summed pairwise by ("s", j)."""
    g = trees(1, leaves.bit_length() - 1)
    name = {k: ("x", k[1]) if k[0].startswith("leaf") else ("s", k[1]) for k in g}
    return {name[k]: [name[d] for d in v] for k, v in g.items()}


def broker() -> dict:
    r"""Two chains meeting a shared 'broker' input half way::

        A3        B3
        |         |
        A2        B2
        | \      / |
        A1  brk   B1
        |         |
        A0        B0
    """
    return {"brk": [], "A0": [], "A1": ["A0"], "A2": ["A1", "brk"], "A3": ["A2"],
            "B0": [], "B1": ["B0"], "B2": ["B1", "brk"], "B3": ["B2"]}


def map_overlap(n: int = 12) -> dict:
    r"""y_i needs x_{i-1}, x_i, x_{i+1}::

        y0  y1  y2  y3 ...
        |\ /|\ /|\ /|
        | X | X | X |
        |/ \|/ \|/ \|
        x0  x1  x2  x3 ...
    """
    g: dict = {("x", i): [] for i in range(n)}
    for i in range(n):
        g[("y", i)] = [("x", j) for j in (i - 1, i, i + 1) if 0 <= j < n]
    return g


def chain(n: int = 10) -> dict:
    return {("c", i): [("c", i - 1)] if i else [] for i in range(n)}


def diamond() -> dict:
    r"""::

          d
         / \
        b   c
         \ /
          a
    """
    return {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


# --- the shapes ---------------------------------------------------------------------


def test_empty():
    assert order({}) == {}


def test_docstring_example():
    assert order({"a": [], "b": ["a"], "c": [], "d": ["b", "c"]}) == {"a": 0, "b": 1, "c": 2, "d": 3}


def test_independent_trees_are_finished_one_at_a_time(relabel):
    r"""Four trees like this one, side by side::

                  n6
               /      \
            n4          n5
           /  \        /  \
         n0    n1    n2    n3
         /\    /\    /\    /\
        l0 l1 l2 l3 l4 l5 l6 l7

    Each tree must be computed completely before the next one starts: its keys
    occupy a contiguous range of priorities.
    """
    g = trees(4, 3)
    o = relabel(order, g)
    assert_topological(g, o)
    for t in range(4):
        mine = sorted(v for k, v in o.items() if k[0].endswith(str(t)))
        assert mine == list(range(mine[0], mine[0] + len(mine))), f"tree {t} interleaved"


def test_tree_reduction_reduces_each_pair_at_once(relabel):
    r"""::

                    s14
             s12             s13
         s8      s9      s10     s11
        s0  s1  s2  s3  s4  s5  s6  s7
        /\  /\  /\  /\  /\  /\  /\  /\
        x0 ...                      x15

    A sum runs right after its second input, so at most one pending input per
    level is held: peak memory is depth + 2.
    """
    g = tree_reduction(16)
    o = relabel(order, g)
    assert_topological(g, o)
    for k, deps in g.items():
        if deps:
            assert o[k] == max(o[d] for d in deps) + 1, f"{k} not run as soon as ready"
    assert peak_memory(g, o) <= 4 + 2


def test_broker_node_is_computed_late_and_branches_not_interleaved(relabel):
    """The broker (drawn in ``broker``) feeds both branches. One branch is
    finished before the other starts, and the broker is computed right before
    its first consumer instead of being held from the start."""
    g = broker()
    o = relabel(order, g)
    assert_topological(g, o)
    a = [o[f"A{i}"] for i in range(4)]
    b = [o[f"B{i}"] for i in range(4)]
    assert max(a) < min(b) or max(b) < min(a)
    assert o["brk"] == min(o["A2"], o["B2"]) - 1
    assert peak_memory(g, o) == 3


def test_map_overlap_outputs_run_as_soon_as_their_inputs_exist(relabel):
    """See ``map_overlap``: between an output's last input and the output
    itself, no new input is computed; so at most four results are held."""
    g = map_overlap(12)
    o = relabel(order, g)
    assert_topological(g, o)
    seq = sequence(o)
    for i in range(12):
        y = ("y", i)
        between = seq[max(o[d] for d in g[y]) + 1:o[y]]
        assert all(k[0] == "y" for k in between), f"{y} waits while {between} run"
    assert peak_memory(g, o) <= 4


def test_linear_chain(relabel):
    g = chain(10)
    assert sequence(relabel(order, g)) == [("c", i) for i in range(10)]


def test_long_chain_has_no_recursion_limit():
    g = chain(20_000)
    o = order(g)
    assert o[("c", 19_999)] == 19_999


def test_longer_chain_first(relabel):
    """::

            c
            |
        e   b
        |   |
        d   a

    The longer critical path starts first, and each chain is finished before the
    other starts.
    """
    g = {"a": [], "b": ["a"], "c": ["b"], "d": [], "e": ["d"]}
    assert sequence(relabel(order, g)) == ["a", "b", "c", "d", "e"]


def test_diamond(relabel):
    """See ``diamond``: the root first, the join last, right after its inputs."""
    g = diamond()
    o = relabel(order, g)
    assert_topological(g, o)
    assert o["a"] == 0 and o["d"] == 3


def test_diamond_longer_side_first(relabel):
    r"""::

            e
           / \
          c   d
          |   |
          b   |
           \ /
            a

    Both sides need a; the side with the longer critical path (b, c) is done
    first, d just before the join.
    """
    g = {"a": [], "b": ["a"], "c": ["b"], "d": ["a"], "e": ["c", "d"]}
    assert sequence(relabel(order, g)) == ["a", "b", "c", "d", "e"]


def test_most_depended_on_first(relabel):
    r"""Like dask's base-of-reduce test::

                   a3
                  /|
                a2 |
               /|  |
             a1 |  |
            /|  |  |
          a0 |  |  |
          |  |  |  |
          b0 b1 b2 b3
            \ \ / /
               c

    b0 has the most (transitive) dependents and the longest path above it: it
    runs right after c, and each b_i right before the a_i that consumes it.
    """
    g = {("a", i): [("a", i - 1), ("b", i)] for i in (1, 2, 3)}
    g[("a", 0)] = [("b", 0)]
    g.update({("b", i): ["c"] for i in range(4)})
    g["c"] = []
    o = relabel(order, g)
    assert_topological(g, o)
    assert o[("b", 0)] == 1
    for i in range(4):
        assert o[("a", i)] == o[("b", i)] + 1


def test_side_output_runs_as_soon_as_ready(relabel):
    r"""::

        m3 ------+
        |        t
        m2    s  | \
        |  \ / \ u  v
        m1  x  |
        |      |
        m0 ----+

    The walk starts from m3 (longest path). ``s`` is not on it, but once m0
    and x exist it is ready; being an output, it runs at once and m0 and x are
    released before t's inputs are computed. Deferring s to the end would
    hold m0 and x next to u, v and t.
    """
    g = {"m0": [], "m1": ["m0"], "x": [], "m2": ["m1", "x"], "u": [], "v": [],
         "t": ["u", "v"], "m3": ["m2", "t"], "s": ["x", "m0"]}
    o = relabel(order, g)
    assert_topological(g, o)
    assert o["s"] == max(o["x"], o["m0"]) + 1
    deferred = [k for k in sequence(o) if k != "s"] + ["s"]
    assert peak_memory(g, o) == 4
    assert peak_memory(g, {k: i for i, k in enumerate(deferred)}) == 6


def test_dependencies_outside_the_graph_are_ignored():
    o = order({"b": ["a-already-computed"], "c": ["b", "a-already-computed"]})
    assert o == {"b": 0, "c": 1}


def test_duplicate_dependencies_count_once():
    g = {"a": [], "b": ["a", "a"], "c": ("b", "a", "b")}
    o = order(g)
    assert sequence(o) == ["a", "b", "c"]


def test_cycle_is_named():
    with pytest.raises(GraphError, match="cycle.*'x'"):
        order({"x": ["z"], "y": ["x"], "z": ["y"], "ok": []})


def test_large_graph_is_fast():
    """100,000 nodes (map-overlap of 50,000): generous bound against a
    quadratic slip; the figure measured is in the module's report."""
    g = map_overlap(50_000)
    t = time.process_time()
    o = order(g)
    elapsed = time.process_time() - t
    assert len(o) == 100_000
    assert elapsed < 5, f"order of 100,000 nodes took {elapsed:.2f}s"
    assert peak_memory(g, o) <= 4


# --- peak_memory --------------------------------------------------------------------


def test_peak_memory_counts_held_results():
    """Diamond run a b c d: while c runs, a (needed by c), b and c are held."""
    g = diamond()
    assert peak_memory(g, {"a": 0, "b": 1, "c": 2, "d": 3}) == 3
    # Two chains interleaved hold both; one after the other holds one chain's 2.
    g = {"a": [], "b": ["a"], "c": [], "d": ["c"]}
    assert peak_memory(g, {"a": 0, "b": 1, "c": 2, "d": 3}) == 2
    assert peak_memory(g, {"a": 0, "c": 1, "b": 2, "d": 3}) == 3


def test_peak_memory_rejects_bad_priorities():
    g = diamond()
    with pytest.raises(ValueError, match="before its dependency"):
        peak_memory(g, {"b": 0, "a": 1, "c": 2, "d": 3})
    with pytest.raises(ValueError, match="missing"):
        peak_memory(g, {"a": 0})


# --- against dask.order -------------------------------------------------------------


def _f(*args):
    return None


SHAPES = {
    "independent-trees": trees(4, 3),
    "tree-reduction": tree_reduction(16),
    "broker": broker(),
    "map-overlap": map_overlap(12),
    "linear-chain": chain(10),
    "diamond": diamond(),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_peak_memory_not_worse_than_dask(shape, relabel):
    """Simulated sequential run in priority order: hpcsched holds no more
    results at once than dask.order's priorities do on the same graph."""
    import dask.order as dask_order  # in the test extra: never skipped
    g = SHAPES[shape]

    def dask_priorities(deps):
        # Every node a task (a callable tuple), so dask keeps them all.
        return dask_order.order({k: (_f, *v) for k, v in deps.items()})

    mine = peak_memory(g, relabel(order, g))
    theirs = peak_memory(g, relabel(dask_priorities, g))
    assert mine <= theirs, f"{shape}: hpcsched peak {mine} > dask {theirs}"
