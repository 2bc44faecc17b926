"""A CI run of the tests leaves the checkout as it found it.

The check is ``pytest_sessionfinish`` of tests/conftest.py, active under ``CI=true``.
Here it runs for real: the suite's conftest in a git repository of its own, and a
pytest session in a child process whose test writes into that checkout (the run must
fail, naming the file) or into its ``tmp_path`` (the run passes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(120)

WRITES_INTO_CHECKOUT = '''
from pathlib import Path

def test_writes():
    (Path(__file__).resolve().parent.parent / "stray-output.txt").write_text("x")
'''

WRITES_INTO_TMP = '''
def test_writes(tmp_path):
    (tmp_path / "output.txt").write_text("x")
'''


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   timeout=60)


def _run_session(tmp_path: Path, test_text: str, ci: str) -> subprocess.CompletedProcess:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = tmp_path / "checkout"
    (repo / "tests").mkdir(parents=True)
    shutil.copy(Path(REPO) / "tests" / "conftest.py", repo / "tests" / "conftest.py")
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_one.py").write_text(test_text)
    (repo / ".gitignore").write_text("__pycache__/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x")
    env = {**os.environ, "CI": ci, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(repo), "tests/test_one.py"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=100)


def test_a_ci_run_that_writes_into_the_checkout_fails_naming_the_file(tmp_path):
    run = _run_session(tmp_path, WRITES_INTO_CHECKOUT, ci="true")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "1 passed" in run.stdout, run.stdout
    assert "stray-output.txt" in run.stdout, run.stdout


def test_a_ci_run_that_writes_into_tmp_path_passes(tmp_path):
    run = _run_session(tmp_path, WRITES_INTO_TMP, ci="true")
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_check_is_off_outside_ci(tmp_path):
    run = _run_session(tmp_path, WRITES_INTO_CHECKOUT, ci="false")
    assert run.returncode == 0, run.stdout + run.stderr
