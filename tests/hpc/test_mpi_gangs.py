"""Tasks that hold many ranks (``ranks=N``) under a real ``mpiexec``: each member runs
the task, ``get_task_comm()`` is their communicator, the first one's value is the
result; a member that raises fails the task and the job still ends with the script's
exit code. Each worker rank has one thread (``--nthreads 1``), so a rank's one slot is
in at most one gang at a time.
"""

from __future__ import annotations

import json
import re
from itertools import combinations

import pytest

from tests.hpc.mpi_scripts import REPO_ON_PATH, run, script
from tests.hpc.mpirun import needs_mpiexec

RANKS = 9  # rank 0: the scheduler and the script; 8 workers: two gangs of 4 at once


def printed(tag: str, out: str) -> dict:
    m = re.search(rf"^{tag} (.*)$", out, re.M)
    assert m, out[-3000:]
    return json.loads(m.group(1))


@needs_mpiexec
@pytest.mark.timeout(120)
def test_gangs_of_four_beside_ordinary_tasks_compute_right_and_share_no_rank():
    gangs, plain = 20, 200
    r = run(["--nthreads", "1", script("gangs.py"), str(gangs), str(plain)], nprocs=RANKS,
            env=REPO_ON_PATH, timeout=90)
    assert r.code == 0, r
    got = printed("GANGS", r.out)
    per = plain // gangs
    assert got["plain"] == [plain, sum(x + 1 for i in range(gangs)
                                       for x in range(i * 10, i * 10 + per))]
    spans = []  # (world rank, start, stop, gang)
    for i, res in enumerate(got["results"]):
        members = res["ranks"]
        assert res["size"] == 4 and res["sum"] == 4 * i, res
        assert len(set(members)) == 4 and 0 not in members, res
        assert res["world"] == sum(members), res
        # the communicator's ranks are the members in order, each a distinct worker rank
        assert [s[0] for s in res["spans"]] == members
        assert [s[1] for s in res["spans"]] == [0, 1, 2, 3]
        spans += [(rank, start, stop, i) for rank, _, start, stop in res["spans"]]
    for (r1, s1, e1, g1), (r2, s2, e2, g2) in combinations(spans, 2):
        if r1 == r2 and g1 != g2:
            assert e1 <= s2 or e2 <= s1, f"rank {r1} in gangs {g1} and {g2} at once"
    # two gangs ran at once (on disjoint ranks, by the check above)
    window = {i: (min(s for _, s, _, g in spans if g == i), max(e for _, _, e, g in spans
                                                                 if g == i))
              for i in range(gangs)}
    assert any(a[0] < b[1] and b[0] < a[1] for a, b in combinations(window.values(), 2)), \
        window


@needs_mpiexec
@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", ["in-collective", "before-comm"])
def test_a_rank_that_raises_fails_the_gang_and_the_job_still_ends_with_the_scripts_code(when):
    # the three other members stay blocked in the collective (or in Create_group); the
    # script goes on, a gang on the ranks left runs, and its end ends every rank (exit 0:
    # the script caught it)
    r = run(["--nthreads", "1", script("gang_raises.py"), when], nprocs=RANKS,
            env=REPO_ON_PATH, timeout=60)
    assert r.code == 0, r
    caught = printed("CAUGHT", r.out)
    assert caught["error"].startswith("rank 1 of the gang failed on purpose"), caught
    assert caught["seconds"] < 10, caught
    # the raising rank's own traceback (the script's functions travel as their source)
    assert "in doomed" in caught["traceback"] \
        and "ZeroDivisionError" in caught["traceback"], caught
    assert printed("LATER", r.out) == {"later": [4, 8], "plain": 55}
    assert "still blocked in a failed gang's MPI call" in r.err, r


@needs_mpiexec
@pytest.mark.timeout(120)
@pytest.mark.parametrize("doorbells", ["on", "off"])
def test_while_a_gang_computes_the_other_threads_of_its_ranks_stay_asleep(doorbells):
    # each wake-up of a rank's progress thread or loop takes Python's lock from the
    # member, and the slowest member sets the gang's pace: they poll and sample seldom.
    # Without doorbells no peer rings (as on ranks spread over several nodes)
    env = {**REPO_ON_PATH, "HPCSCHED_MPI__DOORBELL": "true" if doorbells == "on" else "false"}
    r = run(["--nthreads", "1", script("gang_quiet.py")], nprocs=3, env=env, timeout=90)
    assert r.code == 0, r
    got = printed("WAKES", r.out)
    assert len(got["gang"]) == 2, got
    for rates in got["gang"]:
        assert set(rates) == {"mpi", "worker"}, got
        # a fallback poll a second, a memory sample a second, a beat and a heartbeat or
        # two, each maybe twice for Python's lock; an ordinary task's rank polls and
        # samples every 0.05 and 0.1 s
        assert rates["mpi"] < 12 and rates["worker"] < 12, got
    assert got["plain"][0]["worker"] > 2 * max(r["worker"] for r in got["gang"]), got
    if doorbells == "on":
        # rank 0, idle meanwhile and rung by every peer that sends, polls once a second
        # once idle for one (20 times at mpi.poll-max): its wake-ups are the gang's messages
        assert got["rank0"]["mpi"] < 12, got
