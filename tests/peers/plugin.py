"""A pytest plugin that runs dask-jobqueue's and dask-mpi's own test suites against
hpcsched: ``python -m pytest -p tests.peers.plugin --pyargs dask_jobqueue.tests``.

It installs the import-line change (:mod:`tests.peers.shims`) before anything is
collected, gives the peers' tests what their repositories' top-level ``conftest.py``
gives them (that file is not in the wheels): the ``-E NAME`` option choosing a batch
system, the ``env`` and ``xfail_env`` markers, the ``Cluster`` and
``EnvSpecificCluster`` fixtures, dask-mpi's ``mpirun`` fixture; and marks each test of
:data:`tests.peers.differences.DIFFERENCES` as an expected failure (strict: a listed
test that passes fails the run, so the list stays true), then prints that list.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
from pathlib import Path

import pytest
from distributed.utils_test import loop, loop_in_thread  # noqa: F401 - the peers' fixtures

from tests.peers import shims
from tests.peers.differences import DIFFERENCES, patterns

shims.install()

SITE = str(Path(__file__).with_name("site"))
ROOT = str(Path(__file__).parents[2])


def pytest_addoption(parser):
    parser.addoption("-E", action="store", metavar="NAME", default=None,
                     help="run the tests of batch system NAME (slurm, sge, pbs, lsf, ...)")


#: where ci/batch/start-torque.sh unpacks SchedMD's Torque wrappers over SLURM: PBS's
#: commands for ``-E pbs``
TORQUE_BIN = os.path.join(os.environ.get("BATCH_STATE_DIR", "/var/tmp/hpcsched-batch"),
                          "torque", "root", "usr", "bin")
_emulated: list = []


def _batch_system(name: str | None) -> None:
    """Put the commands of batch system ``name`` on PATH: the Torque wrappers for PBS,
    the emulators of tests/jobqueue/emulators/ for the systems Debian does not have;
    SLURM and Grid Engine are the machine's own."""
    if name == "pbs":
        os.environ["PATH"] = f"{TORQUE_BIN}{os.pathsep}{os.environ['PATH']}"
        return
    from tests.jobqueue import emulators

    if name in getattr(emulators, "BIN", {}):
        import tempfile

        state = tempfile.mkdtemp(prefix=f"peers-{name}-")
        os.environ.update(emulators.emulator_env(name, state))
        _emulated.append(state)


_scratch: list = []  # (directory, the working directory before it)


def pytest_unconfigure(config):
    from tests.jobqueue import emulators

    while _scratch:
        directory, before = _scratch.pop()
        os.chdir(before)
        shutil.rmtree(directory, ignore_errors=True)
    while _emulated:
        state = _emulated.pop()
        emulators.cleanup(state)
        shutil.rmtree(state, ignore_errors=True)


def pytest_configure(config):
    _batch_system(config.getoption("-E"))
    config.addinivalue_line("markers", "env(NAME): needs batch system NAME (-E NAME)")
    config.addinivalue_line("markers", "xfail_env(MAP): known failures per batch system")
    config.addinivalue_line("markers", "asyncio: a coroutine test (pytest-asyncio)")
    # the subprocesses the tests start (scripts under mpirun) get the same import change
    path = [SITE, ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    # the tests run in a scratch directory: what their jobs leave in the working directory
    # (the Torque wrappers' .o/.e files, relative log directories) goes with it
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import tempfile

    scratch = tempfile.mkdtemp(prefix="peers-run-")
    _scratch.append((scratch, os.getcwd()))
    os.chdir(scratch)


def _envs(item) -> list:
    names: list = []
    for mark in item.iter_markers(name="env"):
        arg = mark.args[0]
        names.extend(arg if isinstance(arg, list) else [arg])
    return names


def test_id(item) -> str:
    """``test_slurm.py::test_header[...]``: the peer's file and test, wherever it is installed."""
    return f"{Path(str(item.fspath)).name}::{item.name}"


def pytest_ignore_collect(collection_path, config):
    """A whole module listed (its file name alone) tests a part of the peer hpcsched does
    not have on purpose: it is not imported, and the summary says why."""
    if any(pattern == collection_path.name for pattern, _ in patterns()):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        for pattern, reason in patterns():
            if fnmatch.fnmatchcase(test_id(item), pattern):
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
                item.user_properties.append(("difference", pattern))
                break


def pytest_runtest_setup(item):
    chosen = item.config.getoption("-E")
    names = _envs(item)
    if None not in names and ((chosen is None and names) or (chosen is not None
                                                             and chosen not in names)):
        pytest.skip(f"needs the batch system {names!r} (-E NAME)")
    known: dict = {}
    for mark in item.iter_markers(name="xfail_env"):
        known.update(mark.args[0])
    if chosen in known:
        item.add_marker(pytest.mark.xfail(reason=known[chosen]))


def _all_clusters() -> dict:
    module = sys.modules["dask_jobqueue"]
    names = {None: "LocalCluster", "pbs": "PBSCluster", "moab": "MoabCluster",
             "slurm": "SLURMCluster", "sge": "SGECluster", "lsf": "LSFCluster",
             "oar": "OARCluster", "htcondor": "HTCondorCluster"}
    local = getattr(sys.modules.get("dask_jobqueue.local"), "LocalCluster", None)
    return {env: (local if env is None else getattr(module, name, None))
            for env, name in names.items()}


def _chosen(cls, name):
    if cls is None:
        pytest.fail(f"hpcsched has no counterpart of dask-jobqueue's {name}")
    if name == "htcondor":  # as the peer's conftest: HTCondor jobs must say their disk
        import dask

        with dask.config.set({"jobqueue.htcondor.disk": "1GB"}):
            yield cls
    else:
        yield cls


_CLUSTERS = _all_clusters()


@pytest.fixture(params=[pytest.param(k, marks=[pytest.mark.env(k)]) for k in _CLUSTERS],
                ids=lambda k: str(k))
def EnvSpecificCluster(request):  # noqa: N802 - the peers' fixture name
    """The cluster class of the batch system chosen with ``-E``."""
    yield from _chosen(_CLUSTERS[request.param], request.param or "local cluster")


@pytest.fixture(params=list(_CLUSTERS), ids=lambda k: str(k))
def Cluster(request):  # noqa: N802 - the peers' fixture name
    """Each cluster class, for the tests that need no batch system."""
    yield from _chosen(_CLUSTERS[request.param], request.param or "local cluster")


@pytest.fixture
def cleanup():
    """dask-jobqueue's tests keep their configuration across distributed's ``loop``
    fixture, which would otherwise reset it (their conftest does the same)."""
    yield


@pytest.fixture
def mpirun():
    """dask-mpi's launcher: the mpiexec beside this interpreter, as root where needed."""
    exe = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which(
        "mpiexec", path=os.path.dirname(sys.executable)) or "mpirun"
    return [exe]


def pytest_terminal_summary(terminalreporter):
    terminalreporter.section(f"{len(DIFFERENCES)} deliberate differences from the peers "
                             "(tests/peers/differences.py)")
    for key, reason in DIFFERENCES.items():
        terminalreporter.write_line("  ".join(key))
        terminalreporter.write_line(f"    {reason}")
