"""No module of the tests imports a test module: what tests share is a harness module
(``tests/hpc/mpi_scripts.py``, ``tests/core/state/harness.py``, ...) or a fixture of a
``conftest.py``, written once.

A test module imported by another runs its module-level code twice over (marks,
hypothesis settings, skips), hands its fixtures to a module that never declared them,
and lets one copy of a helper drift from the other. Every import counts: at the top of a
module, inside a function, and in the text of code a test runs in a child process
(``python -c "from tests... import ..."``). A test module may import itself in a child.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: an import in the text of code run elsewhere (a child's ``-c``, a script written out)
IMPORT_IN_TEXT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+([\w, ]+)|import\s+([\w.]+))",
                            re.MULTILINE)


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_test_module(dotted: str) -> bool:
    """``dotted`` names a ``test_*.py`` file of the tests."""
    parts = dotted.split(".")
    return (parts[0] == TESTS.name and parts[-1].startswith("test_")
            and ROOT.joinpath(*parts).with_suffix(".py").is_file())


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    if not level:
        return module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[:len(package) - level + 1]
    return ".".join(base + ([module] if module else []))


def _named(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> list[str]:
    """The modules an import statement may load: ``from a import b`` loads ``a`` and, if
    it is a module, ``a.b``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = _absolute(node.module, node.level, importer, is_package)
    return [base] + [f"{base}.{a.name}" for a in node.names]


def imports_of_test_modules(source: str, importer: str, is_package: bool = False
                          ) -> list[tuple[int, str]]:
    """(line, test module) for each import of a test module by ``importer``'s ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [(node.lineno, m) for m in _named(node, importer, is_package)
                      if _is_test_module(m)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in IMPORT_IN_TEXT.finditer(node.value):
                base, names, plain = match.groups()
                named = ([plain] if plain else
                         [base] + [f"{base}.{n.split()[0]}" for n in names.split(",")])
                found += [(node.lineno, m) for m in named
                          if _is_test_module(m) and m != importer]
    return sorted(found)


def test_no_module_of_the_tests_imports_a_test_module():
    broken = []
    for path in sorted(TESTS.rglob("*.py")):
        importer = _module_of(path)
        for line, module in imports_of_test_modules(path.read_text(), importer,
                                                  path.name == "__init__.py"):
            broken.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not broken, ("a test module is imported; move what is shared to a harness "
                        "module or a conftest.py:\n" + "\n".join(broken))


def test_every_way_of_importing_a_test_module_is_seen():
    """The check finds an import of a test module however it is written: absolute,
    relative, from its package, inside a function, and in the text of a child's code."""
    # written with {t} for test_, so that this module's own text imports no test module
    source = '''
from tests.hpc.{t}bootstrap import run
import tests.launchers.{t}cli
from tests.core.state import {t}scheduler_state as story
from .{t}protocol import RECORDS
from tests.hpc.mpi_scripts import run

def later():
    from tests.core.state.{t}worker_state import step

CODE = """
import json
from tests.{t}startup_imports import LIBRARIES
"""
'''.format(t="test_")
    found = imports_of_test_modules(source, "tests.core.protocol.test_wire_fast_decode")
    assert found == [(2, "tests.hpc.test_bootstrap"), (3, "tests.launchers.test_cli"),
                     (4, "tests.core.state.test_scheduler_state"),
                     (5, "tests.core.protocol.test_protocol"),
                     (9, "tests.core.state.test_worker_state"),
                     (11, "tests.test_startup_imports")], found
    # a child importing the very module that starts it is that module's own business
    itself = 'CODE = "from tests.core.protocol import test_record as t"'
    assert imports_of_test_modules(itself, "tests.core.protocol.test_record") == []
    assert imports_of_test_modules(itself, "tests.core.protocol.test_wire_fast_decode") == [
        (1, "tests.core.protocol.test_record")]
