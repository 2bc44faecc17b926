"""The settings classes are the configuration's keys (:mod:`hpcsched.core.settings`).

Each field names its key, and its default is that key's in ``config.DEFAULTS``; every
key of the scheduler's, the worker's, the client's and MPI mode's sections is a field.
A value reaches the component that decides with it by each road, each winning over the
one before: a YAML file < an ``HPCSCHED_*`` variable < a keyword argument.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from hpcsched.core import config
from hpcsched.core.client.heartbeat import SchedulerWatch
from hpcsched.core.scheduler.server import Scheduler
from hpcsched.core.settings import (
    SETTINGS,
    ClientSettings,
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

#: the sections whose every key is a field of a settings class
SECTIONS = ("scheduler.", "worker.", "client.", "mpi.")


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


def test_every_key_of_the_settings_sections_is_a_field():
    fields = {key for cls in SETTINGS for key in config_keys(cls).values()}
    assert {k for k in config.DEFAULTS if k.startswith(SECTIONS)} == fields


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


def test_two_fields_of_one_key_share_its_value():
    """The worker sends heartbeats at ``worker.heartbeat-interval``; the scheduler state
    starts its workers' interval there."""
    assert config_keys(WorkerSettings)["heartbeat_interval"] == \
        config_keys(SchedulerSettings)["heartbeat_interval"]
    assert WorkerSettings().heartbeat_interval == SchedulerSettings().heartbeat_interval


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
        return Worker("inproc://nowhere", **kw).death_timeout

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
    lives = {Worker("inproc://nowhere", lifetime="55m", lifetime_stagger="4m").lifetime
             for _ in range(20)}
    assert all(51 * 60 <= life <= 59 * 60 for life in lives)
    assert len(lives) > 1  # staggered
    assert Worker("inproc://nowhere", lifetime="00:30:00").lifetime == 1800.0


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
