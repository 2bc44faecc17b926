"""A campaign longer than its jobs, through a busy queue, on the real SLURM of this machine.

Every job must wait 30 s before it may start (``--begin=now+30``; SLURM's scheduler makes
it more), and lives a minute (``walltime="00:01:00"``: its workers retire after about 45
s). 1,200 calls of 0.25 s kept at 2 jobs take several jobs' lives: the cluster submits
each job's replacement ahead of its end, by the queue's measured wait
(hpcsched/jobqueue/succession.py), so the work never stops for want of workers and
the retiring workers hand their results to those that stay.

Checked: every result right, no call lost (no ``KilledWorker``), at most 5 % of the calls
run twice (each run leaves a file), the work at 80 % of the ideal time or better (ideal:
the calls' time over the threads of 2 jobs, from the moment the first 2 jobs' workers are
there, since the first wait in the queue is no replacement's doing), and none of the
test's jobs left after ``close()``. Both targets that hold a number of jobs: ``scale()``
and ``adapt(minimum=2, maximum=2)``; both roads (a bulk map, tasks one by one).
Each case takes 2 to 3 minutes.
"""

from __future__ import annotations

import collections
import os
import time
import uuid

import pytest

from hpcsched.core.client.client import Client
from tests.conftest import Road

CALLS, SECONDS, JOBS, THREADS = 1200, 0.25, 2, 2


def work(i: int, runs: str) -> int:
    time.sleep(SECONDS)
    with open(os.path.join(runs, f"{i}.{uuid.uuid4().hex}"), "w"):
        pass
    return i * i


@pytest.mark.timeout(600)
@pytest.mark.parametrize("batch,target,road", [
    pytest.param("slurm", "scale", Road("bulk"), marks=pytest.mark.slurm),
    pytest.param("slurm", "adapt", Road("tasks"), marks=pytest.mark.slurm),
], indirect=["batch"])
def test_a_fixed_target_keeps_its_workers_through_a_busy_queue(batch, target, road, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    # 8 CPUs and 8000 MB on the node: 4 such jobs at once, 2 running and 2 taking over
    c = batch.cluster(cores=THREADS, processes=1, memory="1900MB", walltime="00:01:00",
                      job_extra_directives=["--begin=now+30"])
    if target == "scale":
        c.scale(jobs=JOBS)
    else:
        c.adapt(minimum=JOBS, maximum=JOBS)
    with Client(c) as client:
        c.wait_for_workers(JOBS, timeout=300)
        start = time.monotonic()
        futures = road.calls(client, work, CALLS, runs=str(runs))
        results = client.gather(futures, timeout=400)
        elapsed = time.monotonic() - start
    batch.record(c)
    jobs = len(c.jobs)
    c.close()
    assert results == [i * i for i in range(CALLS)]
    counts = collections.Counter(int(p.name.split(".")[0]) for p in runs.iterdir())
    assert set(counts) == set(range(CALLS))
    twice = sum(n - 1 for n in counts.values())
    ideal = CALLS * SECONDS / (JOBS * THREADS)
    print(f"{target}/{road.name}: {elapsed:.1f} s for an ideal {ideal:.0f} s "
          f"({ideal / elapsed:.0%}), {jobs} jobs, {twice} calls run twice")
    assert twice <= 0.05 * CALLS, f"{twice} calls of {CALLS} ran twice"
    assert ideal / elapsed >= 0.8, f"{elapsed:.1f} s, {ideal / elapsed:.0%} of the ideal {ideal:.0f} s"
    assert not c.failed_jobs and jobs > 2 * JOBS  # several generations of jobs served
    batch.assert_queue_empty()
