"""Lazy package exports: names imported on first use (PEP 562 ``__getattr__``).

``import hpcsched`` stays cheap and never imports mpi4py (or initializes MPI) unless
an MPI name is used. Type checkers do not run this: each package also imports its names
under ``if TYPE_CHECKING:`` so they see the real types.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
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
