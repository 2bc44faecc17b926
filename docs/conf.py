"""Sphinx configuration: the pages are MyST Markdown, the API reference is built from the
docstrings, and the configuration and command-line reference from the code
(``_ext/hpcsched_reference.py``).

Build it as CI does, warnings as errors::

    pip install -e '.[docs]'
    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # document this checkout, not an installed copy
sys.path.insert(0, os.path.join(HERE, "_ext"))

project = "hpcsched"
author = "hpcsched developers"
copyright = "hpcsched developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style "Args:" / "Returns:" sections (ruff's convention)
    "sphinx.ext.viewcode",
    "myst_parser",  # Markdown pages, as every page but the API reference is written
    "hpcsched_reference",  # the configuration and command-line reference, from the code
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links, as GitHub makes them

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
