"""The ``Comm`` contract (tests/core/comm/conformance.py) over ``mpi://``, between two ranks.

One ``mpiexec -n 2`` run per launch mode (tests/hpc/scripts/comm_conformance.py) plays
every check, rank 0 the opener and rank 1 the acceptor; each check is then a test of
its own here, failing with the traceback of the rank that failed it. Two ranks share
this 2-core machine with whatever else runs: oversubscribed, as on a login node.
"""

from __future__ import annotations

import json

import pytest

from tests.core.comm.conformance import CHECKS, Check
from tests.hpc.mpirun import REPO, needs_mpiexec, run_mpi

pytestmark = [
    needs_mpiexec,
    pytest.mark.timeout(200),  # the first test of a mode waits for its whole run
]

SCRIPT = REPO / "tests" / "hpc" / "scripts" / "comm_conformance.py"
MODES = {
    "doorbells": {},
    # as on ranks spread over nodes: no doorbells, the progress threads poll
    "polling": {"HPCSCHED_MPI__DOORBELL": "false"},
}


@pytest.fixture(scope="module", params=list(MODES))
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``{rank: {check: None or traceback}}`` of one run in the mode of the parameter."""
    out_dir = tmp_path_factory.mktemp(f"comm-conformance-{request.param}")
    code, out = run_mpi(2, [str(SCRIPT), str(out_dir)], timeout=170, env=MODES[request.param])
    results = {}
    for rank in (0, 1):
        path = out_dir / f"rank-{rank}.json"
        results[rank] = json.loads(path.read_text()) if path.exists() else {}
    results["run"] = (code, out)
    return results


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_comm_contract(ranks: dict, check: Check) -> None:
    code, out = ranks["run"]
    name = check.__name__
    missing = [rank for rank in (0, 1) if name not in ranks[rank]]
    assert not missing, (f"rank(s) {missing} never reported {name} (mpiexec exited with "
                         f"{code}):\n{out[-5000:]}")
    failed = {rank: ranks[rank][name] for rank in (0, 1) if ranks[rank][name] is not None}
    assert not failed, "\n".join(f"--- rank {rank} ({'opener' if rank == 0 else 'acceptor'}):\n{tb}"
                                 for rank, tb in failed.items())


def test_the_run_ends_cleanly(ranks: dict) -> None:
    code, out = ranks["run"]
    assert code == 0, f"mpiexec exited with {code}:\n{out[-5000:]}"
    assert sum(f"of {len(CHECKS)} checks passed" in line for line in out.splitlines()) == 2, out


