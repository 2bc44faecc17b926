"""Run under ``mpiexec -n 3 python -m hpcsched``: rank 0's dashboard answers its link."""

import json
import urllib.request

from hpcsched import Client

with Client() as client:
    assert sum(client.gather(client.map(abs, range(-50, 0)))) == 1275
    link = client.dashboard_link
    base, _, query = link.partition("/status?")
    req = urllib.request.Request(base + "/api/status.json",
                                 headers={"Authorization": "Bearer " + query.split("=", 1)[1]})
    status = json.loads(urllib.request.urlopen(req, timeout=30).read())
    ranks = sorted(w["rank"] for w in status["workers"])
    print(f"DASHBOARD WORKERS {ranks} FINISHED {status['n_finished']}", flush=True)
