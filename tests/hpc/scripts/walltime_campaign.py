"""A campaign of checkpointed tasks longer than its job, for ``python -m hpcsched --journal J``.

Arguments: DIRECTORY N SECONDS ROAD [PIDFILE]. N tasks of SECONDS each, annotated
checkpoint=True, sent as one map (ROAD ``bulk``) or one by one (``tasks``); each task,
once its work is done, appends a byte to DIRECTORY/<i>, so a test can tell which ran to
the end and how often. Rank 0 writes its pid to PIDFILE (for a test to signal it).
"""

import os
import sys
import time

import dask

from hpcsched import Client

directory, n, seconds, road = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if len(sys.argv) > 5:
    with open(sys.argv[5], "w") as f:
        f.write(str(os.getpid()))


def step(i: int, directory: str, seconds: float) -> int:
    time.sleep(seconds)
    fd = os.open(os.path.join(directory, str(i)), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
    return 2 * i


with Client() as client, dask.annotate(checkpoint=True):
    if road == "bulk":
        futures = client.map(step, range(n), directory=directory, seconds=seconds)
    else:
        futures = [client.submit(step, i, directory, seconds) for i in range(n)]
    results = client.gather(futures)
assert results == [2 * i for i in range(n)], results
print(f"RESULT {sum(results)}", flush=True)
