"""Imported first by every benchmark: the hpcsched it measures is this checkout's.

A benchmark runs as ``python benchmarks/bench_x.py``, which puts ``benchmarks/`` first on
``sys.path``, not the checkout: an hpcsched installed in the environment (``pip install
.`` of another commit) would be measured instead, in the driver and in every process it
starts, without a word. This puts the checkout's root first on ``sys.path`` and on
``PYTHONPATH`` (for the schedulers, workers and ranks started from here).
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if sys.path[:1] != [REPO]:
    sys.path.insert(0, REPO)
_paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
if _paths[:1] != [REPO]:
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO, *(p for p in _paths if p)])
