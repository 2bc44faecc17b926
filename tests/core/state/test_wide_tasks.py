"""A task that holds many worker slots (``ranks=N``: one slot on each of N workers), told
as stories in the simulated cluster (:mod:`tests.core.state.sim`): it gathers its slots,
runs, and gives them back on finish, failure, the loss of a member and cancellation;
narrow tasks never starve it; two wide tasks never deadlock; the scheduler's
``validate()`` runs after every event.
"""

from __future__ import annotations

import doctest

import pytest

from hpcsched.core.state import events as ev
from hpcsched.core.state import placement
from hpcsched.core.state.model import KilledWorker
from tests.core.state.sim import SimCluster, address


def gang(sim: SimCluster, key: str, ranks: int, deps: list[str] | None = None) -> None:
    sim.submit({key: deps or []}, [key], annotations={"ranks": {key: ranks}})
    sim.settle()


def lease(sim: SimCluster, key: str) -> list[str]:
    """The names of the workers whose slots ``key`` holds, the first running it."""
    return [ws.address.removeprefix("sim://") for ws in sim.s.graph.leases.get(
        sim.s.tasks[key], ())]


def holding(sim: SimCluster, name: str) -> list[str]:
    """The keys of the tasks counted on worker ``name``'s slots."""
    return sorted(ts.key for ts in sim.s.workers[address(name)].processing)


def test_a_task_holding_three_slots_reserves_runs_and_releases_them():
    """Three one-thread workers, each busy with a narrow task. The wide task waits,
    keeps each worker that frees for itself (no later narrow task starts there), runs on
    all three once it has them (the first worker runs it, all three count it), and gives
    the three slots back when it finishes: the narrow tasks held back behind it run."""
    sim = SimCluster(seed=1)
    for name in "abc":
        sim.add_worker(name, 1)
    sim.submit({"x": [], "y": [], "z": []}, ["x", "y", "z"])
    sim.settle()
    assert sorted(k for n in "abc" for k in sim.running(n)) == ["x", "y", "z"]
    gang(sim, "g", 3)
    assert sim.state("g") == "no-worker"
    sim.finish(sim.running("a")[0])
    assert sim.s.workers[address("a")].reserved is sim.s.tasks["g"]
    sim.submit({"later": []}, ["later"])  # worse priority than g: held back, not on a
    sim.settle()
    assert sim.state("later") == "no-worker" and sim.running("a") == []
    sim.finish(sim.running("b")[0])
    assert sim.state("g") == "no-worker" and sim.running("b") == []
    sim.finish(sim.running("c")[0])
    assert sim.state("g") == "processing"
    members = lease(sim, "g")
    assert sorted(members) == ["a", "b", "c"]
    assert all(sim.running(n) == ["g"] for n in "abc")  # every member runs it
    assert all("g" in holding(sim, n) for n in "abc")  # every member's slot is held
    assert not any("later" in sim.running(n) for n in "abc")  # no thread for it yet
    for other in members[1:]:  # their parts end first: the task waits for its first
        sim.finish("g", other, value="dropped")
        assert sim.state("g") == "processing"
    sim.finish("g")
    assert not any(address(n) in (w.address for w in sim.s.tasks["g"].who_has)
                   for n in members[1:])  # only the first member's value is the result
    assert sim.state("g") == "memory" and not sim.s.graph.leases
    assert sim.state("later") == "processing"
    sim.finish("later")
    assert [r.key for r in sim.told("key-in-memory")][-2:] == ["g", "later"]


def test_a_wide_task_packs_on_the_fewest_hosts():
    """Of five free workers on two hosts, a two-slot task takes two of the same host."""
    sim = SimCluster(seed=2)
    for name, host in zip("abcde", ["h1", "h2", "h2", "h1", "h2"], strict=True):
        sim.add_worker(name, 1, host=host)
    gang(sim, "g", 3)
    assert sorted(lease(sim, "g")) == ["b", "c", "e"]


