"""A script that sets the cluster up itself: `mpiexec -n 4 python uses_initialize.py [code]`.

Only rank 0 gets past initialize(); the body below must never run on a worker.
"""

import os
import socket
import sys

import hpcsched

hpcsched.initialize()

print(f"body runs on PMI_RANK={os.environ.get('PMI_RANK')}", flush=True)
from hpcsched import Client  # noqa: E402

with Client() as client:
    info = client.scheduler_info()["workers"]
    assert len(info) == 3, info
    assert all(w["host"] == socket.gethostname() for w in info.values()), info
    assert client.submit(pow, 2, 10).result(timeout=30) == 1024
print("initialize ok", flush=True)
if len(sys.argv) > 1:
    sys.exit(int(sys.argv[1]))
