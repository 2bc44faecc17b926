"""Cluster control (run, run_on_scheduler, who_has, has_what, nthreads, upload_file):
tests/conformance/cluster_control.py over TCP and under ``mpiexec -n 4``."""

from __future__ import annotations

import os

import pytest

from hpcsched import Client, LocalCluster
from tests.conformance import cluster_control
from tests.hpc.mpi_scripts import REPO_ON_PATH, run, script
from tests.hpc.mpirun import needs_mpiexec


@pytest.mark.timeout(180)
def test_over_tcp(tmp_path):
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        def add_worker() -> bool:
            cluster.scale(3)
            client.wait_for_workers(3, timeout=60)
            return True

        cluster_control.check(client, str(tmp_path), add_worker, supervisor_pid=os.getpid())


@needs_mpiexec
@pytest.mark.timeout(180)
def test_under_mpiexec(tmp_path):
    r = run([script("conformance.py"), "cluster_control", str(tmp_path)], timeout=150, env=REPO_ON_PATH)
    assert r.code == 0, r
    assert "cluster_control conformance ok" in r.out, r
