"""Under ``python -m hpcsched`` (mpiexec), rank 0 serves the dashboard and says once how to
reach it through an ssh tunnel."""

from __future__ import annotations

import re

import pytest

from tests.hpc.mpirun import run_mpi


@pytest.mark.timeout(180)
def test_rank_0_prints_the_link_once_and_serves_it():
    code, out = run_mpi(3, ["-m", "hpcsched", "tests/diagnostics/scripts/dashboard_under_mpi.py"],
                        timeout=150)
    assert code == 0, out[-5000:]
    assert out.count("hpcsched dashboard: http://") == 1, out[-5000:]
    (port,) = re.findall(r"hpcsched dashboard: http://[^:/]+:(\d+)/status\?token=\w+", out)
    assert re.search(rf"ssh -N -L {port}:\S+:{port} <login-node>", out), out[-5000:]
    assert f"http://localhost:{port}/status?token=" in out
    assert "DASHBOARD WORKERS ['1', '2'] FINISHED 50" in out, out[-5000:]
