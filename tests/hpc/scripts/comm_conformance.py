"""``mpiexec -n 2 python comm_conformance.py OUT_DIR``: the ``Comm`` conformance checks
(tests/core/comm/conformance.py) over ``mpi://`` between ranks 0 and 1.

For each check rank 0 opens a channel to rank 1 and sends the check's name first; rank 1
takes the next channel its listener accepted from rank 0 and checks the name (a channel
left over from a check that failed on one rank is closed), so one failing check cannot
leak messages into the next. Each rank plays its end (rank 0 the opener, rank 1 the
acceptor) and writes ``OUT_DIR/rank-<r>.json`` after every check, ``{check: null}`` if
it passed, else the traceback: what was written survives a run killed at its timeout.
No blocking MPI collective is used (MPICH spins in them).
"""

import json
import queue
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: tests.*

from hpcsched.core.comm import registry  # noqa: E402
from hpcsched.hpc import mpi  # noqa: E402
from tests.core.comm.conformance import CHECKS, WAIT, End  # noqa: E402

out_dir = Path(sys.argv[1])
ep = mpi.init_endpoint(timeout=WAIT)
accepted: queue.SimpleQueue = queue.SimpleQueue()
listener = registry.listen("mpi://", accepted.put)
ACCEPTOR = 1
address = f"mpi://{ACCEPTOR}"


def channel(name: str):
    """This rank's end of a fresh channel for check ``name``."""
    if ep.rank != ACCEPTOR:
        comm = registry.connect(address, timeout=WAIT)
        comm.send(name)
        return comm
    deadline = time.monotonic() + WAIT
    while True:
        comm = accepted.get(timeout=max(0.0, deadline - time.monotonic()))
        if comm.recv(timeout=WAIT) == name:
            return comm
        comm.close()  # left over from a check that failed on the other rank


results: dict[str, str | None] = {}
try:
    if ep.rank <= ACCEPTOR:
        for check in CHECKS:
            comm = None
            try:
                comm = channel(check.__name__)
                check(comm, End(opener=ep.rank != ACCEPTOR, address=address))
                results[check.__name__] = None
            except BaseException:
                results[check.__name__] = traceback.format_exc()
            finally:
                if comm is not None:
                    comm.close()
            (out_dir / f"rank-{ep.rank}.json").write_text(json.dumps(results))
finally:
    listener.stop()
    mpi.shutdown_endpoint()
print(f"rank {ep.rank}: {sum(v is None for v in results.values())} of {len(results)} checks passed",
      flush=True)
