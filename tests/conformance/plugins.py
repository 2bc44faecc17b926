"""Worker and scheduler plugins, run the same over TCP (LocalCluster) and under mpiexec:
``check(client, tmp_dir, add_worker)``; ``add_worker()`` adds a worker, or returns False
where none can join (MPI), which skips the late-joiner part."""

from __future__ import annotations

from typing import Any

from hpcsched import SchedulerPlugin, WorkerPlugin
from tests.conformance.primitives import raises


class Marker(WorkerPlugin):
    def __init__(self, value: str):
        self.value = value

    def setup(self, worker: Any) -> None:
        worker.conf_plugin = self.value
        worker.conf_setups = getattr(worker, "conf_setups", 0) + 1

    def teardown(self, worker: Any) -> None:
        worker.conf_plugin = f"torn {self.value}"


class Broken(WorkerPlugin):
    def setup(self, worker: Any) -> None:
        raise ZeroDivisionError("setup failed")


class Watcher(SchedulerPlugin):
    def start(self, scheduler: Any) -> None:
        scheduler.conf_events = ["start"]
        self.scheduler = scheduler

    def add_worker(self, scheduler: Any = None, worker: str | None = None) -> None:
        scheduler.conf_events.append(("add", worker))

    def remove_worker(self, scheduler: Any = None, worker: str | None = None,
                      **kwargs: Any) -> None:
        scheduler.conf_events.append(("remove", worker))

    def close(self) -> None:
        self.scheduler.conf_events.append("close")


class TransitionLog(SchedulerPlugin):
    """Records every transition the scheduler reports, as distributed's plugins see them."""

    def start(self, scheduler: Any) -> None:
        scheduler.conf_transitions = self.log = []

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   stimulus_id: str = "", **kwargs: Any) -> None:
        self.log.append((key, start, finish, stimulus_id))


class BrokenTransition(SchedulerPlugin):
    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        raise ZeroDivisionError("a plugin's error must not stop the scheduler")


def check_transitions(client: Any) -> None:
    """Each task's transitions reach scheduler plugins in order, each with the stimulus id
    of the message that caused it; a plugin that raises changes nothing for the others."""
    client.register_plugin(BrokenTransition(), name="broken-transition")
    client.register_plugin(TransitionLog(), name="transition-log")
    ok = client.submit(lambda: 1, key="conf-transition-ok")
    bad = client.submit(lambda: 1 / 0, key="conf-transition-bad")
    assert ok.result(30) == 1
    raises(ZeroDivisionError, bad.result, 30)
    log = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.conf_transitions))
    for key, last, cause in (("conf-transition-ok", "memory", "task-finished-"),
                             ("conf-transition-bad", "erred", "task-erred-")):
        chain = [e for e in log if e[0] == key]
        assert chain and chain[0][1] == "released", (key, chain)
        assert all(a[2] == b[1] for a, b in zip(chain, chain[1:], strict=False)), chain
        assert (chain[-1][2], chain[-1][3][:len(cause)]) == (last, cause), chain
        assert all(e[3].startswith(("update-graph-", cause)) for e in chain), chain
        assert chain[0][3].startswith("update-graph-"), chain
    # a plugin raising in every transition stopped nothing
    assert client.submit(lambda: 2, pure=False).result(30) == 2


def marks(client: Any) -> dict:
    return client.run(lambda dask_worker: getattr(dask_worker, "conf_plugin", None))


def check(client: Any, tmp_dir: str, add_worker: Any) -> None:
    addrs = sorted(client.scheduler_info()["workers"])

    # worker plugins: set up on every worker now, and on workers joining later
    assert client.register_plugin(Marker("one"), name="marker") == \
        {a: {"status": "OK"} for a in addrs}
    assert set(marks(client).values()) == {"one"}
    client.register_plugin(Marker("ignored"), name="marker", idempotent=True)
    assert set(marks(client).values()) == {"one"}
    assert set(client.run(lambda dask_worker: dask_worker.conf_setups).values()) == {1}
    client.register_worker_plugin(Marker("two"), name="marker")  # replaces: teardown, setup
    assert set(marks(client).values()) == {"two"}
    assert client.submit(lambda: __import__("hpcsched").get_worker().conf_plugin,
                         pure=False).result(30) == "two"
    if add_worker():
        assert set(marks(client).values()) == {"two"} and len(marks(client)) == len(addrs) + 1
    client.unregister_worker_plugin("marker")
    assert set(marks(client).values()) == {"torn two"}
    raises(ValueError, client.unregister_worker_plugin, "marker")
    raises(ZeroDivisionError, client.register_plugin, Broken(), name="broken")
    raises(ValueError, client.register_worker_plugin, Marker("x"), nanny=True)
    raises(TypeError, client.register_plugin, object())

    # scheduler plugins: started in the scheduler, told of workers, closed when replaced
    client.register_plugin(Watcher(), name="watcher")
    assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.conf_events) \
        == ["start"]
    client.register_plugin(Watcher(), name="watcher", idempotent=True)
    assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.conf_events) \
        == ["start"]
    if add_worker():
        events = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.conf_events)
        assert events[0] == "start" and events[1][0] == "add", events

    check_transitions(client)

    # restart: futures cancelled, data dropped, worker plugins set up again
    client.register_plugin(Marker("r"), name="restart-marker")
    before = client.run(lambda dask_worker: dask_worker.conf_setups)
    kept = client.submit(lambda: "data", pure=False)
    assert kept.result(30) == "data"
    client.restart()
    assert kept.status == "cancelled"
    assert client.has_what() == {a: [] for a in client.has_what()}
    after = client.run(lambda dask_worker: dask_worker.conf_setups)
    assert all(after[a] == before[a] + 1 for a in before), (before, after)
    assert client.submit(lambda: 5, pure=False).result(30) == 5
    client.unregister_worker_plugin("restart-marker")
