"""Prints what the scheduler knows of each worker rank, as JSON, for the test to check."""

import json

from hpcsched import Client

with Client() as client:
    workers = client.scheduler_info()["workers"]
    print("WORKERS " + json.dumps({a: {k: w.get(k) for k in ("host", "nthreads", "memory_limit",
                                                              "name")}
                                   for a, w in workers.items()}), flush=True)
