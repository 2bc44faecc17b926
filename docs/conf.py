"""Sphinx configuration: the API reference is built from the docstrings.

Build it as CI does, warnings as errors::

    pip install -e '.[docs]'
    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys

from sphinx.application import Sphinx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # document this checkout, not an installed copy

project = "hpcsched"
author = "hpcsched developers"
copyright = "hpcsched developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style "Args:" / "Returns:" sections (ruff's convention)
    "sphinx.ext.viewcode",
    "myst_parser",  # Markdown pages: the generated protocol reference
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]

# hpcsched's names are documented where users import them (``hpcsched.Client``), in
# source order; the signature keeps the annotations, resolved against the package
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
# building the reference never initializes MPI, and needs no MPI installed
autodoc_mock_imports = ["mpi4py"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_static_path: list[str] = []


def _list_protocol_page(app: Sphinx, docname: str, source: list[str]) -> None:
    """Add docs/protocol.md to the index's table of contents when it exists.

    The page is generated from the protocol records (``python -m hpcsched.core.protocol.messages``);
    the reference builds without it too, and a toctree entry naming a missing page would be
    a warning, so an error here.
    """
    if docname == "index" and os.path.exists(os.path.join(HERE, "protocol.md")):
        source[0] = source[0].replace("\n   api\n", "\n   api\n   protocol\n", 1)


def _reread_index(app: Sphinx, env: object, added: set[str], changed: set[str],
                  removed: set[str]) -> list[str]:
    """Read the index again in an incremental build when the protocol page came or went."""
    return ["index"] if "protocol" in added | removed else []


def setup(app: Sphinx) -> None:
    """Sphinx's hook for conf.py: list the protocol page when it exists."""
    app.connect("source-read", _list_protocol_page)
    app.connect("env-get-outdated", _reread_index)
