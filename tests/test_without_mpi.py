"""A login node without MPI: ``pip install hpcsched`` brings neither mpi4py nor an MPI library.

Every path a user takes outside MPI mode (a ``Client``, a ``LocalCluster``, the batch
clusters' job scripts, the dashboard, ``progress``) works with mpi4py unimportable, and MPI
mode says at once what to install. Each test runs a fresh interpreter in which a
``sitecustomize`` on ``PYTHONPATH`` makes ``import mpi4py`` fail as it does where mpi4py is not
installed; the worker processes a ``LocalCluster`` starts inherit it. ``ci/check-wheel.sh``
checks the same in a virtual environment holding only the built wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# None in sys.modules is Python's own "not importable": `import mpi4py` raises ImportError and
# importlib.util.find_spec("mpi4py") returns None, as when it is not installed
BLOCKER = "import sys\nsys.modules['mpi4py'] = None\n"

# what a launcher (mpiexec, srun) puts in each rank's environment; not set on a login node
LAUNCHER_VARS = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                 "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "PMIX_SIZE", "PMIX_RANK",
                 "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID")


@pytest.fixture
def login_node_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a process on a login node where mpi4py cannot be imported."""
    blocker = tmp_path / "no-mpi4py"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(ROOT)])
    return env


def run(code: str, env: dict[str, str], cwd: Path, timeout: float = 120,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_the_blocker_hides_mpi4py(login_node_env, tmp_path):
    proc = run("""
        import importlib.util
        assert importlib.util.find_spec("mpi4py") is None
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            print("blocked")
    """, login_node_env, tmp_path)
    assert proc.stdout.strip() == "blocked", proc.stderr


@pytest.mark.timeout(180)
def test_login_node_paths_work_without_mpi4py(login_node_env, tmp_path):
    proc = run("""
        import sys, urllib.request
        from hpcsched import (Client, LSFCluster, LocalCluster, PBSCluster, SGECluster,
                              SLURMCluster, performance_report, progress)
        from hpcsched.diagnostics import server  # the dashboard

        with LocalCluster(n_workers=2, threads_per_worker=1,
                          dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
            futures = client.map(lambda x: x + 1, range(20))
            progress(futures)  # a text bar outside Jupyter
            assert client.gather(futures) == list(range(1, 21))
            with urllib.request.urlopen(client.dashboard_link, timeout=30) as page:
                assert page.status == 200
            with performance_report(filename="report.html"):
                assert client.submit(sum, [1, 2]).result() == 3
            pids = client.run(lambda: __import__("os").getpid())
            assert len(pids) == 2
            blocked = client.run(lambda: __import__("sys").modules.get("mpi4py", "absent"))
            assert set(blocked.values()) == {None}, blocked  # the workers inherit the blocker

        for cls in (SLURMCluster, SGECluster, PBSCluster, LSFCluster):
            with cls(cores=1, memory="1GB") as batch:
                assert "-m hpcsched worker" in batch.job_script(), cls

        assert sys.modules["mpi4py"] is None  # nothing loaded it behind the blocker's back
        print("ok")
    """, login_node_env, tmp_path, timeout=150)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr


def test_mpi_mode_without_mpi4py_says_what_to_install(login_node_env, tmp_path):
    script = tmp_path / "script.py"
    script.write_text("print('the script ran')\n")
    env = dict(login_node_env, PMI_SIZE="2", PMI_RANK="0")  # as mpiexec -n 2 starts rank 0
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hpcsched", str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 30  # at once: no waiting for ranks that cannot meet
    assert proc.returncode == 1
    assert "mpi4py is not installed" in proc.stderr
    assert "pip install 'hpcsched[mpi]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "the script ran" not in proc.stdout