def test_a_member_lost_releases_every_slot_and_the_task_runs_again():
    """A member of a running wide task dies: its first worker is told to drop the task,
    the other slots are free, and the task gathers anew among the survivors, charged with
    the death as any task that ran on a worker that died."""
    sim = SimCluster(seed=3)
    for name in "abcd":
        sim.add_worker(name, 1)
    gang(sim, "g", 3)
    members = lease(sim, "g")
    root = members[0]
    sim.started("g")  # every member runs it from now on
    lost = members[1]
    sim.remove_worker(lost)
    sim.settle()
    ts = sim.s.tasks["g"]
    assert ts.suspicious == 1 and ts.erred_on == (address(lost),)
    assert sim.state("g") == "processing"
    again = lease(sim, "g")
    assert lost not in again and len(again) == 3
    # the old first worker was told to drop it (it is not running it any more) unless
    # it runs it again
    if again[0] != root:
        assert sim.running(root) == []


def test_a_wide_task_on_workers_that_die_errs_with_killed_worker():
    sim = SimCluster(seed=4, scheduler_kw={"allowed_failures": 1})
    for name in "abc":
        sim.add_worker(name, 1)
    gang(sim, "g", 2)
    root = lease(sim, "g")[0]
    sim.started("g")
    sim.remove_worker(root)
    sim.settle()
    assert sim.state("g") == "erred"
    assert isinstance(sim.s.tasks["g"].exception, KilledWorker)
    assert all(not holding(sim, n) for n in sim.workers)


def test_cancelled_while_waiting_for_its_slots_it_keeps_none():
    """A wide task that gathers two of its three slots is cancelled: the two workers it
    kept take work again, and the narrow task held back behind it runs."""
    sim = SimCluster(seed=5)
    for name in "abc":
        sim.add_worker(name, 1)
    sim.submit({"x": [], "y": [], "z": []}, ["x", "y", "z"])
    sim.settle()
    gang(sim, "g", 3)
    sim.finish(sim.running("a")[0])
    sim.finish(sim.running("b")[0])
    assert len(sim.s.placement.reserved) == 2
    sim.submit({"later": []}, ["later"])
    sim.settle()
    assert sim.state("later") == "no-worker"
    sim.cancel(["g"])
    sim.settle()
    assert sim.state("g") == "forgotten" and not sim.s.placement.reserved
    assert sim.state("later") == "processing"
    assert all(ws.reserved is None for ws in sim.s.workers.values())


def test_two_wide_tasks_never_each_hold_part_of_what_they_need():
    """Four workers, two wide tasks of three: the first (best priority) gathers and runs;
    the second waits without keeping any worker, then runs on the slots given back.
    Neither ever holds slots while the other holds the rest."""
    sim = SimCluster(seed=6)
    for name in "abcd":
        sim.add_worker(name, 1)
    sim.submit({"w": []}, ["w"])
    sim.settle()
    gang(sim, "g1", 3)
    gang(sim, "g2", 3)
    assert sim.state("g1") == "processing" and sim.state("g2") == "no-worker"
    assert sim.s.placement.reserving is sim.s.tasks["g2"]  # the next one gathers...
    assert len(sim.s.placement.reserved) <= 1  # ...what is free: one worker at most
    sim.finish("g1")
    assert sim.state("g2") == "processing"
    assert not set(lease(sim, "g2")) - set("abcd")


def test_a_better_wide_task_takes_over_what_a_worse_one_kept():
    """A worse wide task gathers while a better one waits for its input; once that input
    is in, the better one takes over the workers kept and runs first."""
    sim = SimCluster(seed=7)
    for name in "abc":
        sim.add_worker(name, 1)
    sim.submit({"x": []}, ["x"])
    sim.settle()
    on = sim.where("x")
    sim.submit({"high": ["x"]}, ["high"], annotations={"ranks": {"high": 2}})
    gang(sim, "low", 3)
    assert sim.s.placement.reserving is sim.s.tasks["low"]
    assert len(sim.s.placement.reserved) == 2  # the two free workers
    sim.finish("x", on)
    assert sim.state("high") == "processing" and sim.state("low") == "no-worker"
    assert sim.s.placement.reserving in (None, sim.s.tasks["low"])
    sim.finish("high")
    assert sim.state("low") == "processing"


