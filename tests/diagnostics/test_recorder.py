"""The recorder, driven through SchedulerState events alone: no process, no clock.

A story per test: workers join, tasks are submitted and finish (with the start and
stop times a worker reports), and what the recorder kept is checked against what
happened: the task stream, per-group totals, events, and snapshots built from it.
"""

from __future__ import annotations

import pytest

from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState
from hpcsched.diagnostics import snapshot
from hpcsched.diagnostics.recorder import Recorder

A, B = "tcp://a", "tcp://b"


def recorded_state(*workers: tuple[str, int]) -> tuple[SchedulerState, Recorder]:
    s = SchedulerState(work_stealing=False)
    rec = s.recorder = Recorder()
    for address, nthreads in workers:
        s.handle(ev.AddWorker(address, nthreads, name=address[-1], now=1.0))
    s.handle(ev.AddClient("c", now=1.0))
    return s, rec


def submit(s: SchedulerState, keys: list[str]) -> None:
    tasks = {k: {"run_spec": f"spec-{k}", "deps": []} for k in keys}
    s.handle(ev.UpdateGraph("c", tasks, keys, now=1.0))


def run(s: SchedulerState, key: str, start: float, stop: float, nbytes: int = 8) -> None:
    ws = s.tasks[key].processing_on.address
    s.handle(ev.TaskStarted(ws, key, now=start))
    s.handle(ev.TaskFinished(ws, key, nbytes=nbytes, typename="int", start=start, stop=stop,
                             now=stop))
    s.validate()


def test_stream_has_one_entry_per_finished_task_with_its_worker_and_times():
    s, rec = recorded_state((A, 1))
    submit(s, ["inc-1", "inc-2"])
    run(s, "inc-1", 10.0, 11.0, nbytes=100)
    run(s, "inc-2", 11.0, 13.0, nbytes=50)
    assert list(rec.stream) == [(A, 0, "inc", "inc-1", 10.0, 11.0, "compute"),
                                (A, 0, "inc", "inc-2", 11.0, 13.0, "compute")]
    g = rec.groups["inc"]
    assert (g.done, g.seconds, g.nbytes, g.first_start, g.last_stop) == (2, 3.0, 150, 10.0, 13.0)
    assert rec.n_finished == 2 and rec.compute_seconds == 3.0


def test_overlapping_tasks_of_one_worker_go_to_different_threads():
    """Two threads: tasks that overlap in time get different lanes; a task that starts
    after one lane freed up reuses it (the thread that freed up last, a tight fit)."""
    s, rec = recorded_state((A, 2))
    submit(s, ["x-1", "x-2", "x-3"])
    for k in ("x-1", "x-2"):
        s.handle(ev.TaskStarted(A, k, now=0.0))
    s.handle(ev.TaskFinished(A, "x-1", nbytes=8, start=0.0, stop=5.0, now=5.0))
    s.handle(ev.TaskFinished(A, "x-2", nbytes=8, start=1.0, stop=3.0, now=5.0))
    run(s, "x-3", 4.0, 6.0)
    lanes = {e[3]: e[1] for e in rec.stream}
    assert lanes["x-1"] != lanes["x-2"]
    assert lanes["x-3"] == lanes["x-2"]  # x-2's thread was free at 4.0, x-1's was not


@pytest.mark.timeout(30)
def test_a_bulk_maps_report_is_one_entry_per_element_in_its_workers_lanes():
    """A map of 4 elements on A (one thread) and B (two): each range-finished report
    gives one stream entry per element, as a task would; B's overlapping elements take
    different lanes; the group's totals count every element."""
    s, rec = recorded_state((A, 1), (B, 2))
    out = s.handle(ev.UpdateMap("c", prefix="sq-x-", function=b"f",
                                args=[b"a"] * 4, now=1.0))
    given: dict = {A: [], B: []}
    for m in out:
        if m.msg.op == "compute-range":
            given[m.to] += m.msg.indices
    a, b = given[A], given[B]
    assert sorted(a + b) == [0, 1, 2, 3] and a and len(b) > 1
    s.handle(ev.RangeFinished(A, prefix="sq-x-", indices=a, nbytes=[8] * len(a),
                              types=["int"] * len(a), starts=[10.0 + j for j in range(len(a))],
                              stops=[10.5 + j for j in range(len(a))], now=20.0))
    s.handle(ev.RangeFinished(B, prefix="sq-x-", indices=b, nbytes=[-1] + [8] * (len(b) - 1),
                              types=["int"] * len(b), starts=[10.0] * len(b),
                              stops=[12.0] * len(b), now=20.0))
    s.validate()
    entries = list(rec.stream)
    assert [e[3] for e in entries] == [f"sq-x-{i}" for i in a + b]
    assert [e[1] for e in entries[:len(a)]] == [0] * len(a)
    assert entries[0] == (A, 0, "sq-x", "sq-x-" + str(a[0]), 10.0, 10.5, "compute")
    assert {e[1] for e in entries[len(a):]} == {0, 1}  # overlapping: both of B's threads
    g = rec.groups["sq-x"]
    assert g.done == 4 and rec.n_finished == 4 and rec.stream_count == 4
    assert g.seconds == 0.5 * len(a) + 2.0 * len(b)
    assert g.nbytes == 8 * len(a) + 8 * (len(b) - 1)  # a negative size counts as none
    assert (g.first_start, g.last_stop) == (10.0, max(12.0, 10.5 + len(a) - 1))


