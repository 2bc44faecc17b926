"""Reference pages written from the code as the site builds: nothing is written twice.

* ``configuration_reference()``: every configuration key (:data:`hpcsched.core.config.DEFAULTS`)
  with its default, its unit, its environment variable and its meaning, the ``#:`` comment
  above its field in the settings class (:mod:`hpcsched.core.settings`,
  :mod:`hpcsched.core.state.settings`), read as autodoc reads attribute comments.
* ``cli_reference()``: the ``--help`` of each command, as the command prints it.

A page holds a line ``<!-- generated: configuration -->`` (or ``cli``); the ``source-read``
hook replaces it with the generated Markdown, so the pages in git stay short and the site
never disagrees with the code. ``tests/docs/test_reference.py`` checks that no key is
missing and that each has a meaning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer

MARKER = "<!-- generated: {} -->"

#: the commands whose help the command-line reference shows, in this order
COMMANDS: tuple[tuple[str, list[str]], ...] = (
    ("hpcsched", ["--help"]),
    ("hpcsched scheduler", ["scheduler", "--help"]),
    ("hpcsched worker", ["worker", "--help"]),
    ("python -m hpcsched (under mpiexec or srun)", ["--mpi-help"]),
    ("hpcsched submit", ["submit", "--help"]),
    ("hpcsched job", ["job", "--help"]),
    ("hpcsched history", ["history", "--help"]),
)


def setting_docs() -> dict[tuple[str, str], str]:
    """``{(class name, field name): meaning}`` of every settings class's fields."""
    from hpcsched.core.settings import SETTINGS

    out: dict[tuple[str, str], str] = {}
    for module in sorted({cls.__module__ for cls in SETTINGS}):
        for (cls_name, name), lines in ModuleAnalyzer.for_module(module).find_attr_docs().items():
            out[(cls_name, name)] = " ".join(ln.strip() for ln in lines if ln.strip())
    return out


def _shown(value: Any) -> str:
    """A default as it would be written in a YAML file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value)
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def configuration_rows() -> list[tuple[str, str, str, str, str]]:
    """``(key, default, unit, environment variable, meaning)`` for every key, by section."""
    from hpcsched.core.settings import SETTINGS
    from hpcsched.core.state.settings import config_keys, unit_of

    docs = setting_docs()
    rows = []
    for cls in SETTINGS:
        defaults = cls()
        for name, key in config_keys(cls).items():
            env = "HPCSCHED_" + key.upper().replace(".", "__").replace("-", "_")
            rows.append((key, _shown(getattr(defaults, name)), unit_of(cls, name) or "",
                         env, docs.get((cls.__name__, name), "")))
    return sorted(rows)


def configuration_reference() -> str:
    """The configuration keys as Markdown: a table per section."""
    out: list[str] = []
    section = None
    for key, default, unit, env, meaning in configuration_rows():
        top = key.split(".")[0]
        if top != section:
            section = top
            out += ["", f"## `{section}`", "", "| key | default | meaning |", "| --- | --- | --- |"]
        unit_text = f" ({unit})" if unit else ""
        out.append(f"| `{key}`<br>`{env}` | `{_cell(default)}`{unit_text} | {_cell(meaning)} |")
    return "\n".join(out) + "\n"


def _help_of(args: list[str]) -> str:
    if args == ["--mpi-help"]:
        # MPI mode's parser is reached with a script name; its help never starts MPI
        code = "from hpcsched.hpc.command import _parse; _parse(['--help'])"
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, "-m", "hpcsched", *args]
    env = dict(os.environ, COLUMNS="92")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def cli_reference() -> str:
    """Each command's ``--help`` as Markdown (the commands run side by side: each is a
    Python start, most of the time they take)."""
    with ThreadPoolExecutor(len(COMMANDS)) as pool:
        helps = list(pool.map(_help_of, [args for _, args in COMMANDS]))
    out = []
    for (title, _), text in zip(COMMANDS, helps, strict=True):
        out += [f"## `{title}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


GENERATORS = {"configuration": configuration_reference, "cli": cli_reference}


def _fill(app: Sphinx, docname: str, source: list[str]) -> None:
    for name, make in GENERATORS.items():
        marker = MARKER.format(name)
        if marker in source[0]:
            source[0] = source[0].replace(marker, make())


def setup(app: Sphinx) -> dict[str, Any]:
    """Sphinx's hook: fill the generated parts of the reference pages."""
    app.connect("source-read", _fill)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
