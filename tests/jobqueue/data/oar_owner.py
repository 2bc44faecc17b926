"""Run as an OAR user by tests/jobqueue/test_oar_real.py: an OARCluster on the real OAR of
ci/batch/start-oar.sh makes a round trip and adapts, each call road in turn (argv[1]:
"bulk", a map above the bulk threshold, or "tasks", one submit per call). Prints the
ids of the jobs it submitted on a line "JOBS ..." before anything can fail, and "OK"."""

import json
import os
import subprocess
import sys
import time

from hpcsched import Client, OARCluster
from hpcsched.core import config


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.3)


def unfinished(ids):
    args = [a for i in sorted(ids) for a in ("-j", i)]
    out = subprocess.run(["oarstat", "-J", *args], capture_output=True, text=True, timeout=30)
    return {
        j
        for j, info in json.loads(out.stdout or "{}").items()
        if info["state"] not in ("Terminated", "Error")
    }


def job_ids_of_workers(c):
    return {
        ws.name: (ws.metrics or {}).get("job_id") for ws in list(c.scheduler.state.workers.values())
    }


road = sys.argv[1]
calls = (
    (lambda client, fn, n: client.map(fn, range(n), pure=False))
    if road == "bulk"
    else (lambda client, fn, n: [client.submit(fn, i, pure=False) for i in range(n)])
)
with config.set(
    {
        "jobqueue.poll-interval": 0.5,
        "adaptive.interval": 0.3,
        "adaptive.wait-count": 2,
        "adaptive.target-duration": 1.0,
    }
):
    with OARCluster(
        cores=1,
        memory="500MB",
        walltime="00:05:00",
        memory_per_core_property_name="memcore",
        log_directory=os.path.expanduser("~/hpcsched-oar-logs"),
        job_script_prologue=[f"export PYTHONPATH={os.environ['PYTHONPATH']}"],
    ) as c:
        c.scale(jobs=2)
        first = set(c.jobs)
        print("JOBS", *first, flush=True)
        c.wait_for_workers(2, timeout=180)
        with Client(c) as client:
            assert sum(client.gather(calls(client, lambda x: x * 2, 40))) == 2 * sum(range(40))
        # each worker read its job id from the environment OAR gave its job
        wait_for(lambda: all(job_ids_of_workers(c).values()), 30, "heartbeats with job ids")
        assert job_ids_of_workers(c) == {j.name: j.job_id for j in c.jobs.values()}
        c.scale(0)
        wait_for(lambda: not unfinished(first), 90, "OAR to end the jobs")
        wait_for(lambda: not c.workers, 30, "the workers to leave")

        adaptive = c.adapt(minimum=0, maximum=2)
        with Client(c) as client:
            futures = calls(client, lambda x: (time.sleep(0.3), x)[1], 40)
            wait_for(lambda: len(c.jobs) == 4, 120, "adapt to submit two jobs")
            print("JOBS", *c.jobs, flush=True)
            assert sum(client.gather(futures)) == sum(range(40))
        wait_for(
            lambda: not any(j.active for j in c.jobs.values()),
            150,
            "adapt to retire the idle jobs down to zero",
        )
        adaptive.stop()
        wait_for(lambda: not unfinished(set(c.jobs)), 90, "OAR to end the adaptive jobs")
        assert not c.failed_jobs, c.failed_jobs
print("OK", flush=True)
