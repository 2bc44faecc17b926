"""Starting a cluster imports only what its first task needs.

Each test runs a fresh interpreter and reads its ``sys.modules`` (and, through
``Client.run``, the workers'): dask, pandas, numpy, the YAML parser, the
dashboard's modules and the batch systems are imported when a program uses
them, not to start a scheduler, a worker or a client. A program that imports
dask itself still gets futures dask understands and hpcsched as dask's
scheduler; one that imports joblib, before or after hpcsched, finds the
"hpcsched" backend registered.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter from the repository; the JSON it prints last."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_client_and_local_cluster_start_without_heavy_modules():
    got = run_python(
        "import json, sys\n"
        "from tests.heavy_imports import heavy_loaded\n"
        "from hpcsched import Client, LocalCluster\n"
        "with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster, "
        "Client(cluster) as client:\n"
        "    assert client.submit(abs, -1).result() == 1\n"
        "    workers = client.run(heavy_loaded)\n"
        "    print(json.dumps({'client': heavy_loaded(), 'workers': list(workers.values())}))\n")
    assert got == {"client": [], "workers": [[]]}


def test_dask_imported_after_the_client_sees_futures_and_the_scheduler():
    got = run_python(
        "import json, sys\n"
        "from hpcsched import Client\n"
        "with Client(n_workers=1, threads_per_worker=1, processes=False,\n"
        "            dashboard_address=None) as client:\n"
        "    fut = client.submit(abs, -2)\n"
        "    loaded = 'dask' in sys.modules\n"
        "    import dask, dask.config\n"
        "    from dask._task_spec import TaskRef\n"
        "    total = dask.delayed(sum)([fut, 3]).compute()\n"
        "    print(json.dumps({'loaded': loaded, 'taskref': isinstance(fut, TaskRef),\n"
        "                      'ours': 'hpcsched' in repr(dask.config.get('scheduler')),\n"
        "                      'total': total}))\n")
    assert got == {"loaded": False, "taskref": True, "ours": True, "total": 5}


def test_joblib_finds_the_backend_whichever_is_imported_first():
    got = run_python(
        "import json, sys\n"
        "import hpcsched\n"
        "loaded = 'joblib' in sys.modules\n"
        "from joblib.parallel import BACKENDS\n"
        "print(json.dumps({'loaded': loaded, 'ours': 'hpcsched' in BACKENDS}))\n")
    assert got == {"loaded": False, "ours": True}
    got = run_python(
        "import json\n"
        "from joblib.parallel import BACKENDS\n"
        "known = 'hpcsched' in BACKENDS\n"
        "import hpcsched\n"
        "print(json.dumps({'known': known, 'ours': 'hpcsched' in BACKENDS}))\n")
    assert got == {"known": False, "ours": True}


def test_the_dashboard_server_is_imported_when_a_browser_first_connects():
    got = run_python(
        "import json, sys, urllib.request\n"
        "from hpcsched import Client, LocalCluster\n"
        "with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,\n"
        "                  dashboard_address='127.0.0.1:0') as cluster, Client(cluster) as c:\n"
        "    assert c.submit(abs, -1).result() == 1\n"
        "    before = 'hpcsched.diagnostics.server' in sys.modules\n"
        "    with urllib.request.urlopen(c.dashboard_link, timeout=30) as page:\n"
        "        status = page.status\n"
        "    after = 'hpcsched.diagnostics.server' in sys.modules\n"
        "print(json.dumps({'before': before, 'status': status, 'after': after}))\n")
    assert got == {"before": False, "status": 200, "after": True}
