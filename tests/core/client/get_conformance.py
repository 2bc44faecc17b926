"""What every ``get(dsk, keys)`` function must do, as one mixin of tests: the
single-machine scheduler's ``get`` and the distributed ``Client.get`` pass it::

    class TestClientGet(GetFunctionTestMixin):
        get = staticmethod(lambda dsk, keys: client.get(dsk, keys))

The tasks it runs are here too, importable by the workers that run them.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import add
from typing import Any

import pytest

from hpcsched.core.graph.dsk import GraphError


def inc(x):
    return x + 1


def boom(*args):
    raise ZeroDivisionError("boom in a task")


class MyError(Exception):
    """A user-defined exception type, to show types are kept."""


def raise_my_error(x):
    raise MyError(f"bad input {x}")


class GetFunctionTestMixin:
    """Conformance tests for a ``get(dsk, keys)`` function: set ``get``
    (a staticmethod) on the subclass."""

    get: Callable[..., Any]
    #: what a list of keys gives: dask's get functions return tuples, distributed's
    #: ``Client.get`` lists
    seq: type = tuple

    def shaped(self, x: Any) -> Any:
        return self.seq(self.shaped(i) for i in x) if isinstance(x, list) else x

    def test_get(self):
        d = {"x": 1, "y": (inc, "x"), "z": (add, "x", "y")}
        assert self.get(d, "x") == 1
        assert self.get(d, "y") == 2
        assert self.get(d, "z") == 3

    def test_tuple_keys(self):
        d = {("x", 0): 1, ("x", 1): (inc, ("x", 0)), "s": (add, ("x", 0), ("x", 1))}
        assert self.get(d, "s") == 3
        assert self.get(d, [("x", 1)]) == self.shaped([2])

    def test_missing_key_is_named(self):
        d = {"x": 1, "y": (inc, "x")}
        with pytest.raises(KeyError, match="badkey"):
            self.get(d, "badkey")

    def test_nested_missing_key_is_named(self):
        d = {"x": 1, "y": 2, "z": (sum, ["x", "y"])}
        with pytest.raises(KeyError, match="badkey"):
            self.get(d, [["badkey"], "y"])

    def test_list_of_keys(self):
        d = {"x": 1, "y": 2, "z": (sum, ["x", "y"])}
        assert self.get(d, ["x", "y", "z"]) == self.shaped([1, 2, 3])
        assert self.get(d, []) == self.shaped([])

    def test_nested_list_of_keys(self):
        d = {"x": 1, "y": 2, "z": (sum, ["x", "y"])}
        assert self.get(d, [["x"], ["y", ["z"]]]) == self.shaped([[1], [2, [3]]])

    def test_literal_values(self):
        d = {"a": [1, 2, 3], "b": "a", "c": [1, (inc, 1)], "d": [(sum, "a")],
             "e": ["a", "b"], "f": [[[(sum, "a"), "c"], (sum, "b")], 2], "g": "not-a-key",
             "h": {"k": "a"}}
        assert self.get(d, "a") == [1, 2, 3]
        assert self.get(d, "b") == [1, 2, 3]  # an alias
        assert self.get(d, "c") == [1, 2]
        assert self.get(d, "d") == [6]
        assert self.get(d, "e") == [[1, 2, 3], [1, 2, 3]]
        assert self.get(d, "f") == [[[6, [1, 2]], 6], 2]
        assert self.get(d, "g") == "not-a-key"
        assert self.get(d, "h") == {"k": [1, 2, 3]}

    def test_nested_tasks(self):
        d = {"x": 1, "y": (inc, "x"), "z": (add, (inc, "x"), "y")}
        assert self.get(d, "z") == 4

    def test_unhashable_values_in_tasks(self):
        d = {"x": 1, "y": (lambda x, s: x + len(s), "x", {1, 2})}
        assert self.get(d, "y") == 3

    def test_long_chain(self):
        d = {f"x{i + 1}": (inc, f"x{i}") for i in range(2000)}
        d["x0"] = 0
        assert self.get(d, "x2000") == 2000

    def test_exception_keeps_its_type(self):
        d = {"x": 1, "y": (raise_my_error, "x"), "z": (inc, "y")}
        with pytest.raises(MyError, match="bad input 1"):
            self.get(d, "z")
        with pytest.raises(ZeroDivisionError, match="boom in a task"):
            self.get({"a": (boom,)}, "a")

    def test_cycle(self):
        d = {"x": (inc, "z"), "y": (inc, "x"), "z": (inc, "y")}
        with pytest.raises(GraphError, match="cycle"):
            self.get(d, "x")

    def test_self_dependence(self):
        with pytest.raises(GraphError, match="depends on itself"):
            self.get({"x": (inc, "x")}, "x")
