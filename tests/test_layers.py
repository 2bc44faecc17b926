"""The package's layers point one way, and no module imports itself back in a circle.

Every import counts: at the top of a module, inside a function, and under
``if TYPE_CHECKING:`` (a type checker follows those too, and a function-level
import is the same dependency paid later). ``import a.b`` depends on module
``a.b``; ``from a import b`` on module ``a.b`` where ``b`` is one, else on ``a``.

The rules, each named in its failure message with the ``file:line`` breaking it:

* **package layers**: ``core`` <- ``diagnostics`` <- ``launchers`` <- ``jobqueue``,
  ``hpc``: a module may import its own package and the packages below it, never
  one above or beside it. The package root (``hpcsched``, ``__main__``) stands
  above every layer; ``hpcsched._lazy`` and ``hpcsched._version`` below them all.
* **core folders**: inside ``core``, lowest first: ``protocol/``, ``graph/`` <
  ``state/`` < ``config``, ``units``, ``seams`` (config reads the state's
  defaults) < ``comm/`` < ``scheduler/``, ``worker/`` (never each other) <
  ``client/``; a folder imports its own and lower ones. The pure state
  (``state/``) imports nothing of hpcsched but ``state/``, ``graph/`` and
  ``protocol/``.
* **one seam**: where the core needs something built higher up, it names it,
  as ``module:attribute`` text, in :mod:`hpcsched.core.seams` -- which imports
  nothing of hpcsched, and names only entry points that exist, above the core
  (or in the core's top folder, ``client/``, which the worker's tasks reach up to).
  No other module of the core names a higher layer's module in a string.
* **no cycles**: no chain of imports leads from a module back to itself.
* **small folders**: no folder holds more than 16 modules (``__init__`` aside).
* **small modules, thin shells**: no module is over 800 lines, and the servers and the
  bulk maps' state (:data:`SHELLS`) are shells of at most 30 methods over parts that own
  their data.
* **private names**: no module imports a ``_name`` of another.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hpcsched"
ROOT = PACKAGE.parent

#: package -> layer, lowest first
LAYER = {"core": 0, "diagnostics": 1, "launchers": 2, "commands": 3, "jobqueue": 3, "hpc": 3}
#: folder of the core -> layer, lowest first; "base" is the core's loose modules (config,
#: units, seams), which read the state's defaults (its settings) and serve everything above
CORE_LAYER = {"protocol": 0, "graph": 0, "state": 1, "base": 2, "comm": 3, "scheduler": 4,
              "worker": 4, "client": 5}
#: what the pure state may import of hpcsched
STATE_MAY_IMPORT = {"state", "graph", "protocol"}
SEAMS = "hpcsched.core.seams"
MAX_MODULES_PER_FOLDER = 16
MAX_MODULE_LINES = 800
#: class -> its module: shells over parts with declared interfaces, at most MAX_METHODS
SHELLS = {"Worker": "hpcsched.core.worker.server", "Scheduler": "hpcsched.core.scheduler.server",
          "JobQueueCluster": "hpcsched.jobqueue.cluster",
          "BulkMaps": "hpcsched.core.state.bulk.maps"}
MAX_METHODS = 30


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _where(name: str, line: int) -> str:
    return f"{MODULES[name].relative_to(ROOT)}:{line}"


def _known(dotted: str) -> str | None:
    """The module ``dotted`` names, or the longest prefix of it that is one."""
    parts = dotted.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


@cache
def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text())


@cache
def imports(name: str) -> tuple[tuple[int, str], ...]:
    """``(line, module)`` of every hpcsched module that module ``name`` imports: at the
    top, in functions, under TYPE_CHECKING."""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, t) for a in node.names if (t := _known(a.name))]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if not base.startswith("hpcsched"):
                continue
            for a in node.names:
                t = f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else _known(base)
                if t is not None:
                    out.append((node.lineno, t))
    return tuple(sorted(set(out)))


def _package(module: str) -> str | None:
    """The package layer of ``module`` (``core``, ``hpc``, ...), ``root``, or None (the leaf
    modules every layer may use: ``_lazy``, ``_version``)."""
    parts = module.split(".")
    if module in ("hpcsched._lazy", "hpcsched._version"):
        return None
    if len(parts) < 2 or parts[1] not in LAYER:
        return "root"
    return parts[1]


def _core_folder(module: str) -> str | None:
    """The folder of core module ``module`` (``base`` for config, units, seams)."""
    parts = module.split(".")
    if parts[:2] != ["hpcsched", "core"]:
        return None
    return parts[2] if len(parts) > 2 and parts[2] in CORE_LAYER else "base"


def _edges() -> list[tuple[str, int, str]]:
    return [(name, line, t) for name in sorted(MODULES) for line, t in imports(name)
            if t != name]


# ================================================================ the rules
def test_the_modules_were_found():
    assert "hpcsched.core.client.client" in MODULES and "hpcsched.hpc.mpi" in MODULES
    assert _core_folder("hpcsched.core.config") == _core_folder("hpcsched.core") == "base"
    assert _core_folder("hpcsched.core.state") == "state"
    assert _core_folder("hpcsched.core.state.events") == "state"


def test_the_imports_are_all_counted():
    # an import inside a function, and one under TYPE_CHECKING, are found like the others
    assert "hpcsched.core.client.client" in {t for _, t in imports("hpcsched.diagnostics.report")}
    assert "hpcsched.diagnostics.server" in \
        {t for _, t in imports("hpcsched.diagnostics.extension")}
    # `from a import b`: module a.b where b is one, else a
    assert {"hpcsched.core.config", "hpcsched.core.seams"} <= \
        {t for _, t in imports("hpcsched.core.comm.registry")}


def test_packages_import_only_their_own_layer_and_lower():
    wrong = []
    for name, line, t in _edges():
        mine, theirs = _package(name), _package(t)
        if mine in (None, "root") or theirs is None or theirs == mine:
            continue
        if theirs == "root" or LAYER[theirs] >= LAYER[mine]:
            wrong.append(f"{_where(name, line)}: {mine} imports {t} "
                         f"(package layers: core <- diagnostics <- launchers <- jobqueue, hpc)")
    assert not wrong, "imports against the package layers:\n" + "\n".join(wrong)


def test_core_folders_import_only_their_own_and_lower_ones():
    wrong = []
    for name, line, t in _edges():
        mine, theirs = _core_folder(name), _core_folder(t)
        if mine is None:
            continue
        if mine == "state":
            if theirs not in STATE_MAY_IMPORT and _package(t) is not None:
                wrong.append(f"{_where(name, line)}: state imports {t} "
                             f"(the pure state imports only state/, graph/ and protocol/)")
            continue
        if theirs is None or theirs == mine:
            continue
        if CORE_LAYER[theirs] >= CORE_LAYER[mine]:
            wrong.append(f"{_where(name, line)}: {mine} imports {t} (core folders: protocol, "
                         "graph < state < config, units, seams < comm < scheduler, worker "
                         "< client)")
    assert not wrong, "imports against the core's folder layers:\n" + "\n".join(wrong)


def _entry_points() -> dict[str, str]:
    for node in _tree(SEAMS).body:
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "SEAMS" \
                and node.value is not None:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{MODULES[SEAMS].relative_to(ROOT)}: no SEAMS table")


def test_the_seams_are_names_of_entry_points_up_the_layers():
    """A seam names an entry point above the core, or in the core's top folder (the
    client, which the worker's tasks and the code below the Client reach up to)."""
    wrong = [f"{_where(SEAMS, line)}: seams imports {t} (the seams are string names only)"
             for line, t in imports(SEAMS)]
    for seam, spec in _entry_points().items():
        module, _, attr = spec.partition(":")
        defined = set()
        if module in MODULES:
            for node in _tree(module).body:
                if isinstance(node, ast.FunctionDef | ast.ClassDef):
                    defined.add(node.name)
                elif isinstance(node, ast.Assign):
                    defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    defined.add(node.target.id)
        if attr not in defined:
            wrong.append(f"{MODULES[SEAMS].relative_to(ROOT)}: seam {seam!r} names {spec}, "
                         "which does not exist (every seam names an entry point)")
        elif _package(module) == "core" and not module.startswith("hpcsched.core.client."):
            wrong.append(f"{MODULES[SEAMS].relative_to(ROOT)}: seam {seam!r} names {spec} "
                         "below the core's client (a seam is a way up; the core imports its "
                         "own modules)")
    assert not wrong, "\n".join(wrong)


