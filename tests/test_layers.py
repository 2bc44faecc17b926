"""The package's layers point one way, and no module imports itself back in a circle.

``core`` <- ``diagnostics`` <- ``launchers`` <- ``jobqueue``, ``hpc``: a module
may import its own package and the layers below it, never one above (also
not inside a function: where the core needs something built higher up, it
names it in :mod:`hpcsched.core.seams`). The package root (``__init__``,
``__main__``, ``_lazy``) stands above every layer. Among top-level imports,
no chain of modules leads back to where it started, and no module imports a
private (``_name``) attribute of another.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hpcsched"
LAYER = {"core": 0, "diagnostics": 1, "launchers": 2, "jobqueue": 3, "hpc": 3}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of import nodes under ``if TYPE_CHECKING:`` (never run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    return skip


def _imports(name: str, top_level_only: bool = False) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names) of each hpcsched import of module ``name``."""
    tree = ast.parse(MODULES[name].read_text())
    skip = _type_checking_only(tree)
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = []
    for node in nodes:
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("hpcsched"):
            out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names
                    if a.name.startswith("hpcsched")]
    return out


def _layer(module: str) -> tuple[str, int] | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYER:
        return None
    return parts[1], LAYER[parts[1]]


def test_the_modules_were_found():
    assert "hpcsched.core.client.client" in MODULES and "hpcsched.hpc.mpi" in MODULES


def test_layers_point_one_way():
    wrong = []
    for name in MODULES:
        mine = _layer(name)
        if mine is None:
            continue
        for line, target, names in _imports(name):
            targets = [target] + [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            for t in targets:
                theirs = _layer(t)
                if theirs is not None and theirs[0] != mine[0] and theirs[1] >= mine[1]:
                    wrong.append(f"{MODULES[name].relative_to(PACKAGE.parent)}:{line}: "
                                 f"{mine[0]} imports {t}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(set(wrong)))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_module_imports_itself_back_through_others():
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        deps = set()
        for _, target, names in _imports(name, top_level_only=True):
            deps.update(t for t in [target] + [f"{target}.{n}" for n in names]
                        if t in MODULES and t != name)
        graph[name] = deps
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_is_imported_from_another_module(name):
    private = [f"line {line}: {target}.{n}" for line, target, names in _imports(name)
               for n in names if n.startswith("_") and not n.startswith("__")
               and target != name]
    assert not private, private