def test_a_wide_task_wider_than_the_cluster_keeps_no_worker_until_it_grows():
    sim = SimCluster(seed=8)
    sim.add_worker("a", 1)
    gang(sim, "g", 2)
    assert sim.state("g") == "no-worker" and not sim.s.placement.reserved
    sim.submit({"n": []}, ["n"])  # the cluster is not held for a task that cannot run
    sim.settle()
    assert sim.state("n") == "processing"
    sim.finish("n")
    sim.add_worker("b", 1)
    sim.settle()
    assert sim.state("g") == "processing"


def test_a_worker_lost_while_a_wide_task_gathers_too_few_left_gives_back_what_it_kept():
    """Three one-thread workers, one busy with a narrow task: the wide task of three keeps
    the two free ones. The busy worker dies: two workers are left for a task of three, so
    it waits for the cluster to grow keeping none, and the narrow task lost with the
    worker runs again on one of those it had kept (found by a random story: it stayed
    no-worker, the two workers idle, for ever)."""
    sim = SimCluster(seed=11)
    sim.add_worker("a", 1)
    sim.submit({"n": []}, ["n"])
    sim.settle()
    assert sim.running("a") == ["n"]
    gang(sim, "g", 3)
    sim.add_worker("b", 1)
    sim.add_worker("c", 1)
    sim.settle()
    assert sorted(ws.address for ws in sim.s.placement.reserved) == [address("b"), address("c")]
    sim.remove_worker("a")
    sim.settle()
    assert not sim.s.placement.reserved and sim.s.placement.reserving is None
    assert sim.state("g") == "no-worker"
    assert sim.state("n") == "processing" and sim.where("n") in ("b", "c")
    sim.add_worker("d", 1)  # the cluster grows: the wide task gathers again
    sim.finish("n")
    sim.settle()
    assert sim.state("g") == "processing" and sorted(lease(sim, "g")) == ["b", "c", "d"]


def test_a_wide_task_that_raises_frees_its_slots_and_errs():
    sim = SimCluster(seed=9)
    for name in "ab":
        sim.add_worker(name, 1)
    gang(sim, "g", 2)
    sim.fail("g", ValueError("rank 0 failed"))
    assert sim.state("g") == "erred" and not sim.s.graph.leases
    assert all(not holding(sim, n) for n in "ab")
    assert sim.told("task-erred")[-1].key == "g"


def test_a_one_slot_task_takes_no_lease():
    sim = SimCluster(seed=10)
    sim.add_worker("a", 2)
    sim.submit({"x": []}, ["x"], annotations={"ranks": {"x": 1}})
    sim.settle()
    assert sim.running("a") == ["x"] and not sim.s.graph.leases


@pytest.mark.parametrize("seed", [11, 12])
def test_a_seeded_story_is_told_the_same_twice(seed):
    """The same story under the same seed makes the same transitions, in the same order."""
    def story() -> list:
        sim = SimCluster(seed=seed)
        for name in "abcdef":
            sim.add_worker(name, 1, host="h1" if name < "d" else "h2")
        sim.submit({f"t{i}": [] for i in range(12)}, [f"t{i}" for i in range(12)])
        sim.settle()
        gang(sim, "g", 4)
        for _ in range(20):
            busy = [(n, k) for n, keys in sim.executing.items() for k in keys]
            if not busy:
                break
            name, key = sorted(busy)[0]
            sim.finish(key, name)
        return sim.replay()

    assert story() == story()


def test_a_wide_task_wider_than_the_cluster_does_not_block_a_narrower_one():
    """A task of three slots waits for a third worker; a later task of two runs on the
    two there are meanwhile."""
    sim = SimCluster(seed=13)
    gang(sim, "wide", 3)
    sim.add_worker("a", 1)
    sim.add_worker("b", 1)
    sim.settle()
    gang(sim, "narrower", 2)
    assert sim.state("narrower") == "processing" and sim.state("wide") == "no-worker"
    sim.finish("narrower")
    sim.add_worker("c", 1)
    sim.settle()
    assert sim.state("wide") == "processing"


