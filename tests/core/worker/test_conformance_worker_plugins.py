"""A worker plugin's transition hook: tests/conformance/worker_plugins.py over TCP and
under ``mpiexec -n 4``."""

from __future__ import annotations

import pytest

from hpcsched import Client, LocalCluster
from tests.conformance import worker_plugins
from tests.hpc.mpi_scripts import REPO_ON_PATH, run, script
from tests.hpc.mpirun import needs_mpiexec


@pytest.mark.timeout(300)
def test_over_tcp(tmp_path):
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        worker_plugins.check(client, str(tmp_path), lambda: False)


@needs_mpiexec
@pytest.mark.timeout(300)
def test_under_mpiexec(tmp_path):
    r = run([script("conformance.py"), "worker_plugins", str(tmp_path)], timeout=240,
            env=REPO_ON_PATH)
    assert r.code == 0, r
    assert "worker_plugins conformance ok" in r.out, r
