"""N tasks annotated checkpoint=True, for ``python -m hpcsched --journal J``.

Arguments: DIRECTORY N STOP_AFTER. Each task counts its runs in DIRECTORY (see
``tests.launchers.counting.counted``). With STOP_AFTER > 0 the script ends with an
error once that many tasks are done, as a job whose walltime ran out; else it checks
and prints every result.
"""

import sys

import dask

from hpcsched import Client, as_completed
from tests.launchers.counting import counted

directory, n, stop_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = Client()
with dask.annotate(checkpoint=True):
    futures = client.map(counted, range(n), directory=directory)
if stop_after:
    for done, _ in enumerate(as_completed(futures), 1):
        if done >= stop_after:
            sys.exit(f"stopping after {done} tasks, as a job whose walltime ran out")
results = client.gather(futures)
assert results == [2 * i for i in range(n)], results
print(f"RESULT {sum(results)}", flush=True)
