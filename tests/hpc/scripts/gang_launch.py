"""Tasks with ``ranks=N`` that start an MPI program on their own slots: the first member
runs ``HPCSCHED_MPI_PREFIX`` + the program (argv[1]) and returns its output, with the
host file's lines and the prefix; the others return None. argv: program, N, ranks per
node (0: packed), number of such tasks."""

import json
import os
import shlex
import subprocess
import sys

from hpcsched import Client

PROGRAM, N, PER_NODE, TASKS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])


def launch(i):
    if os.environ["HPCSCHED_GANG_MEMBER"] != "0":
        return None
    with open(os.environ["HPCSCHED_HOSTFILE"]) as f:
        hosts = f.read().split()
    prefix = os.environ["HPCSCHED_MPI_PREFIX"]
    r = subprocess.run(shlex.split(prefix) + [PROGRAM], capture_output=True, text=True, timeout=120)
    return {
        "i": i,
        "code": r.returncode,
        "out": r.stdout,
        "err": r.stderr[-2000:],
        "hosts": hosts,
        "prefix": prefix,
        "nranks": os.environ["HPCSCHED_NRANKS"],
    }


with Client() as client:
    futures = client.map(launch, range(TASKS), ranks=N, ranks_per_node=PER_NODE or None, pure=False)
    results = client.gather(futures, timeout=300)
    print("LAUNCHED " + json.dumps(results), flush=True)
