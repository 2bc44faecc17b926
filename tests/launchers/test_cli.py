"""The command line, as a user on a login node runs it: real ``hpcsched`` processes.

``hpcsched scheduler --scheduler-file F`` and ``hpcsched worker --scheduler-file
F`` started as subprocesses, a Client joining through the file; every process a
test starts is killed in ``finally``.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from hpcsched.core.client.client import Client, read_scheduler_file
from hpcsched.core.comm import hosts
from tests.conftest import wait_until, worker_env
from tests.launchers.procs import HPCSCHED, WORKER_OPTS, hpcsched_cmd, inc, start_scheduler


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def n_workers(client: Client) -> int:
    return len(client.scheduler_info()["workers"])


# ---------------------------------------------------------------- tests
@pytest.mark.timeout(90)
def test_scheduler_file_workers_and_a_client(procs, tmp_path):
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    assert stat.S_IMODE(os.stat(sfile).st_mode) == 0o600
    address, security = read_scheduler_file(str(sfile))
    assert address.startswith("tcp://127.0.0.1:")
    assert security is not None and security.secret
    assert security.secret_hex() not in procs.log("scheduler")  # never printed
    for i in range(2):
        procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file", str(sfile),
                     "--name", f"cli-{i}", *WORKER_OPTS], f"worker-{i}")
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(2, timeout=30)
        names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
        assert names == ["cli-0", "cli-1"]
        assert sum(client.gather(client.map(inc, range(100)), timeout=30)) == 5050
        # the dashboard's link, with its token, is printed for whoever started the scheduler
        assert client.dashboard_link.startswith("http://127.0.0.1:")
        assert f"dashboard at {client.dashboard_link}" in procs.log("scheduler")
    # worker processes do not carry the secret on their command line
    for p in procs.procs:
        assert security.secret_hex() not in " ".join(map(str, p.args))


@pytest.mark.timeout(90)
def test_without_host_the_scheduler_listens_everywhere_and_names_a_routable_address(
        procs, tmp_path):
    """As ``dask scheduler``: a worker on another node reaches the address in the file."""
    sfile = tmp_path / "scheduler.json"
    port = free_port()
    p = procs.start([*hpcsched_cmd(), "scheduler", "--port", str(port),
                     "--scheduler-file", str(sfile)], "scheduler")
    wait_until(lambda: sfile.exists() or p.poll() is not None, timeout=30,
               what="the scheduler file")
    assert p.poll() is None, procs.log("scheduler")
    address, security = read_scheduler_file(str(sfile))
    expected = hosts.routable_address()
    if expected is None:
        pytest.skip("this machine has no address but loopback")
    assert address == f"tcp://{expected}:{port}", procs.log("scheduler")
    # every interface: a worker given loopback joins as well as one reading the file
    procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file", str(sfile),
                 "--name", "by-file", *WORKER_OPTS], "worker-file")
    procs.start([sys.executable, "-m", "hpcsched", "worker", f"tcp://127.0.0.1:{port}",
                 "--name", "by-loopback", *WORKER_OPTS], "worker-lo",
                env={"HPCSCHED_SECRET": security.secret_hex()})
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(2, timeout=30)
        workers = client.scheduler_info()["workers"]
        assert sorted(w["name"] for w in workers.values()) == ["by-file", "by-loopback"]
        # each worker names the address it reaches the scheduler from
        by_name = {w["name"]: a for a, w in workers.items()}
        assert by_name["by-file"].startswith(f"tcp://{expected}:")
        assert by_name["by-loopback"].startswith("tcp://127.0.0.1:")
        assert sum(client.gather(client.map(inc, range(50)), timeout=30)) == 1275


@pytest.mark.timeout(90)
def test_a_worker_started_before_its_scheduler_waits_for_the_scheduler_file(procs, tmp_path):
    """As dask-worker: a worker job may start before the scheduler's job writes the file;
    it waits for it (up to --death-timeout), and one whose file never comes says which."""
    sfile = tmp_path / "scheduler.json"
    worker = procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file",
                          str(sfile), "--name", "early", *WORKER_OPTS], "worker")
    never = procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file",
                         str(tmp_path / "never.json"), "--death-timeout", "1s", *WORKER_OPTS],
                        "never")
    assert never.wait(timeout=60) != 0
    assert "never.json did not appear" in procs.log("never")
    assert worker.poll() is None, procs.log("worker")  # still waiting for its file
    start_scheduler(procs, sfile)
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(1, timeout=30)
        assert [w["name"] for w in client.scheduler_info()["workers"].values()] == ["early"]
        assert client.submit(inc, 1).result(timeout=30) == 2


@pytest.mark.timeout(60)
def test_worker_to_an_address_where_nothing_listens_exits_with_the_address(procs):
    address = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    p = procs.start([sys.executable, "-m", "hpcsched", "worker", address, "--death-timeout", "2",
                     *WORKER_OPTS], "lonely")
    code = p.wait(30)
    assert code != 0
    assert time.monotonic() - t0 < 20
    assert address in procs.log("lonely")


@pytest.mark.timeout(90)
def test_nworkers_starts_named_workers_and_sigterm_ends_them(procs, tmp_path):
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    parent = procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file",
                          str(sfile), "--nworkers", "2", "--name", "grp", *WORKER_OPTS],
                         "workers")
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(2, timeout=30)
        names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
        assert names == ["grp-0", "grp-1"]
        assert client.submit(inc, 1).result(timeout=30) == 2
        parent.send_signal(signal.SIGTERM)
        parent.wait(20)
        wait_until(lambda: n_workers(client) == 0, timeout=20, what="the workers to leave")


@pytest.mark.timeout(90)
def test_sigterm_to_the_scheduler_ends_it_and_its_workers(procs, tmp_path):
    sfile = tmp_path / "scheduler.json"
    sched = start_scheduler(procs, sfile)
    workers = [procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file",
                            str(sfile), *WORKER_OPTS], f"w{i}") for i in range(2)]
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(2, timeout=30)
        sched.send_signal(signal.SIGTERM)
        assert sched.wait(20) == 0
        for w in workers:
            w.wait(20)
        assert not sfile.exists()  # the scheduler removes its file
        wait_until(lambda: client.status != "running", timeout=10,
                   what="the client to notice the scheduler left")


@pytest.mark.timeout(120)
def test_a_worker_retires_after_a_lifetime_written_as_dask_writes_it(procs, tmp_path):
    """``--lifetime 00:00:04 --lifetime-stagger 500ms``: the worker leaves gracefully, its
    process ends with 0, no sooner than its lifetime less the stagger."""
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    t0 = time.monotonic()
    worker = procs.start([*hpcsched_cmd(), "worker", "--scheduler-file", str(sfile),
                          "--name", "mortal", "--lifetime", "00:00:04",
                          "--lifetime-stagger", "500ms", *WORKER_OPTS], "mortal")
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(1, timeout="30s")
        assert client.submit(inc, 1).result(timeout="30s") == 2
        assert worker.wait(60) == 0, procs.log("mortal")
        assert time.monotonic() - t0 >= 3.5
        wait_until(lambda: n_workers(client) == 0, timeout=20, what="the worker to leave")


def test_dask_jobqueues_lifetime_idiom_reaches_the_worker_as_in_dask_jobqueue():
    """dask-jobqueue's documentation: ``worker_extra_args=["--lifetime", "55m",
    "--lifetime-stagger", "4m"]`` retires workers 55 +- 4 minutes into their job; they come
    after the options the cluster derives from its walltime, so they win."""
    from hpcsched.jobqueue import SLURMCluster
    from hpcsched.launchers.cli import worker_parser

    extra = ["--lifetime", "55m", "--lifetime-stagger", "4m"]
    with SLURMCluster(cores=1, memory="1GB", walltime="01:00:00",
                      worker_extra_args=extra) as cluster:
        line = next(ln for ln in cluster.job_script().splitlines() if " worker " in ln)
    argv = shlex.split(line)
    args = worker_parser().parse_args(argv[argv.index("worker") + 1:])
    assert (args.lifetime, args.lifetime_stagger) == (3300.0, 240.0)


@pytest.mark.timeout(90)
def test_a_clients_shutdown_ends_the_scheduler_and_its_workers(procs, tmp_path):
    """``Client.shutdown()``, as distributed's: the scheduler closes its workers and exits."""
    sfile = tmp_path / "scheduler.json"
    sched = start_scheduler(procs, sfile)
    workers = [procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file",
                            str(sfile), *WORKER_OPTS], f"w{i}") for i in range(2)]
    bystander = Client(str(sfile), set_as_default=False)
    try:
        with Client(str(sfile), set_as_default=False) as client:
            client.wait_for_workers(2, timeout=30)
            assert client.submit(inc, 1).result(timeout=30) == 2
            client.shutdown()
            assert client.status == "closed"
        assert sched.wait(20) == 0
        for w in workers:
            w.wait(20)
        assert not sfile.exists()
        # another client of the cluster hears that it ended
        wait_until(lambda: bystander.status != "running", timeout=10,
                   what="the other client to notice the scheduler left")
    finally:
        bystander.close()


