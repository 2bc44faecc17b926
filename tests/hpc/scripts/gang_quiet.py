"""A gang of 2 computes for a while; each member counts how often the other threads of
its worker rank woke meanwhile (their voluntary context switches, from ``/proc``), and
an ordinary task on a worker rank does the same, and rank 0 counts its own progress
thread's wake-ups meanwhile. Prints what the test checks.
"""

import json
import threading
import time

import hpcsched
from hpcsched import Client

SECONDS = 3.0


def switches() -> dict:
    """The voluntary context switches of this process's MPI progress and loop threads."""
    out = {}
    for t in threading.enumerate():
        if t.name.startswith(("hpcsched-mpi-progress", "hpcsched-worker")):
            with open(f"/proc/self/task/{t.native_id}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        out[t.name.split("-")[1]] = int(line.split()[1])
    return out


def compute(gang: bool) -> dict:
    comm = hpcsched.get_task_comm() if gang else None
    before, t0 = switches(), time.monotonic()
    s = 0.0
    while time.monotonic() - t0 < SECONDS:  # pure Python: holds the lock but for switches
        for i in range(10_000):
            s += i * 0.5
    after, took = switches(), time.monotonic() - t0
    rates = {name: (after[name] - before[name]) / took for name in after}
    if comm is not None:
        return comm.gather(rates)
    return [rates]


with Client() as client:
    client.submit(compute, False, pure=False).result(timeout=30)  # warm-up
    plain = client.submit(compute, False, pure=False).result(timeout=60)
    # rank 0 (the scheduler, idle but for the gang's few messages) meanwhile, from its
    # second idle second on (its first polls as often as a reply may come)
    running = client.submit(compute, True, ranks=2, pure=False)
    time.sleep(1.2)  # the start of the measured interval, inside the gang's SECONDS
    before, t0 = switches(), time.monotonic()
    gang = running.result(timeout=60)
    after, took = switches(), time.monotonic() - t0
    idle = {name: (after[name] - before[name]) / took for name in after}
    print("WAKES " + json.dumps({"plain": plain, "gang": gang, "rank0": idle}), flush=True)
