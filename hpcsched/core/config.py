"""Configuration: defaults < YAML files < environment variables < keyword arguments.

Keys are dotted and hyphenated, as in ``scheduler.worker-saturation``.

* Defaults: :data:`DEFAULTS` lists every knob; each is a field of a settings class
  (:mod:`hpcsched.core.settings`, one per section), which names its key and holds its
  default and description. A component reads its class with :func:`read`, which builds
  it from the configuration.
* YAML files: every ``*.yaml`` / ``*.yml`` in ``~/.config/hpcsched/`` (sorted by
  name), then the file or directory named by ``HPCSCHED_CONFIG``. Nested
  mappings are flattened: ``{"scheduler": {"worker-saturation": 1.0}}``.
* Environment: ``HPCSCHED_SCHEDULER__WORKER_SATURATION=1.0`` sets
  ``scheduler.worker-saturation`` (``__`` separates levels, ``_`` stands for
  ``-``, case-insensitive). Values are parsed as YAML scalars (``inf``,
  ``true``, ``1.5``, ``[1, 2]``).
* Keyword arguments win: components call ``config.read(SettingsClass, **overrides)``,
  where an override that is not ``None`` is taken as is (``config.get(key, override)``
  reads one key the same way).

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
from typing import Any, TypeVar

from hpcsched.core.settings import SETTINGS
from hpcsched.core.state.settings import config_keys, unit_of
from hpcsched.core.units import parse_bytes, parse_interval

S = TypeVar("S")


def _settings_defaults(classes: tuple[type, ...]) -> dict[str, Any]:
    """``{key: default}`` of the settings classes' fields: each key is one field's."""
    out: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for cls in classes:
        defaults = cls()
        for name, key in config_keys(cls).items():
            if key in owner:
                raise TypeError(f"{cls.__name__}.{name} names {key}, which is "
                                f"{owner[key]}'s already: a key has one home")
            owner[key] = f"{cls.__name__}.{name}"
            out[key] = getattr(defaults, name)
    return out


#: every key and its default: the fields of the settings classes (hpcsched.core.settings,
#: where each is described)
DEFAULTS: dict[str, Any] = _settings_defaults(SETTINGS)

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
        before = frozenset(out)  # (``set`` here is this module's, as dask.config.set)
        _flatten("", data, out)
        warn_unknown([k for k in out if k not in before], f"hpcsched configuration file {path}")
    return {k: (_parse_scalar(v) if isinstance(v, str) and v.lower() in ("inf", "-inf") else v)
            for k, v in out.items()}


def unknown_keys(keys: Any) -> list[str]:
    """Those of ``keys`` that name no setting.

    A batch system's own section (``jobqueue.<system>.<parameter>``) is its cluster's
    keyword arguments, checked by the cluster against its parameters: left out here."""
    return sorted(k for k in keys if k not in DEFAULTS
                  and not (k.startswith("jobqueue.") and k.count(".") >= 2))


_warned: dict[str, None] = {}  # the keys warned of


def warn_unknown(keys: Any, where: str) -> None:
    """Warn, once a key, of ``keys`` hpcsched does not know, with the closest known key.

    A typo does nothing otherwise."""
    for key in unknown_keys(keys):
        if key in _warned:
            continue
        _warned[key] = None
        import difflib
        import warnings

        close = difflib.get_close_matches(key, DEFAULTS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        warnings.warn(f"{where}: unknown configuration key {key!r}{hint}; it is ignored",
                      UserWarning, stacklevel=3)


def _check_environment() -> None:
    """Warn of ``HPCSCHED_SECTION__KEY`` variables that name no setting.

    The variables with no ``__``, such as ``HPCSCHED_SECRET``, are no settings."""
    for name in [n for n in os.environ if n.startswith("HPCSCHED_") and "__" in n]:
        key = ".".join(_norm(p) for p in name[len("HPCSCHED_"):].split("__"))
        warn_unknown([key], f"environment variable {name}")


def _from_env(prefix: str = "", only: Any = None) -> dict[str, Any]:
    """The environment's settings whose key starts with ``prefix``, parsed.

    With ``only``, those of its keys alone.

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
        if key.startswith(prefix) and (only is None or key in only):
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
        _warned.clear()


def _files() -> dict[str, Any]:
    global _file_cache
    with _lock:
        if _file_cache is None:
            _file_cache = _load_files()
            _check_environment()
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


def read(cls: type[S], **overrides: Any) -> S:
    """The settings class ``cls`` (:mod:`hpcsched.core.settings`) as configured.

    Each field is what :func:`get` reads for its key, unless ``overrides`` (keyword
    arguments) give it a value other than None; sizes (``unit="bytes"``) and durations
    (``unit="seconds"``: ``"5m"``, ``"00:30:00"``, as dask writes them) are parsed.

    >>> from hpcsched.core.settings import SchedulerSettings
    >>> read(SchedulerSettings, worker_saturation=2.0).worker_saturation
    2.0
    >>> read(SchedulerSettings).worker_saturation
    1.1
    """
    keys = _keys_of(cls)
    given = {name: overrides.pop(name, None) for name in cls.__struct_fields__}  # type: ignore[attr-defined]
    found = _lookup([key for name, key in keys.items() if given[name] is None])
    values: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            if name not in keys:
                continue  # not configured: the class's default
            value = found[keys[name]]
        unit = unit_of(cls, name) if value is not None else None
        if unit == "bytes":
            value = parse_bytes(value)
        elif unit == "seconds":
            value = parse_interval(value, keys.get(name, name), zero=True)
        values[name] = value
    # what is left names no field: the class refuses it as any unknown keyword
    return cls(**values, **{k: v for k, v in overrides.items() if v is not None})


def seconds(key: str, override: Any = None) -> float:
    """The duration ``key`` in seconds, read as dask reads durations.

    :func:`get`'s value: a number, ``"30s"``, ``"5m"``, ``"00:30:00"``
    (:func:`~hpcsched.core.units.parse_interval`).

    >>> with set({"comm.timeouts.connect": "2m"}):
    ...     seconds("comm.timeouts.connect")
    120.0
    """
    return parse_interval(get(key, override), key, zero=True)


_KEYS: dict[type, dict[str, str]] = {}


def _keys_of(cls: type) -> dict[str, str]:
    keys = _KEYS.get(cls)
    if keys is None:
        keys = _KEYS[cls] = config_keys(cls)
    return keys


def _lookup(keys: list[str]) -> dict[str, Any]:
    """What :func:`get` reads for each of ``keys``, its layers gathered once.

    A class of a dozen keys costs one pass over the environment, not a dozen.
    """
    if not keys:
        return {}
    with _lock:
        layers = list(reversed(_overrides))
    env = _from_env(os.path.commonprefix(keys), only=frozenset(keys))
    files = _files()
    out: dict[str, Any] = {}
    for key in keys:
        for layer in (*layers, env, files, DEFAULTS):
            if key in layer:
                out[key] = layer[key]
                break
        else:
            raise KeyError(f"unknown hpcsched configuration key {key!r}")
    return out


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
