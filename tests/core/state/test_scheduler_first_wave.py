"""The first wave of a group of unknown duration, handed out a few workers per event.

Queuing (``scheduler.worker-saturation``, as in dask) gives every free worker its slots
of a graph's root-ish tasks as soon as the graph arrives. Nothing says then whether
they take microseconds or minutes; if microseconds, a cluster of a thousand workers has
spread two tasks to each, and every task that combines their results waits for a
transfer. Here one event hands them to at most ``FIRST_WAVE_WORKERS`` free workers;
the server's next iteration (``FillQueue``) hands the next ones theirs, after the first
results that came back meanwhile: long tasks still reach every worker, iteration after
iteration, while short ones go to a few workers in runs (``queue_slots``), and their
reduction stays on those workers.

State-machine level: ``SchedulerState`` driven by events, no processes, no clock.
"""

from __future__ import annotations

import math
from collections import deque

import pytest

from hpcsched.core.state import events as ev
from hpcsched.core.state import policies
from hpcsched.core.state.scheduler_state import SchedulerState

WAVE = policies.FIRST_WAVE_WORKERS


def cluster(n: int) -> SchedulerState:
    """``n`` one-thread workers ``sim://i`` and a client ``c`` (no stealing)."""
    s = SchedulerState(work_stealing=False)
    for i in range(n):
        s.handle(ev.AddWorker(f"sim://{i}", 1, name=f"w{i}"))
    s.handle(ev.AddClient("c"))
    return s


def roots(s: SchedulerState, n: int) -> list:
    """Submit ``n`` independent tasks of one group; the messages sent."""
    tasks = {f"inc-{i}": {"run_spec": "inc", "deps": []} for i in range(n)}
    return s.handle(ev.UpdateGraph("c", tasks, list(tasks)))


def given(out: list) -> dict[str, int]:
    """worker -> tasks sent to it in ``out``."""
    per: dict[str, int] = {}
    for cmd in out:
        if type(cmd.msg).__name__ == "ComputeTask":
            per[cmd.to] = per.get(cmd.to, 0) + 1
    return per


@pytest.mark.timeout(60)
def test_a_group_never_run_reaches_a_few_workers_per_event():
    """A thousand tasks of a group none of which has run, a hundred free workers: one
    event gives ``WAVE`` of them their two slots each, and asks for the next event."""
    s = cluster(100)
    out = roots(s, 1000)
    assert len(given(out)) == WAVE and set(given(out).values()) == {2}
    assert s.fill_pending
    out = s.handle(ev.FillQueue())
    assert len(given(out)) == WAVE and set(given(out).values()) == {2}
    s.validate()


@pytest.mark.timeout(60)
def test_long_tasks_still_reach_every_worker():
    """No result comes back: every ``FillQueue`` gives the next workers their slots, as
    dask's queuing does at once; after enough of them every worker holds two tasks."""
    s = cluster(100)
    per = given(roots(s, 1000))
    events = 0
    while s.fill_pending:
        for w, n in given(s.handle(ev.FillQueue())).items():
            per[w] = per.get(w, 0) + n
        events += 1
    assert events == math.ceil(100 / WAVE) - 1
    assert per == {f"sim://{i}": 2 for i in range(100)}
    assert sum(ts.state == "queued" for ts in s.tasks.values()) == 1000 - 200
    s.validate()


@pytest.mark.timeout(60)
def test_once_results_say_short_a_few_workers_take_runs():
    """The first result says 100 us: the rest of the group goes out in runs of 10 ms'
    worth (``queue_slots``), to a few workers, not two to each of the hundred."""
    s = cluster(100)
    out = roots(s, 1000)
    first = next(c for c in out if type(c.msg).__name__ == "ComputeTask")
    key, w = first.msg.key, first.to
    out = s.handle(ev.TaskFinished(w, key, nbytes=28, typename="int", start=0.0,
                                   stop=1e-4, now=1e-4))
    while s.fill_pending:
        out += s.handle(ev.FillQueue())
    holding = [ws for ws in s.workers.values() if ws.processing]
    assert not any(ts.state == "queued" for ts in s.tasks.values())
    assert len(holding) <= WAVE + math.ceil(1000 / (policies.SHORT_RUN / 1e-4))
    s.validate()


def tree(leaves: int) -> tuple[dict, tuple]:
    """A binary reduction of ``leaves`` leaves, its root."""
    dsk: dict = {("leaf", i): {"run_spec": "leaf", "deps": []} for i in range(leaves)}
    level = [("leaf", i) for i in range(leaves)]
    depth = 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), 2):
            k = (f"add{depth}", i // 2)
            dsk[k] = {"run_spec": "add", "deps": level[i:i + 2]}
            nxt.append(k)
        level, depth = nxt, depth + 1
    return dsk, level[0]


def transfers_of_a_tree(n_workers: int, leaves: int) -> int:
    """Dependencies fetched from another worker while ``n_workers`` simulated workers run
    a tree reduction of tasks of 100 us: each runs one task per millisecond (a round),
    and after each round the server's ``FillQueue`` when the state asks for one."""
    s = cluster(n_workers)
    queues: dict[str, deque] = {ws.address: deque() for ws in s.workers.values()}
    moved = 0

    def handle(event: object) -> None:
        nonlocal moved
        for cmd in s.handle(event):
            if type(cmd.msg).__name__ == "ComputeTask":
                queues[cmd.to].append(cmd.msg.key)
                moved += sum(cmd.to not in holders for holders in cmd.msg.who_has.values())

    dsk, root = tree(leaves)
    handle(ev.UpdateGraph("c", dsk, [root]))
    now = 0.0
    while any(queues.values()):
        now += 0.001
        for address, q in queues.items():
            if q:
                handle(ev.TaskFinished(address, q.popleft(), nbytes=28, typename="int",
                                       start=now - 1e-4, stop=now, now=now))
        if s.fill_pending:
            handle(ev.FillQueue(now=now))
    assert s.tasks[root].state == "memory"
    s.validate()
    return moved


@pytest.mark.timeout(120)
def test_a_tree_reduction_over_a_thousand_workers_moves_few_results():
    """4,096 leaves of 100 us on 1,000 workers: the leaves go out in runs to a few
    workers, and nearly every addition finds both its inputs where it runs. Two leaves
    to each of the thousand workers would make every addition above the first level of
    the first wave fetch an input: about a thousand transfers."""
    moved = transfers_of_a_tree(1000, 4096)
    assert moved <= 300, moved
