"""Worker preloads, no process: a module or a ``.py`` file loaded, its ``dask_setup(worker)``
called with the worker, ``dask_teardown(worker)`` at the close, and a failure that names
the preload (dask: https://docs.dask.org/en/stable/how-to/customize-initialization.html).
"""

from __future__ import annotations

import sys
import textwrap
from types import SimpleNamespace

import pytest

from hpcsched.core.worker.preload import PreloadError, Preloads


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    """A directory for preload files; the modules they make are forgotten afterwards."""
    before = set(sys.modules)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def write(directory, name, text):
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return path


SETUP = """
    seen = []

    def dask_setup(worker):
        seen.append(("setup", worker.name))

    def dask_teardown(worker):
        seen.append(("teardown", worker.name))
"""


def test_a_module_name_is_imported_and_set_up_then_torn_down(module_dir):
    write(module_dir, "preload_by_name", SETUP)
    worker = SimpleNamespace(name="w-1")
    preloads = Preloads("preload_by_name")

    preloads.setup(worker)
    module = sys.modules["preload_by_name"]
    assert module.seen == [("setup", "w-1")]

    preloads.teardown(worker)
    assert module.seen == [("setup", "w-1"), ("teardown", "w-1")]


def test_a_py_file_is_imported_from_its_directory_under_its_name(tmp_path):
    path = write(tmp_path, "preload_by_path", SETUP)
    try:
        Preloads([str(path)]).setup(SimpleNamespace(name="w-2"))
        assert sys.modules["preload_by_path"].seen == [("setup", "w-2")]
    finally:
        sys.modules.pop("preload_by_path", None)
        sys.path.remove(str(tmp_path))


def test_a_module_without_hooks_is_only_imported(module_dir):
    write(module_dir, "preload_plain", "VALUE = 42\n")
    preloads = Preloads(["preload_plain"])
    preloads.setup(SimpleNamespace(name="w"))
    preloads.teardown(SimpleNamespace(name="w"))
    assert sys.modules["preload_plain"].VALUE == 42


def test_a_missing_module_names_itself():
    with pytest.raises(PreloadError, match="'no_such_preload_module' could not be imported"):
        Preloads("no_such_preload_module").setup(SimpleNamespace(name="w"))


def test_a_missing_file_names_itself(tmp_path):
    missing = str(tmp_path / "missing.py")
    with pytest.raises(PreloadError, match="missing.py' could not be imported"):
        Preloads(missing).setup(SimpleNamespace(name="w"))


def test_a_failing_dask_setup_names_the_preload(module_dir):
    write(module_dir, "preload_bad_setup", """
        def dask_setup(worker):
            raise ValueError("no GPU here")
    """)
    with pytest.raises(PreloadError, match="'preload_bad_setup': dask_setup failed: "
                                           "ValueError: no GPU here"):
        Preloads("preload_bad_setup").setup(SimpleNamespace(name="w"))


def test_a_failing_teardown_is_logged_and_the_others_still_run(module_dir, caplog):
    write(module_dir, "preload_first", SETUP)
    write(module_dir, "preload_bad_teardown", """
        def dask_teardown(worker):
            raise RuntimeError("gone")
    """)
    preloads = Preloads(["preload_first", "preload_bad_teardown"])
    preloads.setup(SimpleNamespace(name="w"))

    preloads.teardown(SimpleNamespace(name="w"))

    assert sys.modules["preload_first"].seen[-1] == ("teardown", "w")
    assert "preload_bad_teardown: dask_teardown failed" in caplog.text
