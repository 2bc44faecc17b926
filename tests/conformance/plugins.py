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
