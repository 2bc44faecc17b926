"""The garbage collector as the script and the tasks see it, once the ranks have started.

``python collector.py initialize`` sets MPI mode up with ``hpcsched.initialize()``; run
otherwise under ``python -m hpcsched``. ``... paused`` pauses the collector first, as a
program may: then it stays paused.
"""

import gc
import json
import sys

import hpcsched

if "paused" in sys.argv:
    gc.disable()
if "initialize" in sys.argv:
    hpcsched.initialize()

from hpcsched import Client  # noqa: E402


def collector():
    gc.collect()  # runs even while paused; whatever a pause left behind goes
    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}


with Client() as client:
    workers = list(client.run(collector).values())
print("COLLECTOR " + json.dumps({"rank0": collector(), "workers": workers}), flush=True)
