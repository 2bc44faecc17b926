"""The state machine's work per task does not grow with the number of workers.

Nothing is timed: every worker's ``WorkerInfo`` counts the attributes read on it, and
the same workloads run on 10 and on 1,000 simulated workers (one thread each, as
``benchmarks/bench_scheduler.py`` simulates them). A loop over every worker on the
path of a task or a message (a placement that scans the cluster, a candidate set
taken whole, a cache rebuilt per event) reads about a thousand workers per event on
the large cluster and shows up as a hundredfold count per task; a bounded sample or
a heap does not.
"""

from __future__ import annotations

from collections import deque

import pytest

from hpcsched.core.state import events as ev
from hpcsched.core.state import policies
from hpcsched.core.state import workers as worker_events
from hpcsched.core.state.model import WorkerInfo
from hpcsched.core.state.scheduler_state import SchedulerState

N_TASKS = 3_000


class CountingWorkerInfo(WorkerInfo):
    """A WorkerInfo counting every attribute read on it (in ``reads[0]``)."""

    reads = [0]

    def __getattribute__(self, name: str):  # type: ignore[no-untyped-def]
        CountingWorkerInfo.reads[0] += 1
        return object.__getattribute__(self, name)


class Cluster:
    """A SchedulerState and ``n`` simulated one-thread workers running what they are sent."""

    def __init__(self, n: int, leaving: bool = False):
        self.s = SchedulerState(work_stealing=False)
        self.queues: dict[str, deque] = {}
        self.now = 0.0
        for i in range(n):
            addr = f"sim://{i}"
            self.queues[addr] = deque()
            # ``leaving``: every other worker leaves in a minute (its walltime)
            end = 60.0 if leaving and i % 2 else None
            self.handle(ev.AddWorker(addr, 1, name=f"w{i}", lifetime_end=end))
        self.handle(ev.AddClient("client"))

    def handle(self, event: object) -> None:
        for cmd in self.s.handle(event):
            if type(cmd.msg).__name__ == "ComputeTask":
                self.queues[cmd.to].append(cmd.msg.key)

    def submit(self, tasks: dict) -> None:
        self.handle(ev.UpdateGraph("client", tasks, list(tasks), now=self.now))

    def run(self) -> None:
        """Every worker finishes its tasks, a round at a time, until none is left."""
        while any(self.queues.values()):
            self.now += 0.01
            for addr, q in self.queues.items():
                if q:
                    key = q.popleft()
                    self.handle(ev.TaskStarted(addr, key, now=self.now))
                    self.handle(ev.TaskFinished(addr, key, nbytes=100, typename="int",
                                                start=self.now - 0.01, stop=self.now,
                                                now=self.now))


def one_graph_map(c: Cluster) -> None:
    """One graph of independent root-ish tasks: queued, handed out in blocks."""
    c.submit({f"inc-{i}": {"run_spec": "inc", "deps": []} for i in range(N_TASKS)})
    c.run()


def one_by_one_map(c: Cluster) -> None:
    """Independent tasks of one group submitted one per graph, as ``client.submit`` in a
    loop does: root-ish once the group outnumbers the threads, and each submission finds
    workers free (the queue's blocks are then handed to every free worker)."""
    for i in range(N_TASKS):
        c.submit({f"noop-{i}": {"run_spec": "noop", "deps": []}})
        if i % 64 == 63:  # results come back while the client submits
            c.run()
    c.run()


def one_by_one_tree(c: Cluster) -> None:
    """Leaves, then a pairwise reduction submitted one task per graph, as
    ``client.submit(add, a, b)`` does."""
    level = [f"leaf-{i}" for i in range(N_TASKS)]
    c.submit({k: {"run_spec": "leaf", "deps": []} for k in level})
    n = 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            key = f"add-{n}"
            n += 1
            c.submit({key: {"run_spec": "add", "deps": level[i:i + 2]}})
            nxt.append(key)
            if n % 64 == 0:  # results come back while the client submits
                c.run()
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    c.run()


