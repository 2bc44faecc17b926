"""Fixtures for batch-system tests: real SLURM / Grid Engine when they answer.

A test marked ``slurm`` or ``sge`` takes the fixture of the same name. It skips
when the system does not answer (``sinfo`` / ``qstat``), unless the environment
variable ``HPCSCHED_REQUIRE_BATCH`` names the system (``slurm,sge``): then it
fails loudly, so that CI cannot pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from hpcsched.core import config


def _require(system: str) -> bool:
    return system in os.environ.get("HPCSCHED_REQUIRE_BATCH", "").lower()


def _answers(cmd: list[str]) -> str | None:
    """None if ``cmd`` answers, else why not."""
    if shutil.which(cmd[0]) is None:
        return f"{cmd[0]} not on PATH"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd)} timed out"
    if r.returncode != 0:
        return f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-300:]}"
    return None


def _need(system: str, cmd: list[str]) -> None:
    why = _answers(cmd)
    if why is None:
        return
    msg = f"{system} not available ({why}); start it with: bash ci/batch/start-{system}.sh"
    if _require(system):
        pytest.fail(f"HPCSCHED_REQUIRE_BATCH={os.environ['HPCSCHED_REQUIRE_BATCH']} but {msg}")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def slurm() -> None:
    _need("slurm", ["sinfo", "-h"])


@pytest.fixture(scope="session")
def sge() -> None:
    _need("sge", ["qstat"])


@pytest.fixture
def fast_poll():
    """Poll job states every 0.2 s instead of every 2 s."""
    with config.set({"jobqueue.poll-interval": 0.2}):
        yield


@pytest.fixture
def isolated_config(monkeypatch, tmp_path):
    """No user YAML files and no HPCSCHED_JOBQUEUE__* variables leak into a test."""
    for name in list(os.environ):
        if name.startswith("HPCSCHED_JOBQUEUE"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HPCSCHED_CONFIG", raising=False)
    config.refresh()
    yield
    config.refresh()
