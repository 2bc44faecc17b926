"""UCX_MEM_EVENTS as rank 0 and the worker ranks see it."""

import json
import os

from hpcsched import Client


def ucx_mem_events():
    return os.environ.get("UCX_MEM_EVENTS")


with Client() as client:
    workers = sorted(client.run(ucx_mem_events).values(), key=str)
print("UCX " + json.dumps({"rank0": ucx_mem_events(), "workers": workers}), flush=True)
