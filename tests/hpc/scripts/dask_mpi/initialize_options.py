"""Every dask-mpi initialize parameter, as a dask-mpi script passes them.

``mpiexec -n 3 python initialize_options.py DIR``: the meaningful ones are
applied to the workers; protocol, scheduler_port and nanny are logged once as
ignored, with why.
"""

import os
import sys

from hpcsched import Client, initialize

directory = sys.argv[1]
initialize(interface="lo", nthreads=1, local_directory=directory, memory_limit="1GB",
           nanny=True, dashboard=True, dashboard_address=":0", protocol="tcp",
           worker_class="distributed.Worker", worker_options={"resources": {"GPU": 1}},
           scheduler_port=0)

with Client() as c:
    info = c.scheduler_info()
    workers = info["workers"]
    assert len(workers) == 2, workers
    for w in workers.values():
        assert w["nthreads"] == 1, w
        assert w["memory_limit"] == 10**9, w
        assert w["resources"] == {"GPU": 1}, w
    # the dashboard listens on the interface's address
    assert info["services"]["dashboard"].startswith("http://127.0.0.1:"), info["services"]
    for rank in (1, 2):
        assert os.path.isdir(os.path.join(directory, f"hpcsched-worker-{rank}"))
    assert c.submit(lambda: 1, resources={"GPU": 1}).result(timeout=30) == 1
print("options ok", flush=True)