def test_a_member_that_raises_fails_the_task_and_the_others_take_no_work_until_they_end():
    """A gang of three on four workers; its second member raises. The task errs at once
    with that member's exception; the other members, which may be blocked forever in a
    collective waiting for it, are told to drop the task and are ``blocked``: a narrow
    task submitted next goes to the fourth worker, never to them, and their memory
    monitors saying "running" (after a pause) changes nothing. A member that says its part
    ended (it returned, or raised too) takes work again."""
    sim = SimCluster(seed=11)
    for name in "abcd":
        sim.add_worker(name, 1)
    gang(sim, "g", 3)
    members = lease(sim, "g")
    sim.started("g")
    sim.fail("g", ZeroDivisionError("rank 1"), members[1])
    assert sim.state("g") == "erred" and not sim.s.graph.leases
    assert "rank 1" in str(sim.s.tasks["g"].exception)
    assert status(sim, members) == ["blocked", "running", "blocked"]
    info = sim.s.workers_info()
    assert info[address(members[0])]["blocked"] == 1 and info[address(members[1])]["blocked"] == 0
    for status_said in ("paused", "running"):  # the memory monitor cannot unblock it
        sim.scheduler(ev.WorkerStatusChange(address(members[0]), status_said))
    assert status(sim, members) == ["blocked", "running", "blocked"]
    spare = ({"a", "b", "c", "d"} - set(members)).pop()
    for i in range(4):
        sim.submit({f"after{i}": []}, [f"after{i}"])
        sim.settle()
        assert sim.where(f"after{i}") in (spare, members[1])
        sim.finish(f"after{i}")
    sim.finish("g", members[2], value="dropped")  # its collective ended after all
    assert status(sim, members)[1:] == ["running", "running"]
    assert sim.state("g") == "erred"
    assert status(sim, members)[0] == "blocked"


def test_a_blocked_member_of_two_threads_loses_one():
    """Workers of two threads: a member left in a failed gang offers one thread fewer
    (and stays running), and has it back when its part ends."""
    sim = SimCluster(seed=13)
    for name in "ab":
        sim.add_worker(name, 2)
    gang(sim, "g", 2)
    first, other = lease(sim, "g")
    sim.fail("g", ValueError("rank 0"), first)
    ws = sim.s.workers[address(other)]
    assert (ws.status, ws.nthreads, sim.s.total_nthreads) == ("running", 1, 3)
    sim.submit({"x": [], "y": []}, ["x", "y"])
    sim.settle()
    sim.submit({"z": []}, ["z"])
    sim.settle()
    assert len([k for k in sim.running(other) if k != "g"]) <= 1  # its one thread left
    sim.finish("g", other, value="dropped")
    assert (ws.status, ws.nthreads, sim.s.total_nthreads) == ("running", 2, 4)


def test_a_member_that_finished_before_another_raised_is_not_blocked():
    sim = SimCluster(seed=12)
    for name in "abc":
        sim.add_worker(name, 1)
    gang(sim, "g", 3)
    members = lease(sim, "g")
    sim.finish("g", members[2], value="dropped")
    sim.fail("g", ValueError("first rank"), members[0])
    assert sim.state("g") == "erred"
    assert status(sim, members) == ["running", "blocked", "running"]


def status(sim: SimCluster, names: list[str]) -> list[str]:
    return [sim.s.workers[address(n)].status for n in names]


def comm(sim: SimCluster, key: str, name: str) -> tuple:
    """``(communicator number, numbers to free first)`` that worker ``name`` runs ``key`` with."""
    lease = sim.workers[name].tasks[key].lease
    return lease.comm, lease.free_comms


def busy(sim: SimCluster, key: str, name: str) -> None:
    """A narrow task ``key`` runs on worker ``name`` (restricted to it)."""
    sim.submit({key: []}, [key], annotations={"workers": {key: [address(name)]}})
    sim.settle()
    assert sim.where(key) == name


def test_a_gang_on_the_same_members_uses_their_communicator_again():
    """Two workers of two threads. g1 runs on a and b and names a communicator; g2 runs
    there at the same time and gets another (two tasks never share one); g3, after g1
    ended, is given g1's again, so no member makes a new one."""
    sim = SimCluster(seed=7)
    for name in "ab":
        sim.add_worker(name, 2)
    gang(sim, "g1", 2)
    gang(sim, "g2", 2)
    assert lease(sim, "g1") == lease(sim, "g2") == ["a", "b"]
    first, second = comm(sim, "g1", "a"), comm(sim, "g2", "a")
    assert comm(sim, "g1", "b") == first and comm(sim, "g2", "b") == second
    assert first[0] != second[0] and first[0] > 0 and second[0] > 0
    sim.finish("g1", "b")
    sim.finish("g1")
    gang(sim, "g3", 2)
    assert lease(sim, "g3") == ["a", "b"]
    assert comm(sim, "g3", "a") == comm(sim, "g3", "b") == (first[0], ())


