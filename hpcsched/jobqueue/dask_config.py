"""The ``jobqueue`` section of dask's configuration, as dask-jobqueue users already have it.

dask-jobqueue reads its parameters with ``dask.config.get``, so a value counts wherever
dask's configuration got it: YAML files from ``$DASK_ROOT_CONFIG`` (``/etc/dask``),
``{sys.prefix}/etc/dask``, ``~/.config/dask`` and ``$DASK_CONFIG``, ``DASK_*``
environment variables (``DASK_JOBQUEUE__SLURM__QUEUE=debug``), and
``dask.config.set(...)`` in the running process, also as a context manager (see
"Configuration" in dask's documentation). With dask installed, :func:`section` asks
dask the same way, so a notebook's ``dask.config.set({"jobqueue.slurm.cores": 8})``
before ``SLURMCluster()`` is honoured. dask is optional: without it the same files and
variables are read here, by dask's rules (there is then no ``dask.config.set`` to honour).

hpcsched reads the ``jobqueue`` part *below* its own configuration
(``~/.config/hpcsched``, ``HPCSCHED_*``), so that a setting made for hpcsched wins over
one made for dask. Only ``jobqueue.<section>`` is read; the rest of dask's configuration
(``distributed``, ``array``, ...) is of no concern here.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "jobqueue.yaml"), "w").write(
    ...     "jobqueue:\\n  slurm:\\n    queue: debug\\n    job-extra-directives: ['-C knl']\\n")
    >>> section("slurm", paths=[d], environ={})
    {'queue': 'debug', 'job-extra-directives': ['-C knl']}
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_SUFFIXES = (".yaml", ".yml", ".json")


def search_paths(environ: Mapping[str, str] | None = None) -> list[str]:
    """dask's YAML locations, in the order dask reads them (later wins)."""
    env = os.environ if environ is None else environ
    home = env.get("HOME") or os.path.expanduser("~")
    paths = [env.get("DASK_ROOT_CONFIG", "/etc/dask"), os.path.join(sys.prefix, "etc", "dask"),
             os.path.join(home, ".config", "dask")]
    if "DASK_CONFIG" in env:
        paths.append(env["DASK_CONFIG"])
    return list(dict.fromkeys(paths))


def _files(path: str) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        return sorted(q for q in p.iterdir() if q.suffix in _SUFFIXES and q.is_file())
    return [p] if p.is_file() else []


def _read(path: Path) -> Mapping[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"dask configuration file {path} could not be read: {e}") from e
    if not isinstance(data, Mapping):
        raise ValueError(f"dask configuration file {path} must hold a mapping, "
                         f"not {type(data).__name__}")
    return data


def _norm(key: object) -> str:
    return str(key).strip().lower().replace("_", "-")


def _merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for k, v in new.items():
        k = _norm(k)
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        elif isinstance(v, Mapping):
            into[k] = {}
            _merge(into[k], v)
        else:
            into[k] = v


def _env_value(text: str) -> Any:
    # dask's rule: a Python literal, else none/null/true/false, else the text
    try:
        return ast.literal_eval(text)
    except (SyntaxError, ValueError):
        return {"none": None, "null": None, "false": False, "true": True}.get(text.lower(), text)


def section(name: str, paths: Sequence[str] | None = None,
            environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``jobqueue.<name>`` of dask's configuration, keys hyphenated as in dask-jobqueue's
    ``jobqueue.yaml``: dask's own view when dask is installed (files, variables and
    ``dask.config.set``), else the files and ``DASK_JOBQUEUE__<NAME>__*`` read here.
    ``paths`` / ``environ`` read those files and variables instead of asking dask."""
    if paths is None and environ is None:
        try:
            import dask.config
        except ImportError:
            pass
        else:
            return _from_dask(name, dask.config.get("jobqueue", default=None))
    return _from_files(name, paths, environ)


def _from_dask(name: str, jobqueue: object) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    if jobqueue is None:
        return merged
    if not isinstance(jobqueue, Mapping):
        _from_files(name)  # a file that holds it is named by the error raised there
        raise ValueError("dask configuration: 'jobqueue' must be a mapping, "
                         f"not {type(jobqueue).__name__}")
    part = {_norm(k): v for k, v in jobqueue.items()}.get(_norm(name))
    if isinstance(part, Mapping):
        _merge(merged, part)
    elif part is not None:
        _from_files(name)
        raise ValueError(f"dask configuration: jobqueue.{name} must be a mapping, "
                         f"not {type(part).__name__}")
    return merged


def _from_files(name: str, paths: Sequence[str] | None = None,
                environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``jobqueue.<name>`` merged over dask's files and ``DASK_JOBQUEUE__<NAME>__*``."""
    env = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    for path in (search_paths(env) if paths is None else paths):
        for f in _files(path):
            jobqueue = {_norm(k): v for k, v in _read(f).items()}.get("jobqueue") or {}
            if not isinstance(jobqueue, Mapping):
                raise ValueError(f"dask configuration file {f}: 'jobqueue' must be a mapping")
            part = {_norm(k): v for k, v in jobqueue.items()}.get(_norm(name))
            if isinstance(part, Mapping):
                _merge(merged, part)
            elif part is not None:
                raise ValueError(f"dask configuration file {f}: jobqueue.{name} must be a "
                                 f"mapping, not {type(part).__name__}")
    prefix = f"DASK_JOBQUEUE__{name.upper().replace('-', '_')}__"
    for var, value in env.items():
        if var.upper().startswith(prefix):
            keys = [_norm(k) for k in var[len(prefix):].split("__")]
            node = merged
            for k in keys[:-1]:
                if not isinstance(node.get(k), dict):
                    node[k] = {}
                node = node[k]
            node[keys[-1]] = _env_value(value)
    return merged
