"""A gang's rank 1 raises while the others wait for it in a collective that never ends.

The future raises with that rank's traceback; the script catches it, runs a gang of 4
on the ranks left (and ordinary tasks), and ends: the job must exit 0 although three
ranks are still blocked in the failed gang's collective. That collective is a buffer
one (``Allreduce``), which waits with Python's lock released; mpi4py's pickle-based
ones (``allreduce``) hold it while they wait, and a rank blocked in one stays silent.
"""

import json
import sys
import time
from array import array

import hpcsched
from hpcsched import Client
from hpcsched.core.worker.context import current

BEFORE_COMM = sys.argv[1:] == ["before-comm"]  # rank 1 raises before get_task_comm()


def doomed(x):
    if BEFORE_COMM and hpcsched.get_worker().address == current().gang[1]:
        # the others then wait in Create_group for it
        raise ZeroDivisionError(f"rank 1 of the gang failed on purpose ({x})")
    comm = hpcsched.get_task_comm()
    if comm.Get_rank() == 1:
        raise ZeroDivisionError(f"rank 1 of the gang failed on purpose ({x})")
    total = array("d", [0.0])
    comm.Allreduce(array("d", [x]), total)  # the others wait here for rank 1, forever
    return total[0]


def fine(x):
    comm = hpcsched.get_task_comm()
    return comm.Get_size(), comm.allreduce(x)


with Client() as client:
    t0 = time.time()
    fut = client.submit(doomed, 1, ranks=4)
    try:
        fut.result(timeout=30)
    except ZeroDivisionError as e:
        took = time.time() - t0
        print("CAUGHT " + json.dumps({"error": str(e), "seconds": took,
                                      "traceback": fut.traceback()}), flush=True)
    else:
        raise AssertionError("the gang should have failed")
    later = client.gather(client.submit(fine, 2, ranks=4), timeout=30)
    plain = sum(client.gather(client.map(abs, range(-10, 0)), timeout=30))
    print("LATER " + json.dumps({"later": later, "plain": plain}), flush=True)
