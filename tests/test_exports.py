"""The lazy package exports: what type checkers see equals what ``__getattr__`` serves.

Each package with lazy exports lists its names three times -- the ``_exports`` table that
``__getattr__`` reads at run time, a literal ``__all__`` and the ``if TYPE_CHECKING:``
imports type checkers read -- and these tests keep the three equal.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["hpcsched", "hpcsched.hpc", "hpcsched.diagnostics", "hpcsched.jobqueue"]
MODULE_EXPORTS = {"hpcsched": ("config",)}  # lazy_exports(..., modules=...)


def _tables(package: str) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """``(_exports, __all__, name -> module imported under TYPE_CHECKING)`` read from source."""
    path = ROOT / package.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text())
    exports: dict[str, str] = {}
    all_: list[str] = []
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "_exports":
                exports = ast.literal_eval(node.value)
            elif node.targets[0].id == "__all__":
                all_ = ast.literal_eval(node.value)  # a literal list, or type checkers skip it
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.unparse(imp)
                for alias in imp.names:
                    name = alias.asname or alias.name
                    # `from pkg import module` names a module; `from mod import name` a name
                    typed[name] = f"{imp.module}.{alias.name}" \
                        if _is_module(f"{imp.module}.{alias.name}") else str(imp.module)
    return exports, all_, typed


def _is_module(dotted: str) -> bool:
    return (ROOT / (dotted.replace(".", "/") + ".py")).exists()


@pytest.mark.parametrize("package", PACKAGES)
def test_all_and_type_checking_imports_match_the_lazy_table(package):
    exports, all_, typed = _tables(package)
    assert exports, f"{package}: no _exports table found"
    assert all_ == sorted(exports), f"{package}: __all__ differs from _exports"
    assert typed == exports, f"{package}: TYPE_CHECKING imports differ from _exports"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_export_is_named_like_a_submodule(package):
    # importing pkg.name binds the submodule as pkg's attribute `name`, hiding a lazy export
    # of that name from then on
    exports, _, _ = _tables(package)
    folder = ROOT / package.replace(".", "/")
    clashes = {n for n in exports if (folder / f"{n}.py").exists() or (folder / n).is_dir()}
    assert clashes == set(), f"{package}: exports named like submodules: {sorted(clashes)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_export_resolves_to_its_module_object(package):
    pkg = importlib.import_module(package)
    exports, _, _ = _tables(package)
    for name, module in exports.items():
        mod = importlib.import_module(module)
        # hpcsched.config is the config module itself; hpcsched.progress is a function
        expected = mod if name in MODULE_EXPORTS.get(package, ()) else getattr(mod, name)
        assert getattr(pkg, name) is expected, name
    listed = dir(pkg)
    assert len(listed) == len(set(listed)), "dir() lists a name twice"
    assert set(exports) <= set(listed)
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        pkg.Clinet  # noqa: B018 - the attribute access is the test


def test_importing_the_package_imports_no_export():
    # a fresh interpreter: the exports load on first use, so `import hpcsched` stays cheap
    # and never starts MPI
    code = ("import sys, hpcsched, hpcsched.hpc, hpcsched.jobqueue, hpcsched.diagnostics; "
            "print(sorted(m for m in ('mpi4py', 'hpcsched.core.client.client', "
            "'hpcsched.jobqueue.systems.slurm', 'hpcsched.hpc.mpi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()
    assert out == "[]"


def test_the_package_is_marked_typed():
    # PEP 561: without py.typed installed beside the package, type checkers ignore its hints
    assert (ROOT / "hpcsched" / "py.typed").exists()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"hpcsched" = ["py.typed"]' in pyproject
