"""One worker per GPU under mpiexec (``python -m hpcsched --worker-per-gpu``): each worker
rank advertises one GPU and its process sees that device alone; prints what the test
checks (each worker's GPU count, and what a one-GPU task on it sees)."""

import json
import os

import hpcsched
from hpcsched import Client


def what_i_see(_):
    return {"process": os.environ.get("CUDA_VISIBLE_DEVICES"), "ids": hpcsched.get_task_gpus(),
            "child": hpcsched.task_env().get("CUDA_VISIBLE_DEVICES"),
            "ordinal": hpcsched.get_worker().gpus.ordinal(hpcsched.get_task_gpus()[0])}


with Client() as client:
    workers = client.scheduler_info()["workers"]
    resources = sorted(w["resources"].get("GPU", 0) for w in workers.values())
    seen = [client.submit(what_i_see, a, resources={"GPU": 1}, workers=[a],
                          pure=False).result(timeout=60) for a in workers]
print("GPUS " + json.dumps({"resources": resources, "seen": seen}), flush=True)
