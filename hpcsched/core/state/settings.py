"""The state machines' settings and their defaults, written once; how a field names its key.

A settings class is a frozen record (:class:`~hpcsched.core.protocol.records.Record`,
whose class costs microseconds to define where a dataclass compiles its methods: every
process reads settings at its start) whose fields are configuration keys: the field
``worker_saturation`` of a class whose ``SECTION`` is ``"scheduler"`` is the key
``scheduler.worker-saturation`` (``_`` becomes ``-``), unless :func:`setting` names
another key, or none (``key=None``: a value only code gives, such as a seed). The defaults
of :data:`hpcsched.core.config.DEFAULTS` are these classes' defaults, and
:func:`hpcsched.core.config.read` builds a class from the configuration; nothing else
writes a key's default.

:class:`SchedulerSettings` holds the numbers :class:`~.scheduler_state.SchedulerState`
decides with. Values are parsed (bytes as an int, not ``"1 MiB"``; seconds as a float,
not ``"5m"``): a field whose ``unit`` is ``"bytes"`` or ``"seconds"`` is parsed as the
configuration is read (:mod:`hpcsched.core.units`).

    >>> SchedulerSettings().queue_block_bytes
    1048576
    >>> config_keys(SchedulerSettings)["bandwidth"]
    'scheduler.default-bandwidth'
    >>> SchedulerSettings(rootish_policy="round-robin")
    Traceback (most recent call last):
    ...
    ValueError: scheduler.rootish-policy must be queue, co-assign or mars, not 'round-robin'
"""

from __future__ import annotations

from typing import Any, ClassVar

from hpcsched.core.protocol.records import NODEFAULT, Field, Record, fields

ROOTISH_POLICIES = ("queue", "co-assign", "mars")

_NAMED = "named"  # the key follows the naming rule


class Setting(Field):
    """A declared field of a settings class: a record's field with its configuration
    ``key`` and ``unit`` (see :func:`setting`)."""

    __slots__ = ("key", "unit")

    def __init__(self, default: Any, factory: Any, key: str | None, unit: str | None):
        super().__init__("plain", default=default, factory=factory)
        self.key, self.unit = key, unit


def setting(default: Any = NODEFAULT, *, key: str | None = _NAMED, unit: str | None = None,
            default_factory: Any = NODEFAULT) -> Any:
    """A field of a settings class: its ``key`` (by default ``SECTION.field-name``; None:
    not a configuration key) and the ``unit`` its text is read in (``"bytes"``, or
    ``"seconds"``: a duration, 0 allowed)."""
    return Setting(default, default_factory, key, unit)


def config_keys(cls: type) -> dict[str, str]:
    """``{field name: configuration key}`` of a settings class's configured fields."""
    out = {}
    for f in fields(cls):
        key = getattr(f, "key", _NAMED)
        if key == _NAMED:
            key = f"{cls.SECTION}.{f.name.replace('_', '-')}"  # type: ignore[attr-defined]
        if key is not None:
            out[f.name] = key
    return out


def unit_of(cls: type, name: str) -> str | None:
    """The unit the field ``name`` of ``cls`` is written in, if any (``"bytes"``,
    ``"seconds"``)."""
    return next(getattr(f, "unit", None) for f in fields(cls) if f.name == name)


class SchedulerSettings(Record):
    """What the scheduler state decides with (see ``scheduler.*`` in the configuration)."""

    SECTION: ClassVar[str] = "scheduler"

    #: a worker holds at most ceil(saturation x threads) tasks under queuing (inf: no queue)
    worker_saturation: float = 1.1
    #: queue | co-assign | mars (queue needs a finite saturation)
    rootish_policy: str = "queue"
    #: a TaskGroup larger than factor x the cluster's threads is root-ish ...
    rootish_factor: float = 2
    #: ... if it has fewer than this many distinct dependencies
    rootish_max_deps: int = 5
    #: queued root-ish tasks a worker takes as one run (:mod:`.blocks`); 1: off
    queue_block_size: int = 4
    #: ... of results at most (the group's mean result size), in bytes ("1 MiB", "64 kB")
    queue_block_bytes: int = setting(2**20, unit="bytes")
    #: workers a task may kill before it is marked erred
    allowed_failures: int = 3
    #: seconds a task is thought to take before anything of its group was measured
    unknown_task_duration: float = setting(0.5, unit="seconds")
    #: bytes/s between workers, before anything is measured
    bandwidth: float = setting(100e6, key="scheduler.default-bandwidth")
    #: idle workers take queued work from busy ones when it is worth more than a round trip
    work_stealing: bool = True
    #: seconds without a heartbeat before a worker is removed (None: never); the server
    #: sets it from ``scheduler.worker-ttl`` for transports that need heartbeats
    worker_ttl: float | None = setting(None, key=None, unit="seconds")
    #: seconds between a worker's heartbeats in a small cluster; it grows with the
    #: cluster, within the TTL (:mod:`.liveness`). The server sets it from the worker's
    #: key, ``worker.heartbeat-interval``, whose default this is
    heartbeat_interval: float = setting(1.0, key=None)
    #: seconds a task may wait with no worker able to run it (its restrictions meet none)
    #: before it fails with NoValidWorkerError (None: it waits for one), as
    #: distributed.scheduler.no-workers-timeout; MPI mode, whose workers are fixed, sets it
    no_workers_timeout: float | None = setting(None, unit="seconds")
    #: seconds a graceful retirement (or a rebalance) may take before it is forced
    retire_timeout: float = setting(120.0, key=None, unit="seconds")
    #: transitions kept in ``transition_log``, as distributed's ``low-level-log-length``
    transition_log_length: int = setting(1000, key=None)
    #: communicators a worker keeps for the member sets of gangs (``ranks=N``) that may
    #: run again (:class:`~.tasks.GangComms`); MPI has a few thousand context ids per rank
    gang_comms_per_worker: int = setting(16)
    seed: int = setting(0, key=None)

    def __post_init__(self) -> None:
        if self.rootish_policy not in ROOTISH_POLICIES:
            raise ValueError(f"scheduler.rootish-policy must be queue, co-assign or mars, "
                             f"not {self.rootish_policy!r}")
