"""``mpiexec -n 4 python -m hpcsched conformance.py GROUP TMP_DIR``: a conformance group
(tests/conformance/GROUP.py) run against the MPI cluster of this job."""

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: tests.*

from hpcsched import Client  # noqa: E402

group, tmp_dir = sys.argv[1], sys.argv[2]
checks = importlib.import_module(f"tests.conformance.{group}")
with Client() as client:
    checks.check(client, tmp_dir, lambda: False)  # ranks are fixed: no worker joins later
print(f"{group} conformance ok", flush=True)
