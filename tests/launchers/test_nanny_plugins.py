"""Nanny plugins (``Client.register_plugin(NannyPlugin)``) in the processes that supervise
workers: a ``LocalCluster`` and ``hpcsched worker --nworkers``; refused where nothing
supervises a worker. Real processes; each test ends what it starts."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from hpcsched import Client, LocalCluster, NannyPlugin
from hpcsched.core.worker.nanny import Environ, UploadDirectory
from tests.conftest import wait_until
from tests.launchers.procs import WORKER_OPTS, inc, start_scheduler

VAR = "HPCSCHED_TEST_NANNY_VAR"


class Recorder(NannyPlugin):
    """Logs ``setup``/``teardown`` with the nanny's name and the pid they ran in; with
    ``value``, sets ``VAR`` in the nanny's env (and restarts the worker to show it)."""

    def __init__(self, log: str, tag: str, value: str | None = None):
        self.log, self.tag, self.value = log, tag, value
        self.restart = value is not None

    def _write(self, what: str, nanny: Any) -> None:
        with open(self.log, "a") as f:
            f.write(f"{what} {self.tag} {nanny.name} {os.getpid()}\n")

    def setup(self, nanny: Any) -> None:
        if self.value is not None:
            nanny.env[VAR] = self.value
        self._write("setup", nanny)

    def teardown(self, nanny: Any) -> None:
        self._write("teardown", nanny)


class Broken(NannyPlugin):
    def setup(self, nanny: Any) -> None:
        raise ZeroDivisionError("nanny setup failed")