def small_groups(c: Cluster) -> None:
    """Tasks that are not root-ish (groups of a few), some with inputs: placed by
    ``decide_worker`` among the holders, or a sample of the cluster."""
    for g in range(N_TASKS // 6):
        c.submit({f"a{g}-0": {"run_spec": "f", "deps": []},
                  f"a{g}-1": {"run_spec": "f", "deps": []},
                  f"a{g}-2": {"run_spec": "f", "deps": []}})
        c.submit({f"b{g}-0": {"run_spec": "g", "deps": [f"a{g}-0", f"a{g}-1"]},
                  f"b{g}-1": {"run_spec": "g", "deps": [f"a{g}-1", f"a{g}-2"]},
                  f"b{g}-2": {"run_spec": "g", "deps": [f"a{g}-2"]}})
        c.run()


def long_tasks_beside_leaving_workers(c: Cluster) -> None:
    """Tasks said to take 10 minutes, some with an input, submitted one per graph, on a
    cluster where every other worker leaves in a minute: a decision that meets one chooses
    among a sample of those that stay (placement.py), never among them all."""
    for i in range(N_TASKS):
        deps = [f"long-{i - 1}"] if i % 3 else []
        c.handle(ev.UpdateGraph("client", {f"long-{i}": {"run_spec": "f", "deps": deps}},
                                [f"long-{i}"], annotations={"duration": {f"long-{i}": 600}},
                                now=c.now))
        if i % 64 == 63:
            c.run()
    c.run()
    assert not any(ts.processing_on for ts in c.s.tasks.values())


def reads_per_task(workload, n_workers: int, monkeypatch: pytest.MonkeyPatch,
                   leaving: bool = False) -> float:
    monkeypatch.setattr(worker_events, "WorkerInfo", CountingWorkerInfo)
    c = Cluster(n_workers, leaving)
    CountingWorkerInfo.reads[0] = 0  # the workers joining are not counted
    workload(c)
    reads = CountingWorkerInfo.reads[0]
    n_tasks = len(c.s.tasks)
    assert n_tasks >= N_TASKS - 1 and all(ts.state == "memory" for ts in c.s.tasks.values())
    c.s.validate()
    return reads / n_tasks


@pytest.mark.parametrize("workload", [one_graph_map, one_by_one_map, one_by_one_tree, small_groups])
def test_worker_objects_read_per_task_do_not_grow_with_the_workers(workload, monkeypatch):
    small = reads_per_task(workload, 10, monkeypatch)
    large = reads_per_task(workload, 1_000, monkeypatch)
    # the same work per task, give or take what a hundred times more workers change
    # legitimately: a decision compares a sample of SAMPLE_LIMIT of them (a few attributes
    # each) where the small cluster has 10, and fewer tasks are root-ish; one scan of the
    # cluster per task would read thousands
    assert large <= 1.5 * small + 4 * policies.SAMPLE_LIMIT, (workload.__name__, small, large)


def test_placing_long_tasks_beside_leaving_workers_does_not_grow_with_the_workers(
        monkeypatch):
    small = reads_per_task(long_tasks_beside_leaving_workers, 10, monkeypatch, leaving=True)
    large = reads_per_task(long_tasks_beside_leaving_workers, 1_000, monkeypatch, leaving=True)
    assert large <= 1.5 * small + 4 * policies.SAMPLE_LIMIT, (small, large)


def test_a_tick_over_idle_workers_reads_none_of_them(monkeypatch):
    """Stealing looks at the workers only when one holds more tasks than threads."""
    monkeypatch.setattr(worker_events, "WorkerInfo", CountingWorkerInfo)
    s = SchedulerState(work_stealing=True, worker_ttl=None)
    for i in range(1_000):
        s.handle(ev.AddWorker(f"sim://{i}", 1))
    CountingWorkerInfo.reads[0] = 0
    s.handle(ev.Tick(now=1.0))
    assert CountingWorkerInfo.reads[0] == 0


def reads_per_steal_round(n_workers: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """A tick that plans stealing: five workers hold four tasks each (their input is
    there), every other worker is idle. The attributes read, and the tasks asked for."""
    monkeypatch.setattr(worker_events, "WorkerInfo", CountingWorkerInfo)
    s = SchedulerState(work_stealing=True, worker_ttl=None)
    for i in range(n_workers):
        s.handle(ev.AddWorker(f"sim://{i}", 1))
    s.handle(ev.AddClient("client"))
    for j in range(5):
        holder = f"sim://{j * (n_workers // 5)}"
        s.handle(ev.ScatterData("client", f"sc-{j}", {f"p-{j}": b""}, {f"p-{j}": 8},
                                workers=[holder]))
        s.handle(ev.AddKeys(holder, {f"p-{j}": 8}, scatter_id=f"sc-{j}"))
        tasks = {f"t-{j}-{i}": {"run_spec": "f", "deps": [f"p-{j}"]} for i in range(4)}
        s.handle(ev.UpdateGraph("client", tasks, list(tasks)))
    CountingWorkerInfo.reads[0] = 0
    out = s.handle(ev.Tick(now=1.0))
    reads = CountingWorkerInfo.reads[0]
    s.validate()
    return reads, sum(type(c.msg).__name__ == "StealRequest" for c in out)


def test_a_round_of_stealing_reads_the_backlogged_and_a_few_idle_workers(monkeypatch):
    """Stealing reads the workers holding a backlog and as many idle ones as tasks may
    move, not every worker of the cluster."""
    small, stolen_small = reads_per_steal_round(200, monkeypatch)
    large, stolen_large = reads_per_steal_round(2_000, monkeypatch)
    assert stolen_small == stolen_large == 15  # all but the one each holder runs first
    assert large <= 1.2 * small, (small, large)
