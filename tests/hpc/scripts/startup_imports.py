"""What rank 0 and the worker ranks have imported once the first task is done."""

import json

from hpcsched import Client
from tests.test_startup_imports import heavy_loaded

with Client() as client:
    assert client.submit(abs, -1).result() == 1
    rank0 = heavy_loaded()
    workers = sorted(client.run(heavy_loaded).values())
print("IMPORTS " + json.dumps({"rank0": rank0, "workers": workers}), flush=True)