def test_erred_task_shows_in_stream_events_and_group_totals():
    s, rec = recorded_state((A, 1))
    submit(s, ["boom-1"])
    s.handle(ev.TaskStarted(A, "boom-1", now=2.0))
    s.handle(ev.TaskErred(A, "boom-1", exception=None, exception_text="ValueError: no",
                          start=2.0, stop=2.5, now=2.5))
    assert rec.stream[-1][6] == "erred"
    assert rec.groups["boom"].erred == 1 and rec.n_erred == 1
    (t, topic, text), = [e for e in snapshot.events(rec) if e[1] == "task-erred"]
    assert (t, topic) == (2.5, "task-erred")
    assert "boom-1" in text and "ValueError: no" in text and A in text


def gang(s: SchedulerState, key: str) -> list[str]:
    """Submit ``key`` holding two workers' slots (``ranks=2``); its members, first first."""
    s.handle(ev.UpdateGraph("c", {key: {"run_spec": f"spec-{key}", "deps": []}}, [key],
                            now=1.0, annotations={"ranks": {key: 2}}))
    members = [m.address for m in s.graph.leases[s.tasks[key]]]
    for m in members:
        s.handle(ev.TaskStarted(m, key, now=2.0))
    return members


@pytest.mark.parametrize("second_first", [False, True])
def test_a_gang_is_one_task_on_each_of_its_members_lanes(second_first):
    # the members' parts end in either order; the first member's times are the task's
    s, rec = recorded_state((A, 1), (B, 1))
    first, second = gang(s, "mpi-1")
    done = [(first, 2.0, 5.0), (second, 2.1, 4.9)]
    for m, t0, t1 in reversed(done) if second_first else done:
        s.handle(ev.TaskFinished(m, "mpi-1", nbytes=8, typename="int", start=t0, stop=t1,
                                 now=t1))
        s.validate()
    assert s.tasks["mpi-1"].state == "memory"
    assert sorted(rec.stream) == [(A, 0, "mpi", "mpi-1", 2.0, 5.0, "compute"),
                                  (B, 0, "mpi", "mpi-1", 2.0, 5.0, "compute")]
    g = rec.groups["mpi"]
    assert (g.done, g.seconds) == (1, 6.0)  # one task that held two slots for 3 s
    assert rec.n_finished == 1 and rec.compute_seconds == 6.0
    stream = snapshot.task_stream(rec)["tasks"]
    assert sorted(t[0] for t in stream) == [A, B] and {t[3] for t in stream} == {"mpi-1"}


def test_a_gang_that_raises_shows_erred_on_every_member():
    s, rec = recorded_state((A, 1), (B, 1))
    _, second = gang(s, "mpi-1")
    s.handle(ev.TaskErred(second, "mpi-1", exception=None, exception_text="ValueError: no",
                          start=2.0, stop=2.5, now=2.5))
    assert sorted(rec.stream) == [(A, 0, "mpi", "mpi-1", 2.0, 2.5, "erred"),
                                  (B, 0, "mpi", "mpi-1", 2.0, 2.5, "erred")]
    assert rec.groups["mpi"].erred == 1 and rec.n_erred == 1


def test_workers_joining_leaving_and_retiring_are_events():
    s, rec = recorded_state((A, 1), (B, 1))
    s.handle(ev.RetireWorkers("r1", "c", [B], True, now=3.0))
    s.handle(ev.RemoveWorker(A, "connection closed", now=4.0))
    topics = [e[1] for e in snapshot.events(rec)]
    assert topics == ["worker-added", "worker-added", "retire-workers", "worker-removed",
                      "worker-removed"]
    texts = [e[2] for e in snapshot.events(rec)]
    assert any("left: connection closed" in t and A in t for t in texts)


def test_heartbeat_transfers_are_recorded_and_taken_out_of_worker_metrics():
    s, rec = recorded_state((A, 1))
    metrics = {"memory": 123, "transfers": [[B, 1.0, 1.5, 1000], ["bad"], "junk"],
               "logs": [[1.0, "WARNING", "task failed"]]}
    s.handle(ev.Heartbeat(A, metrics, now=2.0))
    assert list(rec.transfers) == [(A, B, 1.0, 1.5, 1000)]  # malformed entries skipped
    assert rec.bytes_transferred == 1000
    assert s.workers[A].metrics == {"memory": 123}
    assert snapshot.worker_logs(rec) == {A: [[1.0, "WARNING", "task failed"]]}
    s.handle(ev.Heartbeat(A, "not a dict", now=3.0))  # untrusted input: ignored


def test_status_counts_tasks_per_group_by_state_and_done_after_release():
    s, rec = recorded_state((A, 1))
    submit(s, ["a-1", "a-2", "a-3"])
    run(s, "a-1", 1.0, 2.0)
    s.handle(ev.ClientReleasesKeys("c", ["a-1"], now=2.0))  # finished, then forgotten
    st = snapshot.status(type("S", (), {"state": s, "address": A, "id": "s", "started": 0.0}),
                         rec, 3.0)
    (g,) = st["groups"]
    assert g["name"] == "a" and g["done"] == 1 and g["total"] == 3
    assert g["processing"] + g["queued"] + g["waiting"] == 2
    assert st["tasks"]["memory"] == 0 and st["n_tasks"] == 2 == sum(st["tasks"].values())
    assert st["n_workers"] == 1 and st["workers"][0]["address"] == A


def test_memory_is_bounded():
    s, rec = recorded_state((A, 1))
    rec.stream = type(rec.stream)(maxlen=10)
    keys = [f"t-{i}" for i in range(30)]
    submit(s, keys)
    for i, k in enumerate(keys):
        run(s, k, float(i), i + 0.5)
    assert len(rec.stream) == 10 and rec.stream[-1][3] == "t-29"
    assert rec.n_finished == 30
