"""Lazy package exports: names imported on first use (PEP 562 ``__getattr__``), and
work done when an optional library is imported rather than ahead of it (:func:`when_imported`).

``import hpcsched`` stays cheap and never imports mpi4py (or initializes MPI) unless
an MPI name is used. Type checkers do not run this: each package also imports its names
under ``if TYPE_CHECKING:`` so they see the real types.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], exports: dict[str, str],
                 modules: tuple[str, ...] = ()
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a name to the module
    defining it; names in ``modules`` are modules themselves."""

    def __getattr__(name: str) -> Any:
        try:
            module = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        mod = importlib.import_module(module)
        value = mod if name in modules else getattr(mod, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        # a name already imported is in the namespace too: list it once
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


_pending: dict[str, list[Callable[[], None]]] = {}  # module -> callbacks waiting for it
_pending_lock = threading.Lock()


def when_imported(module: str, callback: Callable[[], None]) -> None:
    """Call ``callback()`` once ``module`` is imported: at once if it is already, else right
    after its code has run, in the importing thread, before the import statement returns.

    For what only matters to code of an optional library that is heavy to import (dask):
    hpcsched prepares for it when, and only if, the program loads it. A callback that
    raises is logged; the import goes on.
    """
    with _pending_lock:
        if module not in sys.modules:
            _pending.setdefault(module, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    _run(module, [callback])


def not_when_imported(module: str, callback: Callable[[], None]) -> None:
    """Forget ``callback`` if it still waits for ``module`` (what it prepared for is gone:
    a program that never imports the module would keep one per caller)."""
    with _pending_lock:
        callbacks = _pending.get(module)
        if callbacks is None or callback not in callbacks:
            return
        callbacks.remove(callback)
        if not callbacks:
            del _pending[module]
            if not _pending and _finder in sys.meta_path:
                sys.meta_path.remove(_finder)


def _run(module: str, callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:
            logging.getLogger("hpcsched").exception("preparing for %s failed", module)


class _AfterImport:
    """The ``sys.meta_path`` finder behind :func:`when_imported`: it finds nothing itself,
    it asks the finders after it and runs the callbacks after the module's code; it leaves
    ``sys.meta_path`` when no module is awaited."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _pending:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                _run_after(spec.loader, fullname)
            return spec
        return None


def _run_after(loader: Any, fullname: str) -> None:
    """Have ``loader`` run the callbacks awaiting ``fullname`` once it executed the module."""
    execute = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        execute(module)
        with _pending_lock:
            callbacks = _pending.pop(fullname, [])
            if not _pending and _finder in sys.meta_path:
                sys.meta_path.remove(_finder)
        _run(fullname, callbacks)

    loader.exec_module = exec_module


_finder = _AfterImport()