def test_a_worker_keeps_a_bounded_number_of_communicators():
    """One communicator per worker at most. g1 on (a, b) names c1; with a busy, g2 runs
    on (b, c) and names c2, evicting c1, which b frees now; with c busy, g3 on (a, b)
    needs one more for a and b: it evicts c2 (idle), and its members free c1 (a still
    holds it) and c2 (b holds it; c is told with its next gang)."""
    sim = SimCluster(seed=8, scheduler_kw={"gang_comms_per_worker": 1})
    for name in "abc":
        sim.add_worker(name, 1)
    gang(sim, "g1", 2)
    assert lease(sim, "g1") == ["a", "b"]
    c1 = comm(sim, "g1", "a")[0]
    sim.finish("g1", "b")
    sim.finish("g1")
    busy(sim, "x", "a")
    gang(sim, "g2", 2)
    assert lease(sim, "g2") == ["b", "c"]
    sim.finish("x")
    c2, frees = comm(sim, "g2", "b")
    assert c2 != c1 and frees == (c1,)
    sim.finish("g2", "c")
    sim.finish("g2")
    busy(sim, "y", "c")
    gang(sim, "g3", 2)
    assert lease(sim, "g3") == ["a", "b"]
    c3, frees = comm(sim, "g3", "a")
    assert c3 not in (c1, c2) and sorted(frees) == sorted([c1, c2])
    assert sim.s.graph.comms.take_frees([address("c")]) == [c2]


def finish_all(sim: SimCluster, key: str) -> None:
    """Every member of the wide task ``key`` ends its part, the first one last."""
    members = lease(sim, key)
    for other in members[1:]:
        sim.finish(key, other, value="dropped")
    sim.finish(key, members[0])


def test_ranks_per_node_spreads_a_gang_over_hosts():
    """Six free workers, three on h1, two on h2, one on h3. A gang of three packed takes
    h1's three; spread (``ranks_per_node=1``) it takes one worker of each host; with two a
    host, h1's two and h2's two; and one of four, one a host, which the three hosts cannot
    hold, keeps no worker from the narrow tasks nor from a gang submitted after it."""
    sim = SimCluster(seed=14)
    hosts = {"a": "h1", "b": "h1", "c": "h1", "d": "h2", "e": "h2", "f": "h3"}
    for name, host in hosts.items():
        sim.add_worker(name, 1, host=host)
    gang(sim, "packed", 3)
    assert sorted(hosts[n] for n in lease(sim, "packed")) == ["h1", "h1", "h1"]
    finish_all(sim, "packed")
    sim.submit({"spread": []}, ["spread"], annotations={"ranks": {"spread": 3},
                                                        "ranks_per_node": {"spread": 1}})
    sim.settle()
    assert sorted(hosts[n] for n in lease(sim, "spread")) == ["h1", "h2", "h3"]
    finish_all(sim, "spread")
    sim.submit({"two": []}, ["two"], annotations={"ranks": {"two": 4},
                                                  "ranks_per_node": {"two": 2}})
    sim.settle()
    assert sorted(hosts[n] for n in lease(sim, "two")) == ["h1", "h1", "h2", "h2"]
    finish_all(sim, "two")
    sim.submit({"never": []}, ["never"], annotations={"ranks": {"never": 4},
                                                      "ranks_per_node": {"never": 1}})
    sim.settle()
    assert sim.state("never") == "no-worker" and not sim.s.placement.reserved
    sim.submit({"narrow": []}, ["narrow"])
    sim.settle()
    assert sim.state("narrow") == "processing"
    gang(sim, "after", 3)  # a gang the cluster can hold runs: never blocks it
    assert sim.state("after") == "processing" and sim.state("never") == "no-worker"


