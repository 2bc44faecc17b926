"""Configuration: defaults < YAML files < environment variables < keyword arguments.

Keys are dotted and hyphenated, as in ``scheduler.worker-saturation``.

* Defaults live in :data:`DEFAULTS` below: the one place that lists every knob.
* YAML files: every ``*.yaml`` / ``*.yml`` in ``~/.config/hpcsched/`` (sorted by
  name), then the file or directory named by ``HPCSCHED_CONFIG``. Nested
  mappings are flattened: ``{"scheduler": {"worker-saturation": 1.0}}``.
* Environment: ``HPCSCHED_SCHEDULER__WORKER_SATURATION=1.0`` sets
  ``scheduler.worker-saturation`` (``__`` separates levels, ``_`` stands for
  ``-``, case-insensitive). Values are parsed as YAML scalars (``inf``,
  ``true``, ``1.5``, ``[1, 2]``).
* Keyword arguments win: components call ``config.get(key, override)``, where an
  override that is not ``None`` is returned as is.

Example::

    >>> from hpcsched.core import config
    >>> config.get("scheduler.worker-saturation")
    1.1
    >>> with config.set({"scheduler.worker-saturation": float("inf")}):
    ...     config.get("scheduler.worker-saturation")
    inf
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from hpcsched.core.state.settings import SchedulerSettings

_SCHEDULER = SchedulerSettings()

DEFAULTS: dict[str, Any] = {
    # scheduling policies: the defaults of the scheduler state's settings
    # (hpcsched.core.state.settings, where each is described)
    "scheduler.worker-saturation": _SCHEDULER.worker_saturation,
    "scheduler.rootish-factor": _SCHEDULER.rootish_factor,
    "scheduler.rootish-max-deps": _SCHEDULER.rootish_max_deps,
    "scheduler.rootish-policy": _SCHEDULER.rootish_policy,
    "scheduler.queue-block-size": _SCHEDULER.queue_block_size,
    "scheduler.queue-block-bytes": _SCHEDULER.queue_block_bytes,  # or "1 MiB", "64 kB"
    "scheduler.allowed-failures": _SCHEDULER.allowed_failures,
    "scheduler.unknown-task-duration": _SCHEDULER.unknown_task_duration,
    "scheduler.default-bandwidth": _SCHEDULER.bandwidth,
    "scheduler.work-stealing": _SCHEDULER.work_stealing,
    "scheduler.work-stealing-interval": 0.1,  # seconds
    # seconds without heartbeat before a TCP worker is removed; the scheduler keeps its
    # workers' heartbeat interval at most a third of it (hpcsched.core.state.liveness)
    "scheduler.worker-ttl": 30.0,
    "scheduler.fuse": True,  # linear-chain fusion of graphs given to get/compute
    # higher layers attached to every scheduler: seam names (hpcsched.core.seams) or
    # module:factory entries, each called with the scheduler
    "scheduler.extensions": ["dashboard"],
    # the journal that lets a scheduler restart where it was (None: no journal); see
    # hpcsched/core/scheduler/journal.py
    "scheduler.journal": None,
    "scheduler.journal-fsync": False,  # fsync each loop turn's records (machine crashes)
    "scheduler.journal-compact-bytes": "64 MiB",  # compact past this and twice the live size
    # seconds a client the journal names has, after a restart, to come back for its keys
    "scheduler.journal-client-grace": 600.0,
    # seconds a restarted scheduler waits for the workers it had to come back before it
    # gives out work (one that came back early would otherwise recompute what another holds)
    "scheduler.journal-worker-grace": 10.0,
    # where results of tasks annotated checkpoint=True are kept (None: <journal>.checkpoints
    # when there is a journal, else nowhere); see hpcsched/core/scheduler/checkpoints.py
    "scheduler.checkpoint-directory": None,
    # diagnostics: dashboard and /metrics (host:port, ":8787" all interfaces, None: off)
    "diagnostics.dashboard.address": ":8787",
    "diagnostics.dashboard.refresh": 0.5,  # seconds: pages see snapshots at most this fresh
    # workers
    # in a small cluster; the scheduler lengthens it as its cluster grows
    "worker.heartbeat-interval": _SCHEDULER.heartbeat_interval,
    # threads of numerical libraries (OpenMP, OpenBLAS, MKL) per worker process that
    # LocalCluster starts, unless the environment sets them: a worker already runs one task
    # per thread, and each library otherwise starts one thread per core (dask's nanny does
    # the same through distributed.nanny.pre-spawn-environ). None leaves them alone.
    "worker.blas-threads": 1,
    "worker.transfer-incoming-count-limit": 4,
    # comms a worker keeps open to the peers it fetched from (the least recently used
    # beyond are closed): reused by the next fetch from the same peer
    "worker.peer-connections": 256,
    "worker.death-timeout": 60.0,  # seconds a worker tries to reach its scheduler
    # seconds a worker whose journaled scheduler vanished keeps its tasks and results and
    # tries to reconnect (the scheduler restarts with its journal); then it exits. 0, or a
    # scheduler without a journal: it exits at once
    "worker.scheduler-reconnect-timeout": 300.0,
    "worker.walltime-margin": 60.0,  # retire this long before the job's walltime ends
    "worker.walltime-stagger": 30.0,  # spread of retirements between workers of one job
    # memory management, with dask.distributed's names and defaults ("Worker Memory
    # Management" in its documentation). Fractions of the worker's memory_limit; false
    # turns a step off. target: results measured by sizeof above it spill to disk, least
    # recently used first; spill: process memory (RSS) above it spills until below target;
    # pause: process memory above it stops new tasks (and fetches) until it drops;
    # terminate: process memory above it makes a worker with a nanny restart (TCP); under
    # MPI, where a rank cannot be restarted, it ends the job with an error naming the rank
    # once nothing is left to spill
    "worker.memory.target": 0.6,
    "worker.memory.spill": 0.7,
    "worker.memory.pause": 0.8,
    "worker.memory.terminate": 0.95,
    "worker.memory.monitor-interval": 0.1,  # seconds between samples of process memory
    # where results spill: the node's local disk (None: $TMPDIR, else the system's temp dir)
    "worker.local-directory": None,
    # CPython's cyclic garbage collector in processes that run a scheduler or a worker:
    # the young generation's threshold (allocations between collections; CPython's own
    # is 700) is raised to at least this. None leaves the collector as it is.
    "admin.gc-threshold": 20_000,
    # clients
    "client.heartbeat-interval": 5.0,  # seconds of silence from the scheduler before a ping
    "client.scheduler-timeout": 60.0,  # seconds without any answer: the scheduler is lost
    # seconds a client whose journaled scheduler vanished keeps its futures pending and
    # tries to reconnect; then they err. 0, or a scheduler without a journal: at once
    "client.scheduler-reconnect-timeout": 300.0,
    # transport
    "comm.timeouts.connect": 30.0,
    "comm.timeouts.handshake": 5.0,  # seconds an accepted peer has to authenticate
    "comm.timeouts.message": 300.0,  # seconds a message that started arriving has to finish
    "comm.max-pending-handshakes": 256,  # unauthenticated peers held; the oldest go first
    # connections the kernel queues before they are accepted (capped by the system's
    # net.core.somaxconn): thousands of workers may connect at once
    "comm.socket-backlog": 4096,
    "comm.max-frame-bytes": 2**32,  # 4 GiB: larger frames are refused (sending and receiving)
    "comm.max-frames": 100_000,
    "comm.max-send-queue-bytes": 2**31,  # queued for a peer that does not read: then closed
    "comm.tls.cert": None,
    "comm.tls.key": None,
    "comm.tls.ca": None,
    # MPI
    "mpi.poll-min": 1e-5,  # seconds: first back-off step after traffic
    "mpi.poll-max": 0.05,  # seconds: cap of the back-off when idle for long
    "mpi.poll-fast-max": 1e-3,  # cap during the first second of idleness
    "mpi.poll-hold": 0.002,  # seconds of polling at poll-min after any traffic
    "mpi.doorbell": True,  # same-node ranks wake each other (hpcsched/hpc/doorbell.py)
    "mpi.doorbell-poll": 0.002,  # seconds: first fallback poll when every peer rings (to poll-max)
    "mpi.data-threshold": 65536,  # frames of this many bytes or more travel as separate MPI messages
    "mpi.exit-timeout": 5.0,  # seconds rank 0 waits for the others at exit before MPI_Abort
    # seconds without a word from a rank before the job is ended as having lost it (rank 0
    # watches the worker ranks, they watch rank 0; beats every quarter of it); 0: never
    "mpi.rank-timeout": 6.0,
    # adaptive
    "adaptive.interval": 1.0,
    "adaptive.wait-count": 3,
    "adaptive.target-duration": 5.0,
    "adaptive.scale-factor": 2.0,
    "adaptive.memory-high": 0.8,
    "adaptive.history": 100,
    # batch systems
    "jobqueue.command-timeout": 30.0,
    "jobqueue.poll-interval": 2.0,
    # seconds jobs may run with no worker connected before the cluster says why
    "jobqueue.connect-timeout": 20.0,
    # after the n-th failed submission (or job dead before a worker connected) in a row,
    # wait the n-th delay (the last repeats); pause after so many (jobqueue/submissions.py)
    "jobqueue.submit-retry-delays": ["60s", "15m", "30m"],
    "jobqueue.submit-pause-after": 10,
    "jobqueue.dead-jobs-pause-after": 3,
}

_lock = threading.RLock()
_overrides: list[dict[str, Any]] = []  # config.set() stack, innermost last
_file_cache: dict[str, Any] | None = None


def _norm(key: str) -> str:
    return key.strip().lower().replace("_", "-")


def _flatten(prefix: str, obj: Any, out: dict[str, Any]) -> None:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _flatten(f"{prefix}.{_norm(str(k))}" if prefix else _norm(str(k)), v, out)
    else:
        out[prefix] = obj


def _parse_scalar(text: str) -> Any:
    import yaml

    low = text.strip().lower()
    if low in ("inf", "+inf", "infinity"):
        return math.inf
    if low in ("-inf", "-infinity"):
        return -math.inf
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _yaml_files() -> list[str]:
    # os.path, not pathlib: every process of a job reads its configuration at start, and
    # pathlib's import (urllib.parse, ipaddress...) would cost each of them a few ms
    def in_dir(d: str) -> list[str]:
        return sorted(os.path.join(d, n) for n in os.listdir(d)
                      if os.path.splitext(n)[1] in (".yaml", ".yml"))

    files: list[str] = []
    home = os.path.expanduser("~/.config/hpcsched")
    if os.path.isdir(home):
        files += in_dir(home)
    extra = os.environ.get("HPCSCHED_CONFIG")
    if extra:
        if os.path.isdir(extra):
            files += in_dir(extra)
        elif os.path.exists(extra):
            files.append(extra)
        else:
            raise FileNotFoundError(f"HPCSCHED_CONFIG names {extra!r}, which does not exist")
    return files


def _load_files() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in _yaml_files():
        import yaml  # here: without configuration files, nothing needs the YAML parser

        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"hpcsched configuration file {path} is not valid YAML: {e}") from e
        if not isinstance(data, Mapping):
            raise ValueError(f"hpcsched configuration file {path} must hold a mapping")
        _flatten("", data, out)
    return {k: (_parse_scalar(v) if isinstance(v, str) and v.lower() in ("inf", "-inf") else v)
            for k, v in out.items()}


def _from_env(prefix: str = "") -> dict[str, Any]:
    """The environment's settings whose key starts with ``prefix``, parsed.

    Only those: parsing a value takes the YAML parser, which nothing else at start-up needs.
    The environment is read on every call (a program may change it), but only the names
    are decoded to find ours, and each name's key and each value's parse are remembered:
    connections and workers read settings as they start, a thousand at a time.
    """
    out: dict[str, Any] = {}
    environ = os.environ
    for name in environ:
        if not name.startswith("HPCSCHED_") or name == "HPCSCHED_CONFIG":
            continue
        key = _ENV_KEYS.get(name)
        if key is None:
            key = _ENV_KEYS[name] = ".".join(_norm(p) for p in name[len("HPCSCHED_"):].split("__"))
        if key.startswith(prefix):
            value = environ.get(name)
            if value is None:  # removed meanwhile by another thread
                continue
            try:
                out[key] = _ENV_VALUES[value]
            except KeyError:
                parsed = _parse_scalar(value)
                # a list or a mapping is parsed anew: a caller may change what it gets;
                # and a program that keeps setting new values does not grow this forever
                if isinstance(parsed, (str, int, float, bool)) and len(_ENV_VALUES) < 1024:
                    _ENV_VALUES[value] = parsed
                out[key] = parsed
    return out


_ENV_KEYS: dict[str, str] = {}  # environment variable name -> configuration key
_ENV_VALUES: dict[str, Any] = {}  # environment text -> its parsed value, if immutable


def refresh() -> None:
    """Forget cached YAML files (read again on the next ``get``)."""
    global _file_cache
    with _lock:
        _file_cache = None


def _files() -> dict[str, Any]:
    global _file_cache
    with _lock:
        if _file_cache is None:
            _file_cache = _load_files()
        return _file_cache


def get(key: str, override: Any = None, default: Any = KeyError) -> Any:
    """The value of ``key``; ``override`` (a keyword argument) wins when not None."""
    if override is not None:
        return override
    key = _norm(key)
    with _lock:
        for layer in reversed(_overrides):
            if key in layer:
                return layer[key]
    env = _from_env(key)
    if key in env:
        return env[key]
    files = _files()
    if key in files:
        return files[key]
    if key in DEFAULTS:
        return DEFAULTS[key]
    if default is KeyError:
        raise KeyError(f"unknown hpcsched configuration key {key!r}")
    return default


def get_prefix(prefix: str) -> dict[str, Any]:
    """All keys below ``prefix`` (e.g. ``"jobqueue.slurm"``), merged over every layer."""
    prefix = _norm(prefix).rstrip(".") + "."
    merged: dict[str, Any] = {}
    layers = [DEFAULTS, _files(), _from_env(prefix)]
    with _lock:
        layers += list(_overrides)
    for layer in layers:
        for k, v in layer.items():
            if k.startswith(prefix):
                merged[k[len(prefix):]] = v
    return merged


@contextlib.contextmanager
def set(values: Mapping[str, Any]) -> Iterator[None]:  # noqa: A001 - mirrors dask.config.set
    """Temporarily set configuration values (innermost wins)."""
    layer: dict[str, Any] = {}
    _flatten("", dict(values), layer)
    with _lock:
        _overrides.append(layer)
    try:
        yield
    finally:
        with _lock:
            _overrides.remove(layer)
