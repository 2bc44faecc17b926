"""The random story of a :class:`SchedulerState` (hypothesis): workers come, go and
report tasks started, finished and erred (also for keys they were never given, or twice);
clients submit graphs (also malformed ones, cycles, unknown dependencies), want, release,
cancel and retry keys, retire workers and rebalance data. After every step the
scheduler's own ``validate()`` must hold, every task whose state changed must have log
entries of that step leading from its old state to its new one, and an event it refuses
(``MalformedMessage``) must leave the state exactly as it was.

:class:`SchedulerStory` is played by test_scheduler_state_fuzz and extended, with maps and
ranges, by test_scheduler_bulk.
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from hpcsched.core.protocol import records
from hpcsched.core.state import events as ev
from hpcsched.core.state.scheduler_state import SchedulerState

WORKERS = ["tcp://w1", "tcp://w2", "tcp://w3"]
CLIENTS = ["c1", "c2"]
# k0..k3: a task group each; x-0..x-7: one group ("x") that grows root-ish as it is
# submitted again, so that the queue and its blocks (scheduler_blocks) are exercised too
KEYS = [f"k{i}" for i in range(4)] + [f"x-{i}" for i in range(8)]

keys = st.sampled_from(KEYS)
workers = st.sampled_from(WORKERS)
clients = st.sampled_from(CLIENTS)


def _snapshot(s: SchedulerState) -> Any:
    return ({k: (ts.state, sorted(d.key for d in ts.dependencies), sorted(ts.who_wants))
             for k, ts in s.tasks.items()},
            sorted(s.workers), s.generation, s.n_queued)


@st.composite
def graphs(draw: Any) -> dict:
    """A graph over KEYS whose dependencies point to earlier keys (no cycle)."""
    chosen = draw(st.lists(keys, min_size=1, max_size=5, unique=True))
    order = sorted(chosen, key=KEYS.index)
    tasks = {}
    for i, k in enumerate(order):
        deps = draw(st.lists(st.sampled_from(order[:i]), max_size=2, unique=True)) if i else []
        tasks[k] = {"run_spec": f"spec-{k}", "deps": deps}
    return tasks


bad_graphs = st.sampled_from([
    {"k0": {"run_spec": "s", "deps": ["k0"]}},
    {"k0": {"run_spec": "s", "deps": ["k1"]}, "k1": {"run_spec": "s", "deps": ["k0"]}},
    {"k0": {"deps": []}},
    {"k0": {"run_spec": "s", "deps": [["unhashable"]]}},
    {"k0": {"run_spec": "s", "deps": 3}},
    ["not", "a", "dict"],
])


class SchedulerStory(RuleBasedStateMachine):
    """Random events to a :class:`SchedulerState`, its invariants checked after each.

    The rules that answer a message the scheduler sent (finish what it asked for, answer
    a steal, a copy arriving) do nothing when there is none, rather than being held back by
    a precondition: hypothesis then draws the same program whatever the scheduler decided,
    so a failure replays (its generation would otherwise follow any decision taken in the
    order of a set, and hypothesis reports such a run as flaky)."""

    def __init__(self) -> None:
        super().__init__()
        self.s = SchedulerState(work_stealing=True)
        self.now = 0.0
        self.asked: list[tuple[str, Any]] = []  # (worker, key) the scheduler sent to compute
        self.copies: list[tuple[str, Any]] = []  # (worker, key) it asked to fetch a copy of
        self.steals: list[tuple[str, Any]] = []  # (victim, key) it asked to give a task up
        self.n = 0

    def handle(self, event: Any) -> None:
        before = _snapshot(self.s)
        self.n += 1
        sid = f"{type(event).__name__}-{self.n}"
        event = records.replace(event, stimulus_id=sid)  # events are frozen
        self.s.transition_listener = entries = []
        try:
            out = self.s.handle(event)
        except ev.MalformedMessage:
            assert _snapshot(self.s) == before, f"a refused {type(event).__name__} changed state"
            return
        self.check_logged(before[0], sid, entries)
        self.note(out)

    def note(self, out: list) -> None:
        """Note the messages of one event that workers answer (in later steps)."""
        asked, steals, copies = [], [], []
        for cmd in out:
            if isinstance(cmd, ev.Send) and cmd.msg.op == "compute-task":
                asked.append((cmd.to, cmd.msg.key))
            if isinstance(cmd, ev.Send) and cmd.msg.op == "steal-request":
                steals.append((cmd.to, cmd.msg.key))
            if isinstance(cmd, ev.Send) and cmd.msg.op == "acquire-replicas":
                copies += [(cmd.to, k) for k in cmd.msg.who_has]
        # the order of one event's messages may follow sets of tasks, which differs from
        # run to run; sorted, the same draws pick the same replies when hypothesis replays
        self.asked += sorted(asked)
        self.steals += sorted(steals)
        self.copies += sorted(copies)

    def check_logged(self, before: dict, sid: str, entries: list) -> None:
        after = {k: ts.state for k, ts in self.s.tasks.items()}
        assert all(e[3] == sid for e in entries), entries
        for key in set(before) | set(after):
            old = before[key][0] if key in before else "released"
            new = after.get(key, "forgotten")
            chain = [(a, b) for k, a, b, _, _ in entries if k == key]
            if old == new and not chain:
                continue
            assert chain and chain[0][0] == old and chain[-1][1] == new, (key, old, new, chain)
            assert all(x[1] == y[0] for x, y in zip(chain, chain[1:], strict=False)), chain

    def tick(self) -> float:
        self.now += 0.01
        return self.now

    # ------------------------------------------------------------ workers
    @rule(worker=workers, nthreads=st.integers(1, 3))
    def add_worker(self, worker: str, nthreads: int) -> None:
        self.handle(ev.AddWorker(worker, nthreads, name=worker[-2:], now=self.tick()))

    @rule(worker=workers)
    def remove_worker(self, worker: str) -> None:
        self.handle(ev.RemoveWorker(worker, "gone", now=self.tick()))

    @rule(i=st.integers(0, 10_000), nbytes=st.integers(0, 10**6))
    def finish_asked(self, i: int, nbytes: int) -> None:
        if not self.asked:  # no precondition: see the class docstring
            return
        worker, key = self.asked.pop(i % len(self.asked))
        now = self.tick()
        self.handle(ev.TaskStarted(worker, key, now=now))
        self.handle(ev.TaskFinished(worker, key, nbytes=nbytes, typename="int", start=now,
                                    stop=now + 0.001, now=now))

    @rule(i=st.integers(0, 10_000))
    def err_asked(self, i: int) -> None:
        if not self.asked:  # no precondition: see the class docstring
            return
        worker, key = self.asked.pop(i % len(self.asked))
        self.handle(ev.TaskErred(worker, key, exception="boom", exception_text="boom",
                                 now=self.tick()))

    @rule(worker=workers, key=keys, finished=st.booleans())
    def stray_reply(self, worker: str, key: str, finished: bool) -> None:
        """A reply for a key this worker may never have been given (late, or foreign)."""
        if finished:
            self.handle(ev.TaskFinished(worker, key, nbytes=8, now=self.tick()))
        else:
            self.handle(ev.TaskErred(worker, key, exception="x", now=self.tick()))

    @rule(i=st.integers(0, 10_000))
    def secede_asked(self, i: int) -> None:
        if not self.asked:  # no precondition: see the class docstring
            return
        worker, key = self.asked[i % len(self.asked)]
        self.handle(ev.LongRunning(worker, key, now=self.tick()))

    @rule(i=st.integers(0, 10_000), state=st.sampled_from(["released", "executing", "memory"]))
    def steal_answered(self, i: int, state: str) -> None:
        if not self.steals:  # no precondition: see the class docstring
            return
        victim, key = self.steals.pop(i % len(self.steals))
        self.handle(ev.StealResponse(victim, key, state, now=self.tick()))

    @rule(worker=workers, key=keys)
    def result_erred(self, worker: str, key: str) -> None:
        self.handle(ev.ResultErred(worker, key, "exc", "", "exc", now=self.tick()))

    @rule(worker=workers, status=st.sampled_from(["paused", "running"]))
    def pause(self, worker: str, status: str) -> None:
        self.handle(ev.WorkerStatusChange(worker, status, now=self.tick()))

    @rule(worker=workers, key=keys)
    def missing_data(self, worker: str, key: str) -> None:
        self.handle(ev.MissingData(worker, key, WORKERS[0], now=self.tick()))

    # ------------------------------------------------------------ clients
    @rule(client=clients, tasks=graphs(), priority=st.integers(-3, 3),
          ranks=st.sampled_from([1, 1, 2, 3]))
    def submit(self, client: str, tasks: dict, priority: int, ranks: int = 1) -> None:
        """A graph whose wanted task may hold several workers' slots (``ranks``)."""
        if client not in self.s.clients:
            self.handle(ev.AddClient(client))
        wanted = list(tasks)[-1:]
        annotations = {"ranks": {k: ranks for k in wanted}} if ranks > 1 else None
        self.handle(ev.UpdateGraph(client, tasks, wanted, priority=priority, now=self.tick(),
                                   annotations=annotations))

    @rule(client=clients, tasks=bad_graphs)
    def submit_malformed(self, client: str, tasks: Any) -> None:
        self.handle(ev.UpdateGraph(client, tasks, ["k0"], now=self.tick()))

    @rule(client=clients, key=keys)
    def release(self, client: str, key: str) -> None:
        self.handle(ev.ClientReleasesKeys(client, [key], now=self.tick()))

    @rule(client=clients, key=keys)
    def desire(self, client: str, key: str) -> None:
        self.handle(ev.ClientDesiresKeys(client, [key], now=self.tick()))

    @rule(client=clients, key=keys)
    def cancel(self, client: str, key: str) -> None:
        self.handle(ev.CancelKeys(client, [key], now=self.tick()))

    @rule(client=clients, key=keys)
    def retry(self, client: str, key: str) -> None:
        self.handle(ev.RetryKeys(client, [key], now=self.tick()))

    @rule(client=clients)
    def remove_client(self, client: str) -> None:
        self.handle(ev.RemoveClient(client, now=self.tick()))

    # ------------------------------------------------------------ moving data
    @rule(client=clients, some=st.booleans())
    def rebalance(self, client: str, some: bool) -> None:
        self.handle(ev.RebalanceKeys(f"r{self.n}", client, KEYS[:4] if some else None,
                                     now=self.tick()))

    @rule(client=clients, worker=workers,
          chosen=st.lists(st.sampled_from([f"s{i}" for i in range(4)]), min_size=1,
                          max_size=4, unique=True))
    def scatter(self, client: str, worker: str, chosen: list) -> None:
        """Data scattered to one worker (so that rebalance has something to move)."""
        if client not in self.s.clients:
            self.handle(ev.AddClient(client))
        sid = f"scatter-{self.n}"
        self.handle(ev.ScatterData(client, sid, dict.fromkeys(chosen, b""),
                                   dict.fromkeys(chosen, 100), workers=[worker],
                                   now=self.tick()))
        if sid in self.s.scatters:
            self.handle(ev.AddKeys(worker, dict.fromkeys(chosen, 100), scatter_id=sid,
                                   now=self.tick()))

    @rule(i=st.integers(0, 10_000))
    def copy_arrives(self, i: int) -> None:
        if not self.copies:  # no precondition: see the class docstring
            return
        worker, key = self.copies.pop(i % len(self.copies))
        self.handle(ev.AddKeys(worker, {key: 8}, now=self.tick()))

    @rule(worker=workers)
    def retire(self, worker: str) -> None:
        self.handle(ev.RetireWorkers(f"retire-{self.n}", "c1", [worker], now=self.tick()))

    @rule()
    def tick_event(self) -> None:
        self.handle(ev.Tick(now=self.tick()))

    # ------------------------------------------------------------ invariants
    @invariant()
    def valid(self) -> None:
        self.s.validate()


SchedulerStory.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow])