def lines(log: Path, what: str, tag: str) -> list[tuple[str, int]]:
    """(nanny name, pid) of each ``what`` line of plugin ``tag``."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        w, t, name, pid = line.split()
        if (w, t) == (what, tag):
            out.append((name, int(pid)))
    return out


def worker_view(client: Client) -> dict[str, tuple[Any, int, str | None]]:
    """worker address -> (name, pid, VAR in its environment)."""
    return client.run(lambda dask_worker: (dask_worker.name, os.getpid(), os.environ.get(VAR)))


def settled(client: Client, n: int, value: str | None) -> dict | None:
    """The workers' view once ``n`` workers all see ``VAR == value`` (None meanwhile; a
    worker restarting as we ask is no answer)."""
    try:
        view = worker_view(client)
    except Exception:  # noqa: BLE001 - a worker left before it answered: ask again
        return None
    if len(view) == n and all(v[2] == value for v in view.values()):
        return view
    return None


@pytest.mark.timeout(180)
def test_local_cluster_runs_nanny_plugins_in_its_supervisor(tmp_path):
    log = tmp_path / "log"
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        before = worker_view(client)
        names = sorted(v[0] for v in before.values())

        # setup(nanny) runs here, in the cluster's process, once per worker process
        results = client.register_plugin(Recorder(str(log), "rec"), name="rec")
        assert results == {a: {"status": "OK"} for a in before}
        assert sorted(lines(log, "setup", "rec")) == [(n, os.getpid()) for n in names]
        assert {n: sorted(nn.plugins) for n, nn in cluster.nannies.items()} == \
            {n: ["rec"] for n in names}
        assert worker_view(client) == before  # restart=False: the same processes

        # restart=True: register returns once the workers are back, in the changed env
        client.register_plugin(Recorder(str(log), "env", "one"), name="env")
        after = worker_view(client)
        assert sorted(v[0] for v in after.values()) == names  # the same workers, restarted
        assert {v[2] for v in after.values()} == {"one"}
        assert not set(after) & set(before)
        assert not {v[1] for v in after.values()} & {v[1] for v in before.values()}
        # the restarted workers found the plugin set up in their nanny: not set up again
        assert sorted(lines(log, "setup", "env")) == [(n, os.getpid()) for n in names]

        # idempotent: already registered, nothing runs and nothing restarts
        assert client.register_plugin(Recorder(str(log), "env", "other"), name="env",
                                      idempotent=True) == {}
        assert worker_view(client) == after
        # Client.restart resets worker plugins; nanny plugins stay as they are
        client.restart()
        assert worker_view(client) == after
        assert len(lines(log, "setup", "env")) == 2 and lines(log, "teardown", "env") == []

        # the user's error in setup is raised by register_plugin
        with pytest.raises(ZeroDivisionError, match="nanny setup failed"):
            client.register_plugin(Broken(), name="broken")
        client.unregister_worker_plugin("broken", nanny=True)

        # a nanny joining later gets the plugins: set up, then its worker restarted
        cluster.scale(3)
        view = wait_until(lambda: settled(client, 3, "one"), timeout=90,
                          what="a third worker in the plugin's environment")
        new = sorted({v[0] for v in view.values()} - set(names))
        assert len(new) == 1
        assert sorted(n for n, _ in lines(log, "setup", "env")) == sorted([*names, *new])
        assert sorted(n for n, _ in lines(log, "setup", "rec")) == sorted([*names, *new])

        # unregistered: torn down in each nanny; the workers keep running
        client.unregister_worker_plugin("rec", nanny=True)
        assert sorted(lines(log, "teardown", "rec")) == \
            [(n, os.getpid()) for n in sorted([*names, *new])]
        assert all("rec" not in nn.plugins for nn in cluster.nannies.values())
        assert lines(log, "teardown", "env") == []
    # a closing nanny tears its plugins down
    assert sorted(n for n, _ in lines(log, "teardown", "env")) == sorted([*names, *new])


def test_environ_sets_the_nannys_env_and_restarts():
    class FakeNanny:
        env: dict = {}

    nanny = FakeNanny()
    plugin = Environ({"A": 1, "B": "x"})
    plugin.setup(nanny)
    assert nanny.env == {"A": "1", "B": "x"} and plugin.restart is True


@pytest.mark.timeout(60)
def test_workers_nothing_supervises_refuse_nanny_plugins(tmp_path):
    log = tmp_path / "log"
    with LocalCluster(n_workers=1, processes=False) as cluster, Client(cluster) as client:
        with pytest.raises(RuntimeError, match="has no nanny.*a rank cannot be restarted"):
            client.register_plugin(Recorder(str(log), "rec"), name="rec")
        assert not log.exists()
        # distributed's older spelling, nanny=True or found from the class; a WorkerPlugin
        # is not a nanny plugin
        for nanny in (True, None):
            with pytest.raises(RuntimeError, match="has no nanny"):
                client.register_worker_plugin(Recorder(str(log), "rec"), name="rec",
                                              nanny=nanny)
        from hpcsched import WorkerPlugin

        with pytest.raises(ValueError, match="is a WorkerPlugin"):
            client.register_worker_plugin(WorkerPlugin(), nanny=True)


@pytest.mark.timeout(180)
def test_hpcsched_worker_nworkers_runs_nanny_plugins_in_its_process(procs, tmp_path):  # noqa: F811
    log = tmp_path / "log"
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    sup = procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file",
                       str(sfile), "--nworkers", "2", "--name", "job", *WORKER_OPTS], "workers")
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
        before = worker_view(client)
        client.register_plugin(Recorder(str(log), "env", "two"), name="env")
        after = wait_until(lambda: settled(client, 2, "two"), timeout=60,
                           what="the workers in the plugin's environment")
        assert sorted(v[0] for v in after.values()) == ["job-0", "job-1"]
        assert not {v[1] for v in after.values()} & {v[1] for v in before.values()}
        # setup ran in the supervising process, once per worker process
        assert sorted(lines(log, "setup", "env")) == [("job-0", sup.pid), ("job-1", sup.pid)]
        client.unregister_worker_plugin("env", nanny=True)
        assert sorted(lines(log, "teardown", "env")) == [("job-0", sup.pid), ("job-1", sup.pid)]
        # the supervisor still ends with its workers
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) is not None, procs.log("workers")



@pytest.mark.timeout(120)
def test_upload_directory_reaches_each_nanny_and_the_workers_path(tmp_path):
    src = tmp_path / "mylib"
    (src / "tests").mkdir(parents=True)
    (src / "nanny_uploaded_mod.py").write_text("VALUE = 42\n")
    (src / "tests" / "skipped.py").write_text("")
    plugin = UploadDirectory(str(src), restart=True, update_path=True)
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        client.register_plugin(plugin, name="upload")
        (nanny,) = cluster.nannies.values()
        where = Path(nanny.directory()) / "mylib"
        assert sorted(p.name for p in where.iterdir()) == ["nanny_uploaded_mod.py"]
        # the restarted worker imports it; the cluster's own path (tests.*) is kept
        assert set(client.run(lambda: __import__("nanny_uploaded_mod").VALUE).values()) == {42}
        assert client.submit(inc, 1).result(30) == 2
    assert not where.exists()  # the nanny's temporary directory went with it
