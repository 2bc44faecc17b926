"""``memory_limit`` means the same at every entry point that starts workers.

The same value, written as a user writes it to ``LocalCluster``, ``hpcsched worker``,
``python -m hpcsched`` (under mpiexec), ``hpcsched.initialize()`` and a batch cluster
(``worker_extra_args``, rendered into its job script), gives the worker the same limit
in bytes: ``"4GB"`` and ``4e9`` are four billion bytes, ``0.5`` half the machine's
memory, ``None`` no limit (0). Each entry point reads the value with its own option
parsing; where a worker is cheap to start (LocalCluster, the command line) it is
started and the scheduler asked what it got.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcsched.hpc import bootstrap, command
from hpcsched.hpc.initialize_options import InitOptions, resolve
from hpcsched.jobqueue.clusters import SLURMCluster
from hpcsched.launchers import cli
from hpcsched.launchers.local_cluster import LocalCluster
from hpcsched.launchers.resources import machine_memory
from tests.conftest import worker_env

VALUES = ["4GB", 4e9, 0.5, None]


def expected(value: object) -> int:
    return {"4GB": 4 * 10**9, 4e9: 4 * 10**9, 0.5: machine_memory() // 2, None: 0}[value]


def only_worker(cluster: LocalCluster) -> dict:
    cluster.wait_for_workers(1, timeout=60)
    (info,) = cluster.scheduler_info_workers().values()
    return info


def local_cluster(value: object, tmp: Path) -> int:
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=value,
                      dashboard_address=None, worker_env=worker_env()) as cluster:
        return only_worker(cluster)["memory_limit"]


def worker_cli(value: object, tmp: Path) -> int:
    """``hpcsched worker ADDRESS --memory-limit VALUE``, a real process."""
    with LocalCluster(n_workers=0, dashboard_address=None) as cluster:
        assert cluster.security is not None
        env = {**worker_env(), "HPCSCHED_SECRET": cluster.security.secret_hex()}
        with open(tmp / "worker.log", "wb") as log:
            p = subprocess.Popen(
                [sys.executable, "-m", "hpcsched", "worker", cluster.scheduler_address,
                 "--nthreads", "1", "--memory-limit", str(value)],
                env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        try:
            return only_worker(cluster)["memory_limit"]
        finally:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def mpi_command_line(value: object, tmp: Path) -> int:
    """``python -m hpcsched --memory-limit VALUE script.py``: what a worker rank starts."""
    script = tmp / "script.py"
    script.write_text("")
    ns = command._parse(["--nthreads", "1", "--memory-limit", str(value), str(script)])
    options = InitOptions(nthreads=ns.nthreads, memory_limit=ns.memory_limit)
    return bootstrap.rank_resources(options)[1]


def initialize(value: object, tmp: Path) -> int:
    """``hpcsched.initialize(memory_limit=VALUE)``: what a worker rank starts."""
    return bootstrap.rank_resources(resolve(nthreads=1, memory_limit=value))[1]


def batch_cluster(value: object, tmp: Path) -> int:
    """The worker command of a SLURM job script, read by the command line's own parser."""
    with SLURMCluster(cores=1, processes=1, memory="8GB", log_directory=str(tmp),
                      worker_extra_args=["--memory-limit", str(value)]) as cluster:
        script = cluster.job_script()
    (line,) = [ln for ln in script.splitlines() if " -m hpcsched worker " in ln]
    argv = shlex.split(line)
    args = cli.worker_parser().parse_args(argv[argv.index("worker") + 1:])
    assert argv.count("--memory-limit") == 1, line
    return cli.worker_resources(args)[1]


ENTRY_POINTS: list[Callable[[object, Path], int]] = [
    local_cluster, worker_cli, mpi_command_line, initialize, batch_cluster]


@pytest.mark.parametrize("value", VALUES, ids=repr)
@pytest.mark.parametrize("entry_point", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_memory_limit_means_the_same_at_every_entry_point(entry_point, value, tmp_path):
    assert entry_point(value, tmp_path) == expected(value)


def test_a_batch_jobs_memory_is_shared_by_its_workers_in_the_same_units():
    """Without a worker option, each worker gets ``memory / processes``; ``memory`` reads
    as ``memory_limit`` reads sizes (``"4GB"`` and ``4e9`` alike)."""
    for memory in ("8GB", 8e9):
        with SLURMCluster(cores=2, processes=2, memory=memory) as cluster:
            assert " --memory-limit 4GB " in cluster.job_script()


def test_auto_splits_the_machine_among_the_workers_of_one_command(monkeypatch):
    from hpcsched.launchers import resources

    monkeypatch.setattr(resources, "machine_memory", lambda: 64 * 10**9)
    monkeypatch.setattr(resources, "_machine_cpus", lambda: 8)
    args = cli.worker_parser().parse_args(["tcp://h:1", "--nworkers", "4"])
    assert cli.worker_resources(args) == (8, 16 * 10**9)


def test_a_bad_memory_limit_is_refused_by_every_entry_point(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("")
    for parse in (lambda v: command._parse(["--memory-limit", v, str(script)]),
                  lambda v: cli.worker_main(["tcp://h:1", "--memory-limit", v])):
        with pytest.raises(SystemExit):
            parse("lots")
    with pytest.raises(ValueError, match="memory_limit"):
        resolve(memory_limit="lots")
    with pytest.raises(ValueError, match="memory_limit"):
        LocalCluster(n_workers=0, memory_limit="lots")
