"""Fixtures for batch-system tests: real SLURM / Grid Engine when they answer.

A test marked ``slurm`` or ``sge`` takes the fixture of the same name (``torque``: the
Torque wrappers over SLURM, from ``ci/batch/start-torque.sh``). It skips
when the system does not answer (``sinfo`` / ``qstat``), unless the environment
variable ``HPCSCHED_REQUIRE_BATCH`` names the system (``slurm,sge``): then it
fails loudly, so that CI cannot pass by skipping.

``batch`` is one of the four batch systems (:class:`tests.jobqueue.batch.Batch`): it
cancels whatever a failing test leaves behind, and checks that nothing is left queued.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess

import pytest

import hpcsched.jobqueue.dask_config as dask_config
from hpcsched.core import config
from tests.jobqueue.batch import ROOT, Batch


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


#: where ci/batch/start-torque.sh unpacks SchedMD's Torque wrappers (BATCH_STATE_DIR)
TORQUE_BIN = os.path.join(os.environ.get("BATCH_STATE_DIR", "/var/tmp/hpcsched-batch"),
                          "torque", "root", "usr", "bin")


@pytest.fixture(scope="session")
def torque(slurm) -> str:
    """The directory of the Torque wrappers over SLURM, to put first on PATH."""
    qstat = os.path.join(TORQUE_BIN, "qstat")
    why = None if os.access(qstat, os.X_OK) else f"{qstat} missing"
    if why is None:
        env = dict(os.environ, PATH=f"{TORQUE_BIN}{os.pathsep}{os.environ['PATH']}")
        r = subprocess.run([qstat], capture_output=True, text=True, timeout=30, env=env)
        why = None if r.returncode == 0 else f"qstat exited {r.returncode}: {r.stderr[-300:]}"
    if why is not None:
        msg = f"Torque wrappers not available ({why}); install them: bash ci/batch/start-torque.sh"
        if _require("torque"):
            pytest.fail(f"HPCSCHED_REQUIRE_BATCH={os.environ['HPCSCHED_REQUIRE_BATCH']} but {msg}")
        pytest.skip(msg)
    return TORQUE_BIN


@pytest.fixture
def fast_poll():
    """Poll job states every 0.2 s instead of every 2 s."""
    with config.set({"jobqueue.poll-interval": 0.2}):
        yield


@pytest.fixture
def reread_dask_config():
    """A function that makes dask's configuration what a process started now would read
    (dask reads its files and ``DASK_*`` variables once, when imported); dask's
    configuration is given back as it was after the test."""
    try:
        import dask.config
    except ImportError:  # dask is optional: hpcsched then reads the files itself
        yield lambda: None
        return
    saved = copy.deepcopy(dask.config.config)

    def reread() -> None:
        dask.config.refresh(paths=dask_config.search_paths())

    yield reread
    dask.config.config.clear()
    dask.config.config.update(saved)


@pytest.fixture
def isolated_config(monkeypatch, tmp_path, reread_dask_config):
    """No user YAML files (hpcsched's or dask's) and no HPCSCHED_JOBQUEUE__* /
    DASK_JOBQUEUE__* variables leak into a test."""
    for name in list(os.environ):
        if name.startswith(("HPCSCHED_JOBQUEUE", "DASK_JOBQUEUE", "PBS_ACCOUNT", "LSF_ENVDIR")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DASK_ROOT_CONFIG", str(tmp_path / "etc-dask"))
    monkeypatch.delenv("HPCSCHED_CONFIG", raising=False)
    monkeypatch.delenv("DASK_CONFIG", raising=False)
    config.refresh()
    reread_dask_config()
    yield
    config.refresh()


#: the systems the tests run on emulators of (tests/jobqueue/emulators)
EMULATED = ("pbs", "lsf", "htcondor", "oar", "moab", "flux")


@pytest.fixture(params=[pytest.param("slurm", marks=pytest.mark.slurm),
                        pytest.param("sge", marks=pytest.mark.sge), "pbs", "lsf"])
def batch(request, tmp_path, monkeypatch, fast_poll):
    system = request.param
    env = dict(os.environ)
    state = tmp_path / "emu-state"
    if system in ("slurm", "sge"):
        request.getfixturevalue(system)  # skip / fail loudly when not running
    elif system == "torque":
        bin_dir = request.getfixturevalue("torque")
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        monkeypatch.setenv("PATH", env["PATH"])
        # the wrappers send a job's output to the submitting directory (pbs.py's docstring)
        monkeypatch.chdir(tmp_path)
    else:
        if not (ROOT / "tests/jobqueue/emulators/__init__.py").exists():
            pytest.skip("the PBS/LSF emulators are not in this tree")
        from tests.jobqueue.emulators import emulator_env

        env = emulator_env(system, state)
        for k, v in env.items():
            if os.environ.get(k) != v:
                monkeypatch.setenv(k, v)
    b = Batch(system, tmp_path / "logs", env)
    yield b
    for c in b.clusters:
        b.record(c)
        c.close()
    try:
        b.assert_queue_empty()
    finally:
        if system in EMULATED:
            from tests.jobqueue.emulators import cleanup

            cleanup(state)
