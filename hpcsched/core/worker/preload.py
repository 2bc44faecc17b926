"""Worker preloads, as dask spells them
(https://docs.dask.org/en/stable/how-to/customize-initialization.html).

A preload is a module name, imported, or the path of a ``.py`` file, imported from its
directory under its file's name (so that functions it defines pickle by reference). It
is loaded when a worker starts, before it registers with the scheduler: no task runs
before it, and what it imports is warm for the first task. Its ``dask_setup(worker)``
hook, if it has one, is called then with the :class:`~hpcsched.core.worker.server.Worker`;
its ``dask_teardown(worker)`` hook when the worker closes.

One difference from dask: a preload whose import or ``dask_setup`` fails stops the worker
with a :class:`PreloadError` naming it, rather than being logged while the worker goes
on without what the tasks were promised.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any

logger = logging.getLogger("hpcsched.worker")


#: exit status of a worker process whose preload failed: EX_CONFIG of sysexits.h, so that
#: its supervisor does not start it again only to fail the same way
EXIT_PRELOAD = 78


class PreloadError(RuntimeError):
    """A worker's preload could not be imported, or its ``dask_setup`` failed."""


def preload_names(preload: str | Iterable[str] | None) -> list[str]:
    """``preload`` as a list of names: one name, several, or none.

    >>> preload_names("numpy")
    ['numpy']
    >>> preload_names(None)
    []
    """
    if preload is None:
        return []
    if isinstance(preload, str):
        return [preload]
    return list(preload)


def import_preload(name: str) -> ModuleType:
    """The module of the preload ``name``: a module name, or the path of a ``.py`` file."""
    if name.endswith(".py"):
        path = os.path.abspath(name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no file {path}")
        directory, filename = os.path.split(path)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        return importlib.import_module(os.path.splitext(filename)[0])
    return importlib.import_module(name)


class Preloads:
    """The preloads of one worker: loaded and set up at its start, torn down at its close."""

    def __init__(self, names: str | Iterable[str] | None):
        self.names = preload_names(names)
        self.modules: list[tuple[str, ModuleType]] = []

    def setup(self, worker: Any) -> None:
        """Import each preload and call its ``dask_setup(worker)``, in order.

        Raises :class:`PreloadError` naming the preload that failed."""
        for name in self.names:
            try:
                module = import_preload(name)
            except Exception as e:
                raise PreloadError(f"worker preload {name!r} could not be imported: "
                                   f"{type(e).__name__}: {e}") from e
            setup = getattr(module, "dask_setup", None)
            if setup is not None:
                try:
                    setup(worker)
                except Exception as e:
                    raise PreloadError(f"worker preload {name!r}: dask_setup failed: "
                                       f"{type(e).__name__}: {e}") from e
            self.modules.append((name, module))
            logger.info("worker preload %s loaded", name)

    def teardown(self, worker: Any) -> None:
        """Call each preload's ``dask_teardown(worker)``, last first; errors are logged."""
        while self.modules:
            name, module = self.modules.pop()
            teardown = getattr(module, "dask_teardown", None)
            if teardown is None:
                continue
            try:
                teardown(worker)
            except Exception:
                logger.exception("worker preload %s: dask_teardown failed", name)
