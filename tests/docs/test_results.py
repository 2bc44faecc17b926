"""benchmarks/RESULTS.md leads with today's headline table and plots, as
benchmarks/headline.py makes them from the benchmarks' own output: every row carries its
date, commit, load and command, and the table and plots are made again from the JSON the
benchmarks wrote (``--plots-only``) without a difference."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BENCH = Path(REPO) / "benchmarks"
RESULTS = BENCH / "RESULTS.md"


def headline(text: str) -> str:
    assert "<!-- headline -->" in text and "<!-- /headline -->" in text
    return text.split("<!-- headline -->", 1)[1].split("<!-- /headline -->", 1)[0]


def test_results_lead_with_the_headline_table_and_at_least_four_plots():
    text = RESULTS.read_text()
    head = headline(text)
    assert text.index("<!-- headline -->") < text.index("## The benchmarks")
    rows = [ln for ln in head.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) >= 4, head
    for row in rows:
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC, [0-9a-f]{7,}\+?, load", row), row
        assert "`python benchmarks/" in row, row
    plots = re.findall(r"!\[[^\]]*\]\((headline/[\w-]+\.png)\)", head)
    assert len(plots) >= 4
    for plot in plots:
        assert (BENCH / plot).is_file(), plot


@pytest.mark.timeout(300)
def test_plots_only_remakes_the_table_from_the_benchmarks_output(tmp_path):
    pytest.importorskip("matplotlib")
    copy = tmp_path / "benchmarks"
    shutil.copytree(BENCH, copy, ignore=shutil.ignore_patterns("__pycache__"))
    # a head that is not today's: it must be replaced by what the JSON says
    text = RESULTS.read_text()
    stale = text.replace(headline(text), "\nstale\n")
    (copy / "RESULTS.md").write_text(stale)
    proc = subprocess.run([sys.executable, str(copy / "headline.py"), "--plots-only"],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (copy / "RESULTS.md").read_text() == text