def test_a_gangs_slots_come_from_one_batch_job():
    """Two jobs: job 7 with a, b, c (on n1, n2, n3), job 8 with d, e (on n1, n2): the
    launcher of a job reaches only its own nodes. A gang of three takes job 7's three, a
    gang of two then job 8's two. With a and d busy, a gang of three, which only job 7
    could hold, waits (though b, c and e are free) until a frees; one of four, wider
    than any job though not than the cluster, keeps no worker and blocks no other."""
    sim = SimCluster(seed=15)
    jobs = {"a": "7", "b": "7", "c": "7", "d": "8", "e": "8"}
    hosts = {"a": "n1", "b": "n2", "c": "n3", "d": "n1", "e": "n2"}
    for name, job in jobs.items():
        sim.add_worker(name, 1, host=hosts[name], job=job)
    gang(sim, "three", 3)
    assert sorted(lease(sim, "three")) == ["a", "b", "c"]
    gang(sim, "two", 2)
    assert sorted(lease(sim, "two")) == ["d", "e"]
    finish_all(sim, "three")
    finish_all(sim, "two")
    sim.submit({"x": []}, ["x"], workers=[address("a")])
    sim.submit({"y": []}, ["y"], workers=[address("d")])
    sim.settle()
    assert sim.running("a") == ["x"] and sim.running("d") == ["y"]
    gang(sim, "again", 3)
    assert sim.state("again") == "no-worker"
    sim.finish("y")  # d frees: job 8 still cannot hold three
    assert sim.state("again") == "no-worker"
    sim.finish("x")
    assert sorted(lease(sim, "again")) == ["a", "b", "c"]
    finish_all(sim, "again")
    gang(sim, "wide", 4)
    assert sim.state("wide") == "no-worker" and not sim.s.placement.reserved
    gang(sim, "after", 2)
    assert sim.state("after") == "processing"


def test_a_worker_that_leaves_leaves_no_communicator_behind():
    """g1 ran on a and b and left its communicator idle; g2 runs on c and d. b leaves: a is
    told to free g1's with its next gang. d leaves while g2 runs: the task runs again, and
    c frees g2's. Nothing of b or d is kept."""
    sim = SimCluster(seed=15)
    for name in "abcd":
        sim.add_worker(name, 1)
    gang(sim, "g1", 2)
    assert lease(sim, "g1") == ["a", "b"]
    c1 = comm(sim, "g1", "a")[0]
    finish_all(sim, "g1")
    busy(sim, "x", "a")
    busy(sim, "y", "b")
    gang(sim, "g2", 2)
    assert lease(sim, "g2") == ["c", "d"]
    c2 = comm(sim, "g2", "c")[0]
    comms = sim.s.graph.comms
    sim.remove_worker("b")
    sim.settle()
    sim.remove_worker("d")
    sim.settle()
    gone = {address("b"), address("d")}
    assert not gone & (comms.held.keys() | comms.lru.keys() | comms.to_free.keys())
    assert all(not gone & set(members) for members in comms.members.values())
    assert sorted(comms.to_free[address("a")]) == [c1]
    assert comms.to_free[address("c")] == [c2] and c2 not in comms.members


def test_many_wide_tasks_waiting_run_one_at_a_time_in_order_of_priority():
    """Two one-thread workers, busy; twenty tasks of two slots each wait. As the workers
    free, the wide tasks run one after the other, each once the one before finished, in
    the order they were submitted (their priority), and none keeps a worker meanwhile."""
    sim = SimCluster(seed=14)
    for name in "ab":
        sim.add_worker(name, 1)
    sim.submit({"x": [], "y": []}, ["x", "y"])
    sim.settle()
    for i in range(20):
        gang(sim, f"g{i:02d}", 2)
    assert all(sim.state(f"g{i:02d}") == "no-worker" for i in range(20))
    sim.finish("x")
    sim.finish("y")
    ran = []
    for _ in range(20):
        running = [k for k in sim.s.tasks if k.startswith("g") and sim.state(k) == "processing"]
        assert len(running) == 1, running
        ran.append(running[0])
        sim.finish(running[0], lease(sim, running[0])[0])
        sim.settle()
    assert ran == [f"g{i:02d}" for i in range(20)]
    assert not sim.s.placement.gangs and not sim.s.placement.reserved


class _Wide:
    def __init__(self, priority: tuple, width: int):
        self.priority, self.width = priority, width


def test_the_placement_module_examples_hold():
    assert doctest.testmod(placement).failed == 0