_HIGHER = re.compile(r"hpcsched\.(diagnostics|launchers|jobqueue|hpc)\b[\w.]*(:\w+)?")


def test_only_the_seams_name_a_higher_layer():
    wrong = []
    for name in sorted(MODULES):
        if _package(name) != "core" or name == SEAMS:
            continue
        loggers = {id(n.args[0]) for n in ast.walk(_tree(name)) if isinstance(n, ast.Call)
                   and ast.unparse(n.func).endswith("getLogger") and n.args}
        for node in ast.walk(_tree(name)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in loggers and _HIGHER.fullmatch(node.value):
                wrong.append(f"{_where(name, node.lineno)}: {node.value!r} (one seam: the core "
                             f"names what it needs from higher layers in {SEAMS} only)")
    assert not wrong, "ways up past the seams:\n" + "\n".join(wrong)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
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
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, _, t in _edges():
        graph[name].add(t)
    report = []
    for comp in cycles(graph):
        members = set(comp)
        report.append(f"a cycle of {len(comp)} modules (no import cycles):")
        report += [f"  {_where(name, line)}: {name} imports {t}"
                   for name, line, t in _edges() if name in members and t in members]
    assert not report, "\n".join(report)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_folder_holds_more_than_16_modules():
    folders: dict[Path, int] = {}
    for path in MODULES.values():
        if path.name != "__init__.py":
            folders[path.parent] = folders.get(path.parent, 0) + 1
    wrong = [f"{folder.relative_to(ROOT)}/: {n} modules (at most {MAX_MODULES_PER_FOLDER} "
             "a folder: split it by concern)"
             for folder, n in sorted(folders.items()) if n > MAX_MODULES_PER_FOLDER]
    assert not wrong, "\n".join(wrong)


def test_no_module_is_over_800_lines():
    wrong = [f"{path.relative_to(ROOT)}: {n} lines (at most {MAX_MODULE_LINES}: split it "
             "along an interface)" for path in MODULES.values()
             if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not wrong, "\n".join(wrong)


def test_the_servers_are_thin_shells():
    wrong = []
    for cls, module in SHELLS.items():
        (node,) = [n for n in _tree(module).body if isinstance(n, ast.ClassDef) and n.name == cls]
        n = sum(isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) for d in node.body)
        if n > MAX_METHODS:
            wrong.append(f"{MODULES[module].relative_to(ROOT)}: {cls} has {n} methods "
                         f"(at most {MAX_METHODS}: give a part its own data and interface)")
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module():
    wrong = []
    for name in sorted(MODULES):
        for node in ast.walk(_tree(name)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpcsched"):
                wrong += [f"{_where(name, node.lineno)}: {node.module}.{a.name} (private "
                          "names stay in their module)" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")
                          and f"{node.module}.{a.name}" not in MODULES and node.module != name]
    assert not wrong, "\n".join(wrong)
