r"""Linear-chain fusion (hpcsched.core.graph.fusion), on drawn graphs (dependencies below).

Graphs are dask-style dicts normalized with graph.normalize; a fused graph must
compute the same values as the original (graph.evaluate, in dependency order).
"""

from __future__ import annotations

import copy
import time
from operator import add

from hpcsched.core.graph.dsk import Call, Ref, Task, evaluate, normalize
from hpcsched.core.graph.fusion import fuse_linear
from hpcsched.core.graph.order import order


def inc(x):
    return x + 1


def double(x):
    return 2 * x


def run(tasks: dict[object, Task]) -> dict:
    """Evaluate every task in a dependency-respecting order."""
    o = order({k: t.dependencies for k, t in tasks.items()})
    data: dict = {}
    for k in sorted(tasks, key=o.__getitem__):
        data[k] = evaluate(tasks[k].expr, data)
    return data


def test_chain_of_five_becomes_one_task():
    r"""::

        c4          c4 = inc(inc(inc(inc(c0))))
        |
        c3
        |
        c2     ->
        |
        c1
        |
        c0
    """
    dsk = {"c0": 1, "c1": (inc, "c0"), "c2": (double, "c1"), "c3": (inc, "c2"),
           "c4": (double, "c3")}
    tasks = normalize(dsk)
    fused = fuse_linear(tasks, keep={"c4"})
    assert list(fused) == ["c4"]
    assert fused["c4"].dependencies == frozenset()
    assert evaluate(fused["c4"].expr, {}) == run(tasks)["c4"] == 2 * (2 * (1 + 1) + 1)


def test_mars_rand_add_sum():
    r"""The example of the Mars documentation, ``(a + b).sum()``::

          sum
           |           fused(sum) = sum(add(a, b))
          add
          / \
         a   b

    add and sum form a line and fuse under sum's key; a and b do not (add has
    two dependencies), and stay separate tasks.
    """
    dsk = {"a": (list, range(3)), "b": (list, range(10, 13)),
           "add": (lambda x, y: [i + j for i, j in zip(x, y, strict=True)], "a", "b"),
           "sum": (sum, "add")}
    tasks = normalize(dsk)
    fused = fuse_linear(tasks, keep={"sum"})
    assert set(fused) == {"a", "b", "sum"}
    assert fused["a"] is tasks["a"] and fused["b"] is tasks["b"]
    assert fused["sum"].dependencies == {"a", "b"}
    assert run(fused)["sum"] == run(tasks)["sum"] == 36


def test_branches_are_not_fused():
    r"""::

        y   z
         \ /
          x       x has two dependents: nothing fuses into y or z.
          |
          w       w -> x is a line: w fuses into x.
    """
    dsk = {"w": 1, "x": (inc, "w"), "y": (inc, "x"), "z": (double, "x")}
    tasks = normalize(dsk)
    fused = fuse_linear(tasks, keep={"y", "z"})
    assert set(fused) == {"x", "y", "z"}
    assert fused["y"] is tasks["y"] and fused["z"] is tasks["z"]
    assert fused["x"].dependencies == frozenset()
    assert fused["x"].expr == Call(inc, (1,))
    assert {k: v for k, v in run(fused).items()} == {"x": 2, "y": 3, "z": 4}


def test_join_is_not_fused_into():
    r"""::

          j
         / \
        p   q      j has two dependencies: p and q stay; their own chains fuse.
        |   |
        p0  q0
    """
    dsk = {"p0": 1, "p": (inc, "p0"), "q0": 2, "q": (inc, "q0"), "j": (add, "p", "q")}
    tasks = normalize(dsk)
    fused = fuse_linear(tasks, keep={"j"})
    assert set(fused) == {"p", "q", "j"}
    assert fused["j"] is tasks["j"]
    assert run(fused)["j"] == run(tasks)["j"] == 5


def test_kept_keys_are_not_fused_away():
    r"""::

        c
        |      b was asked for: it survives; c still absorbs nothing
        b      (b is kept), but a fuses into b.
        |
        a
    """
    dsk = {"a": 1, "b": (inc, "a"), "c": (inc, "b")}
    tasks = normalize(dsk)
    fused = fuse_linear(tasks, keep={"b", "c"})
    assert set(fused) == {"b", "c"}
    assert fused["c"] is tasks["c"]
    assert fused["b"].dependencies == frozenset()
    assert run(fused) == {"b": 2, "c": 3}
    # Keep is any collection, not only a set.
    assert set(fuse_linear(tasks, keep=["b"])) == {"b", "c"}


def test_root_with_several_dependents_is_not_fused():
    r"""::

        y1  y2  y3
          \ | /        r feeds three tasks: it stays.
            r
    """
    dsk = {"r": 1, "y1": (inc, "r"), "y2": (double, "r"), "y3": (add, "r", 5)}
    tasks = normalize(dsk)
    fused = fuse_linear(tasks)
    assert fused == tasks and fused is not tasks


def test_external_dependency_blocks_fusion():
    r"""::

        y    (also depends on e, computed earlier, not in this graph)
        |
        x
    y has two dependencies (x and e), so x does not fuse into it.
    """
    tasks = {"x": Task("x", Call(inc, (1,))),
             "y": Task("y", Call(add, (Ref("x"), Ref("e"))), frozenset({"x", "e"}))}
    assert fuse_linear(tasks) == tasks


def test_input_not_mutated():
    dsk = {"a": 1, "b": (inc, "a"), "c": (inc, "b")}
    tasks = normalize(dsk)
    before = copy.deepcopy(tasks)
    fuse_linear(tasks, keep={"c"})
    assert tasks == before


def test_nested_structures_are_substituted():
    r"""b uses a inside a list and a kwarg-free nested call::

        b = sum([a, inc(a)])     ->   b = sum([a-expr, inc(a-expr)])
        |
        a = double(3)
    """
    dsk = {"a": (double, 3), "b": (sum, ["a", (inc, "a")])}
    tasks = normalize(dsk)
    fused = fuse_linear(tasks, keep={"b"})
    assert list(fused) == ["b"]
    assert evaluate(fused["b"].expr, {}) == 6 + 7


def test_long_chain_is_cut_into_shallow_tasks_in_linear_time():
    """A chain of 20,000 incs fuses into 200 tasks of 100 (a 20,000-deep
    nested expression would overflow the recursion of evaluate)."""
    n = 20_000
    dsk = {("c", 0): 0}
    dsk.update({("c", i): (inc, ("c", i - 1)) for i in range(1, n)})
    tasks = normalize(dsk)
    t = time.process_time()
    fused = fuse_linear(tasks, keep={("c", n - 1)})
    elapsed = time.process_time() - t
    assert elapsed < 2, f"fusing a chain of {n} took {elapsed:.2f}s"
    assert sorted(fused) == [("c", i) for i in range(99, n, 100)]
    assert fused[("c", 199)].dependencies == {("c", 99)}
    assert run(fused)[("c", n - 1)] == n - 1
