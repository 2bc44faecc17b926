"""The settings classes are the configuration's keys (:mod:`hpcsched.core.settings`).

Each field names its key, and its default is that key's in ``config.DEFAULTS``; every
key of ``config.DEFAULTS`` is exactly one field, and every key the package reads by its
text is one of them. A value reaches the component that decides with it by each road,
each winning over the one before: a YAML file < an ``HPCSCHED_*`` variable < a keyword
argument.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import pytest

from hpcsched.core import config
from hpcsched.core.client.connection import SchedulerWatch
from hpcsched.core.scheduler.server import Scheduler
from hpcsched.core.settings import (
    SETTINGS,
    AdaptiveSettings,
    AdminSettings,
    ClientSettings,
    CommSettings,
    DashboardSettings,
    JobQueueSettings,
    MPISettings,
    SchedulerServerSettings,
    SchedulerSettings,
    WorkerSettings,
)
from hpcsched.core.state.settings import config_keys, unit_of
from hpcsched.core.units import parse_bytes, parse_interval
from hpcsched.core.worker.memory import MemoryLimits
from hpcsched.core.worker.server import Worker
from hpcsched.hpc.backoff import Backoff

PACKAGE = Path(__file__).resolve().parents[2] / "hpcsched"


def write_yaml(directory: Any, text: str) -> None:
    """A configuration file where every process looks (``~/.config/hpcsched/``; the
    ``clean_config`` fixture's directory is the home), read from the next ``get``."""
    home = directory / ".config" / "hpcsched"
    home.mkdir(parents=True, exist_ok=True)
    (home / "test.yaml").write_text(text)
    config.refresh()


# ---------------------------------------------------------------- one home per key
def test_every_field_has_its_key_and_default_in_the_defaults():
    for cls in SETTINGS:
        defaults = cls()
        for name, key in config_keys(cls).items():
            assert key in config.DEFAULTS, f"{cls.__name__}.{name}: no {key} in DEFAULTS"
            assert config.DEFAULTS[key] == getattr(defaults, name), f"{cls.__name__}.{name}"


def test_every_key_of_the_defaults_is_exactly_one_field():
    owners: dict[str, list[str]] = {}
    for cls in SETTINGS:
        for name, key in config_keys(cls).items():
            owners.setdefault(key, []).append(f"{cls.__name__}.{name}")
    assert set(owners) == set(config.DEFAULTS)
    assert {k: v for k, v in owners.items() if len(v) > 1} == {}


def _literal_keys_read() -> dict[str, list[str]]:
    """``{key: [file:line, ...]}`` of every ``config.get("...")`` and
    ``config.get_prefix("...")`` in the package whose key is written as text."""
    out: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "config" \
                    and node.func.attr == "get" and node.args \
                    and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                out.setdefault(node.args[0].value, []).append(where)
    return out


def test_every_key_the_package_reads_by_its_text_is_a_key_of_the_defaults():
    read = _literal_keys_read()
    assert {k: v for k, v in read.items() if k not in config.DEFAULTS} == {}


def test_the_scan_of_the_keys_read_by_text_finds_a_call(tmp_path: Any, monkeypatch: Any):
    """The scan above sees a ``config.get`` of a key written as text (it would pass on a
    package with none)."""
    package = tmp_path / "hpcsched"
    package.mkdir()
    (package / "m.py").write_text('from hpcsched.core import config\n'
                                  'x = config.get("no.such-key")\n'
                                  'import dask\ny = dask.config.get("scheduler")\n')
    monkeypatch.setattr(f"{__name__}.PACKAGE", package)
    assert _literal_keys_read() == {"no.such-key": ["hpcsched/m.py:2"]}


def test_a_field_names_its_key_by_the_rule_unless_it_says_otherwise():
    assert config_keys(WorkerSettings)["death_timeout"] == "worker.death-timeout"
    assert config_keys(MPISettings)["poll_fast_max"] == "mpi.poll-fast-max"
    assert config_keys(SchedulerServerSettings)["journal_client_grace"] == \
        "scheduler.journal-client-grace"
    # named explicitly: a key of another section, or a name the field does not follow
    assert config_keys(SchedulerSettings)["bandwidth"] == "scheduler.default-bandwidth"
    assert config_keys(WorkerSettings)["memory_pause"] == "worker.memory.pause"
    assert config_keys(ClientSettings)["fuse"] == "scheduler.fuse"
    # values only code gives are no keys
    assert {"seed", "worker_ttl", "retire_timeout"}.isdisjoint(config_keys(SchedulerSettings))


def test_a_key_read_by_two_components_is_one_field_whose_default_the_other_shares():
    """The worker sends heartbeats at ``worker.heartbeat-interval``; the scheduler server
    starts its state's interval for its workers there (:func:`test_the_heartbeat_...`)."""
    assert config_keys(WorkerSettings)["heartbeat_interval"] == "worker.heartbeat-interval"
    assert "heartbeat_interval" not in config_keys(SchedulerSettings)
    assert WorkerSettings().heartbeat_interval == SchedulerSettings().heartbeat_interval


def test_the_sections_beside_the_components_are_read_as_classes(
        clean_config: Any, monkeypatch: pytest.MonkeyPatch):
    """The transport's, the dashboard's, the garbage collector's, adaptive scaling's and
    the batch systems' keys are fields too, read by YAML, environment and keyword."""
    write_yaml(clean_config,
               "comm:\n  timeouts:\n    connect: 12\n  max-frame-bytes: 1 MiB\n"
               "diagnostics:\n  dashboard:\n    address: null\n"
               "adaptive:\n  interval: 2s\njobqueue:\n  submit-retry-delays: [1s, 2s]\n")
    monkeypatch.setenv("HPCSCHED_ADMIN__GC_THRESHOLD", "null")
    monkeypatch.setenv("HPCSCHED_JOBQUEUE__POLL_INTERVAL", "3")
    comm = config.read(CommSettings)
    assert (comm.connect_timeout, comm.max_frame_bytes, comm.handshake_timeout) == \
        (12, 2**20, 5.0)
    assert config.read(CommSettings, connect_timeout=1.5).connect_timeout == 1.5
    assert config.read(DashboardSettings).address is None
    assert config.read(DashboardSettings).refresh == 0.5
    assert config.read(AdminSettings).gc_threshold is None
    assert config.read(AdaptiveSettings).interval == 2.0  # durations read as dask writes them
    jobs = config.read(JobQueueSettings)
    assert (jobs.submit_retry_delays, jobs.poll_interval) == (["1s", "2s"], 3)


def test_read_gives_what_get_gives_for_every_key(clean_config: Any):
    write_yaml(clean_config,
               "scheduler:\n  worker-saturation: 2.5\n  journal-compact-bytes: 1 MiB\n"
               "worker:\n  memory:\n    pause: 0.5\n  death-timeout: 2m\nmpi:\n  rank-timeout: 0\n")
    for cls in SETTINGS:
        settings = config.read(cls)
        for name, key in config_keys(cls).items():
            want = config.get(key)
            if unit_of(cls, name) == "bytes":
                want = parse_bytes(want)
            elif unit_of(cls, name) == "seconds" and want is not None:
                want = parse_interval(want, zero=True)
            assert getattr(settings, name) == want, key
    assert config.read(SchedulerServerSettings).journal_compact_bytes == 2**20
    assert config.read(WorkerSettings).memory_pause == 0.5
    assert config.read(WorkerSettings).death_timeout == 120.0


# ---------------------------------------------------------------- the roads, in order
def saturation(**kw: Any) -> float:
    """The worker saturation a Scheduler built now places with (not started)."""
    return Scheduler("inproc://", **kw).state.placement.worker_saturation


def test_worker_saturation_reaches_placement_by_yaml_env_and_keyword(
        clean_config: Any, monkeypatch: pytest.MonkeyPatch):
    assert saturation() == 1.1
    write_yaml(clean_config, "scheduler:\n  worker-saturation: 2.0\n")
    assert saturation() == 2.0
    monkeypatch.setenv("HPCSCHED_SCHEDULER__WORKER_SATURATION", "inf")
    assert saturation() == math.inf
    assert saturation(worker_saturation=3.0) == 3.0
    with config.set({"scheduler.worker-saturation": 4.0}):
        assert saturation() == 4.0
        assert saturation(worker_saturation=5.0) == 5.0


def test_a_size_is_read_in_bytes_by_every_road(clean_config: Any,
                                              monkeypatch: pytest.MonkeyPatch):
    def block_bytes(**kw: Any) -> int:
        return Scheduler("inproc://", **kw).state.placement.blocks.max_bytes

    assert block_bytes() == 2**20
    write_yaml(clean_config, "scheduler:\n  queue-block-bytes: 64 kB\n")
    assert block_bytes() == 64_000
    monkeypatch.setenv("HPCSCHED_SCHEDULER__QUEUE_BLOCK_BYTES", "4MiB")
    assert block_bytes() == 4 * 2**20
    assert block_bytes(queue_block_bytes="2 kB") == 2000


def test_a_duration_is_read_in_seconds_by_every_road(clean_config: Any,
                                                    monkeypatch: pytest.MonkeyPatch):
    """dask's strings ("2m", "1h30m", "00:30:00") wherever seconds are asked for."""
    def death_timeout(**kw: Any) -> float:
        return Worker("inproc://nowhere", **kw).settings.death_timeout

    assert death_timeout() == 60.0
    write_yaml(clean_config, "worker:\n  death-timeout: 2m\n")
    assert death_timeout() == 120.0
    monkeypatch.setenv("HPCSCHED_WORKER__DEATH_TIMEOUT", "00:01:30")
    assert death_timeout() == 90.0
    assert death_timeout(death_timeout="45s") == 45.0
    monkeypatch.setenv("HPCSCHED_COMM__TIMEOUTS__CONNECT", "1h30m")
    assert config.seconds("comm.timeouts.connect") == 5400.0
    assert config.seconds("comm.timeouts.connect", "5s") == 5.0
    monkeypatch.setenv("HPCSCHED_SCHEDULER__UNKNOWN_TASK_DURATION", "250ms")
    assert config.read(SchedulerSettings).unknown_task_duration == 0.25
    monkeypatch.setenv("HPCSCHED_MPI__EXIT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="mpi.exit-timeout"):
        config.read(MPISettings)


def test_a_worker_lifetime_as_dask_jobqueue_writes_it():
    """``--lifetime 55m --lifetime-stagger 4m``: retire between 51 and 59 minutes."""
    lives = {Worker("inproc://nowhere", lifetime="55m", lifetime_stagger="4m").heartbeats.lifetime
             for _ in range(20)}
    assert all(51 * 60 <= life <= 59 * 60 for life in lives)
    assert len(lives) > 1  # staggered
    assert Worker("inproc://nowhere", lifetime="00:30:00").heartbeats.lifetime == 1800.0


def test_the_heartbeat_interval_reaches_the_scheduler_state_and_the_worker(
        clean_config: Any, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HPCSCHED_WORKER__HEARTBEAT_INTERVAL", "2.5")
    assert Scheduler("inproc://").state.worker_events.base_interval == 2.5
    assert config.read(WorkerSettings).heartbeat_interval == 2.5


def test_worker_client_and_mpi_settings_reach_their_components(
        clean_config: Any, monkeypatch: pytest.MonkeyPatch):
    write_yaml(clean_config,
               "worker:\n  memory:\n    pause: 0.5\nclient:\n  heartbeat-interval: 7\n"
               "mpi:\n  poll-min: 0.0001\n")

    def watch(**kw: Any) -> SchedulerWatch:
        return SchedulerWatch("test", lambda: None, lambda reason: None, **kw)

    assert (MemoryLimits.from_config(1000).pause, watch().interval, Backoff().min) == \
        (0.5, 7.0, 0.0001)
    monkeypatch.setenv("HPCSCHED_WORKER__MEMORY__PAUSE", "false")
    monkeypatch.setenv("HPCSCHED_CLIENT__HEARTBEAT_INTERVAL", "8")
    monkeypatch.setenv("HPCSCHED_MPI__POLL_MIN", "0.0002")
    assert (MemoryLimits.from_config(1000).pause, watch().interval, Backoff().min) == \
        (None, 8.0, 0.0002)
    assert (MemoryLimits.from_config(1000, pause=0.75).pause, watch(interval=9).interval,
            Backoff(min=0.0003).min) == (0.75, 9.0, 0.0003)


# ---------------------------------------------------------------- errors as before
def test_a_bad_value_from_the_configuration_is_named_as_before(
        clean_config: Any, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HPCSCHED_SCHEDULER__ROOTISH_POLICY", "round-robin")
    with pytest.raises(ValueError, match="scheduler.rootish-policy must be queue, co-assign "
                                         "or mars, not 'round-robin'"):
        Scheduler("inproc://")
    monkeypatch.setenv("HPCSCHED_WORKER__MEMORY__PAUSE", "lots")
    with pytest.raises(ValueError, match="worker.memory.pause must be a fraction"):
        MemoryLimits.from_config(1000)
    with pytest.raises(TypeError):
        config.read(SchedulerSettings, no_such_knob=1)


def test_a_key_hpcsched_does_not_know_is_named_with_the_closest_known_one(
        clean_config: Any, monkeypatch: pytest.MonkeyPatch):
    """A typo in a YAML file or an ``HPCSCHED_*__*`` variable would do nothing: it is
    warned of, once, naming where it was and the key meant; known keys, a batch system's
    own section (its cluster's parameters, checked by the cluster) and the variables that
    are no settings (``HPCSCHED_SECRET``) are not."""
    write_yaml(clean_config, "scheduler:\n  worker-saturatoin: 2.0\n"
                             "jobqueue:\n  slurm:\n    cores: 4\n")
    monkeypatch.setenv("HPCSCHED_WORKER__DEATH_TIMEOUTT", "5")
    monkeypatch.setenv("HPCSCHED_CLIENT__PREFETCH_HELD_BYTES", "1000")
    monkeypatch.setenv("HPCSCHED_SECRET", "00")
    with pytest.warns(UserWarning) as record:
        assert saturation() == 1.1
        saturation()  # read again: no second warning
    said = sorted(str(w.message) for w in record)
    assert len(said) == 2, said
    assert "'scheduler.worker-saturatoin' (did you mean 'scheduler.worker-saturation'?)" \
        in said[1] and ".yaml" in said[1]
    assert said[0].startswith("environment variable HPCSCHED_WORKER__DEATH_TIMEOUTT") \
        and "'worker.death-timeout'" in said[0]
