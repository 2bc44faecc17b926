"""Stories of workers that leave at a known time (their ``--lifetime``, their job's
walltime): a task expected to run longer than a worker has left is not started there
while another worker stays long enough; when none does, it starts anyway and the
scheduler says so. Told in the simulated cluster (tests/core/state/sim.py), the clock in
seconds, ``validate()`` after every event.

    short: 4 threads, leaves in 120 s        fresh: 1 thread, leaves in an hour
"""

from __future__ import annotations

import logging

import pytest

from hpcsched.core.protocol.messages import ComputeRange
from hpcsched.core.state import events as ev
from tests.core.state.sim import CLIENT, SimCluster, address


def cluster() -> SimCluster:
    sim = SimCluster(seed=1)
    sim.add_worker("short", 4, lifetime_end=sim.now + 120)
    sim.add_worker("fresh", 1, lifetime_end=sim.now + 3600)
    return sim


def test_a_task_expected_to_outlast_a_worker_goes_to_one_that_stays():
    """fresh is busy, short has idle threads: a task that says nothing goes to short; x
    says it runs 10 minutes: not on short (2 minutes left), but behind fresh's task. y
    says 1 minute: short may run it."""
    sim = cluster()
    sim.submit({"busy": []}, ["busy"], workers=[address("fresh")])
    sim.settle()
    assert sim.where("busy") == "fresh"
    sim.submit({"w": []}, ["w"])  # the control: nothing said, the least busy takes it
    sim.settle()
    assert sim.where("w") == "short"
    sim.submit({"x": []}, ["x"], annotations={"duration": {"x": 600}})
    sim.settle()
    assert sim.s.tasks["x"].processing_on.address == address("fresh")
    sim.submit({"y": []}, ["y"], annotations={"duration": {"y": 60}})
    sim.settle()
    assert sim.where("y") == "short"


def test_queued_root_tasks_are_not_handed_to_a_worker_about_to_leave():
    """Twenty 10-minute root tasks: fresh takes them as its slot frees; short takes none
    though its threads are idle, and then takes a group of short tasks."""
    sim = cluster()
    keys = [f"long-{i}" for i in range(20)]
    sim.submit({k: [] for k in keys}, keys, annotations={"duration": dict.fromkeys(keys, 600)})
    sim.settle()
    assert sim.running("short") == []
    assert len(sim.running("fresh")) == 1
    quick = [f"quick-{i}" for i in range(4)]
    sim.submit({k: [] for k in quick}, quick, annotations={"duration": dict.fromkeys(quick, 5)})
    sim.settle()
    assert sorted(sim.running("short")) == quick
    sim.finish(sim.running("fresh")[0], seconds=1)
    assert sim.running("short") == quick  # the next long one went to fresh again
    assert len(sim.running("fresh")) == 1


def test_a_groups_measured_duration_counts_when_none_was_said():
    """Nothing said, but a task of the group took 5 minutes: the next stays off short."""
    sim = cluster()
    sim.submit({"sim-0": []}, ["sim-0"], workers=[address("fresh")])
    sim.settle()
    sim.finish("sim-0", seconds=300)
    sim.submit({"sim-1": []}, ["sim-1"])
    sim.settle()
    assert sim.where("sim-1") == "fresh"


def test_when_no_worker_stays_long_enough_the_task_runs_and_the_scheduler_says_so(caplog):
    sim = SimCluster(seed=1)
    sim.add_worker("a", 1, lifetime_end=sim.now + 120)
    sim.add_worker("b", 1, lifetime_end=sim.now + 300)
    with caplog.at_level(logging.WARNING, logger="hpcsched.scheduler"):
        sim.submit({"big": []}, ["big"], annotations={"duration": {"big": 3600}})
        sim.settle()
    assert sim.state("big") == "processing"
    assert "expected to run 3600 s, and no worker stays that long" in caplog.text
    assert "the longest has 300 s left" in caplog.text
    assert "big" in sim.s.placement.outlived


def test_a_worker_that_says_nothing_of_its_end_stays():
    sim = SimCluster(seed=1)
    sim.add_worker("short", 4, lifetime_end=sim.now + 120)
    sim.add_worker("plain", 1)
    sim.submit({"busy": []}, ["busy"], workers=[address("plain")])
    sim.submit({"x": []}, ["x"], annotations={"duration": {"x": 600}})
    sim.settle()
    assert sim.s.tasks["x"].processing_on.address == address("plain")


@pytest.mark.parametrize("said", [True, False])
def test_a_bulk_maps_ranges_go_to_the_worker_that_stays(said: bool):
    """The bulk road: a map whose elements take 10 minutes (as said, or as measured) gives
    short no range; fresh gets them."""
    sim = cluster()
    if not said:  # its group measured first: one element-sized task of 10 minutes
        sim.submit({"m-0": []}, ["m-0"], workers=[address("fresh")])
        sim.settle()
        sim.finish("m-0", seconds=600)
    sim.scheduler(ev.UpdateMap(CLIENT, prefix="m-5f2a9c1d4e7b-", function=b"f",
                               args=[b"x"] * 40, duration=600.0 if said else None))
    sim.settle()
    given = {to for to, record in sim.unrouted if isinstance(record, ComputeRange)}
    assert given == {address("fresh")}
