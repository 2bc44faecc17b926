"""A long wait_for_workers on a batch cluster says what its jobs are doing."""

from __future__ import annotations

import pytest

from hpcsched.jobqueue import cluster as cluster_mod


@pytest.mark.parametrize("batch", ["pbs"], indirect=True)
@pytest.mark.timeout(90)
def test_waiting_for_workers_reports_pending_jobs(batch, monkeypatch, capsys):
    monkeypatch.setenv("HPCSCHED_EMU_HOLD", "1")  # the queue keeps every job pending
    monkeypatch.setattr(cluster_mod, "WAIT_REPORT_EVERY", 0.5)
    c = batch.cluster()
    c.scale(jobs=1)
    batch.record(c)
    with pytest.raises(TimeoutError):
        c.wait_for_workers(1, timeout=3)
    err = capsys.readouterr().err
    assert "waiting for workers: 0 of 1 connected; jobs: 1 pending" in err