def test_help_and_usage_errors(procs):
    out = subprocess.run([*hpcsched_cmd(), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "hpcsched scheduler" in out.stdout
    out = subprocess.run([sys.executable, "-m", "hpcsched", "worker"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode != 0 and "--scheduler-file" in out.stderr
    out = subprocess.run([sys.executable, "-m", "hpcsched", "worker", "tcp://127.0.0.1:1",
                          "--resources", "GPU"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "GPU" in out.stderr
    out = subprocess.run([sys.executable, "-m", "hpcsched", "worker", "tcp://127.0.0.1:1",
                          "--lifetime", "55 minutes"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode != 0 and "--lifetime" in out.stderr and "55 minutes" in out.stderr


@pytest.mark.parametrize("args", [["--version"], ["worker", "--version"],
                                  ["scheduler", "--version"]])
def test_every_entry_point_prints_its_version(args):
    import hpcsched

    commands = [[sys.executable, "-m", "hpcsched", *args]]
    if HPCSCHED:
        commands.append([HPCSCHED, *args])
    for cmd in commands:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().startswith(f"hpcsched {hpcsched.__version__}"), out


# a worker preload as dask's documentation writes one: ``dask_setup(worker)`` sets state up
PRELOAD = """
SET_UP = []

def dask_setup(worker):
    SET_UP.append(worker.name)
"""


def preloaded(module):
    import sys

    return sys.modules[module].SET_UP  # loaded at the worker's start, not by this task


@pytest.mark.timeout(90)
def test_worker_preload_by_module_name_and_by_path(procs, tmp_path):
    """``hpcsched worker --preload mymodule`` (on the workers' path), and a ``.py`` file."""
    (tmp_path / "cli_preload_mod.py").write_text(PRELOAD)
    (tmp_path / "cli_preload_file.py").write_text(PRELOAD)
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    path = os.pathsep.join([str(tmp_path), worker_env()["PYTHONPATH"]])
    procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file", str(sfile),
                 "--name", "by-name", "--preload", "cli_preload_mod", *WORKER_OPTS],
                "worker-name", env={"PYTHONPATH": path})
    procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file", str(sfile),
                 "--name", "by-path", "--preload", str(tmp_path / "cli_preload_file.py"),
                 "--preload", "cli_preload_mod", *WORKER_OPTS], "worker-path", cwd=str(tmp_path))
    with Client(str(sfile), set_as_default=False) as client:
        client.wait_for_workers(2, timeout=30)
        by_name = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        assert client.submit(preloaded, "cli_preload_mod", workers=[by_name["by-name"]],
                             pure=False).result(timeout=30) == ["by-name"]
        assert client.run(preloaded, "cli_preload_file", workers=[by_name["by-path"]]) == \
            {by_name["by-path"]: ["by-path"]}


@pytest.mark.timeout(60)
def test_worker_with_a_failing_preload_names_it_and_exits(procs, tmp_path):
    (tmp_path / "cli_bad_preload.py").write_text(
        "def dask_setup(worker):\n    raise ValueError('no licence server')\n")
    sfile = tmp_path / "scheduler.json"
    start_scheduler(procs, sfile)
    p = procs.start([sys.executable, "-m", "hpcsched", "worker", "--scheduler-file", str(sfile),
                     "--preload", str(tmp_path / "cli_bad_preload.py"), *WORKER_OPTS], "bad")
    assert p.wait(30) != 0
    assert "cli_bad_preload.py': dask_setup failed: ValueError: no licence server" \
        in procs.log("bad")
