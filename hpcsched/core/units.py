"""Quantities written by people: sizes, memory limits and durations; one parser each.

Every entry point (keyword arguments, the command lines, configuration, batch job
parameters, environment variables of batch systems) reads these settings through the
functions here, so that a value means the same wherever it is written. They live in
this module rather than in :mod:`hpcsched.core.config`, which only decides *which*
value wins (defaults < files < environment < keywords): here is what a value *means*.
Nothing here reads the machine; what a setting needs of it (its memory) is an argument.

* Sizes (:func:`parse_bytes`): decimal units (kB, MB, GB, TB, PB; a bare K, M, G, T,
  P) are powers of 1000, binary units (KiB, MiB, GiB, TiB, PiB; Ki, Mi, ...) powers of
  1024, as in dask's ``parse_bytes``.
* A worker's memory limit (:func:`parse_memory_limit`, :func:`memory_limit_bytes`):
  dask.distributed's meaning (``distributed.worker_memory.parse_memory_limit``).
* Durations (:func:`parse_interval`): seconds as a number, ``"500ms"``, ``"2s"``,
  ``"1m"``/``"1min"``, ``"2h"``, ``"1d"``, ``"1h30m"``, and a batch system's
  ``"HH:MM:SS"`` / ``"D-HH:MM:SS"``.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from typing import Any, Literal

logger = logging.getLogger("hpcsched.units")

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30,
    "ti": 2**40, "tib": 2**40, "pi": 2**50, "pib": 2**50,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """``"16GB"`` -> ``16_000_000_000``; ``"4GiB"`` -> ``4 * 2**30``; numbers pass through.

    >>> parse_bytes("500M"), parse_bytes("1.5 TiB"), parse_bytes("100")
    (500000000, 1649267441664, 100)
    """
    if isinstance(text, bool):
        raise ValueError(f"not a number of bytes: {text!r}")
    if isinstance(text, (int, float)):
        if not math.isfinite(text) or text < 0:
            raise ValueError(f"not a number of bytes: {text!r} (must be finite and >= 0)")
        return int(text)
    if not isinstance(text, str):
        raise ValueError(f"not a number of bytes: {text!r} (expected a string like '16GB')")
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a number of bytes; write a number and a unit, "
            "e.g. '16GB', '4GiB', '500M', '1.5T' (kB/MB/GB/TB are powers of 1000, "
            "KiB/MiB/GiB/TiB powers of 1024)"
        )
    return int(round(float(m.group(1)) * _UNITS[unit]))


def format_bytes(n: int | float) -> str:
    """``format_bytes(1536 * 2**20)`` -> ``"1.50 GiB"`` (binary units, 3 significant digits).

    >>> format_bytes(512), format_bytes(2**30), format_bytes(1.5 * 2**40)
    ('512 B', '1.00 GiB', '1.50 TiB')
    """
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n < 0:
        raise ValueError(f"format_bytes needs a finite number >= 0, got {n!r}")
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20),
                       ("KiB", 2**10)):
        if n >= size * 0.9995:  # 1023.9 MiB reads better as 1.00 GiB
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


#: a memory limit as written, checked: bytes (0: no limit), a fraction of the machine's
#: memory, or "auto" (this worker's share of it)
MemoryLimit = int | float | Literal["auto"]

#: every entry point's default: the worker's share of the machine's (or its job's) memory
DEFAULT_MEMORY_LIMIT: MemoryLimit = "auto"

_NO_LIMIT = ("none", "0")


def parse_memory_limit(value: Any) -> MemoryLimit:
    """A worker's ``memory_limit``, checked and in its normal form; as dask.distributed means it.

    * ``None``, ``0`` (and the strings ``"None"``, ``"0"``): no limit -> ``0``;
    * ``"auto"``: the worker's share of the machine's memory -> ``"auto"``;
    * a float in ``(0, 1]`` (or such a number written as a string, ``"0.5"``): that
      fraction of the machine's memory -> the float;
    * an int, a larger float (``4e9``) or a size (``"4GB"``, ``"4GiB"``): bytes -> int.

    A string reads as the Python number it spells (``"0.5"`` a fraction, ``"4000000000.0"``
    bytes), so that a value keeps its meaning through a command line (``str(value)``).
    What the fraction and "auto" come to on a machine is :func:`memory_limit_bytes`.

    >>> [parse_memory_limit(v) for v in ("4GB", 4e9, 0.5, None, "auto", "0.5", "2 GiB")]
    [4000000000, 4000000000, 0.5, 0, 'auto', 0.5, 2147483648]
    """
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ValueError(f"memory_limit={value!r}: write bytes, a size ('4GB'), a fraction "
                         "of the machine's memory (0.5), 'auto' or None")
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text in _NO_LIMIT:
            return 0
        for number in (int, float):
            try:
                return parse_memory_limit(number(text))
            except ValueError:
                continue
        try:
            return parse_bytes(text)
        except ValueError as e:
            raise ValueError(f"memory_limit={value!r}: {e}") from None
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"memory_limit={value!r} must be finite and >= 0")
        return value if 0 < value <= 1 else int(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"memory_limit={value!r} must be >= 0")
        return value
    raise ValueError(f"memory_limit={value!r}: write bytes, a size ('4GB'), a fraction of "
                     "the machine's memory (0.5), 'auto' or None")


def memory_limit_bytes(value: Any, *, machine: int, share: int) -> int:
    """The bytes a worker may use (0: no limit) for ``memory_limit=value``.

    ``machine``: the machine's memory in bytes (a fraction is of it, and no limit is
    above it: a larger one is lowered to it with a warning, as dask does); ``share``:
    what ``"auto"`` gives this worker (the machine's memory, or its batch job's, split
    among the workers that share it).

    >>> memory_limit_bytes(0.5, machine=16 * 10**9, share=4 * 10**9)
    8000000000
    >>> memory_limit_bytes("auto", machine=16 * 10**9, share=4 * 10**9)
    4000000000
    >>> memory_limit_bytes(None, machine=16 * 10**9, share=4 * 10**9)
    0
    """
    limit = parse_memory_limit(value)
    if limit == "auto":
        n = int(share)
    elif isinstance(limit, float):
        n = int(limit * machine)
    else:
        n = int(limit)
    if machine > 0 and n > machine:
        logger.warning("memory_limit=%r is more than this machine's memory (%s): using that",
                       value, format_bytes(machine))
        n = machine
    return n


_TIME_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)(ms|min|s|m|h|d)?")
_CLOCK = re.compile(r"(?:(\d+)-)?(\d+(?::\d+)+)")


def parse_interval(value: Any, what: str = "interval", *, hh_mm: bool = False,
                   mm_ss: bool = False, zero: bool = False) -> float:
    """Seconds (> 0; >= 0 with ``zero``) from a number, a ``timedelta`` or a string.

    Strings: ``"500ms"``, ``"2s"``, ``"1m"``, ``"1.5h"``, ``"1d"``, parts added up
    (``"1h30m"``), a bare number is seconds; or a batch system's clock ``"HH:MM:SS"``
    and ``"D-HH:MM:SS"``. Two fields (``"01:30"``) are refused as ambiguous unless the
    caller says how its batch system reads them: ``hh_mm`` (LSF's ``-W``, OAR) or ``mm_ss``
    (SLURM, PBS, Grid Engine, Moab).
    Errors name ``what``. These are dask's strings (``dask.utils.parse_timedelta``:
    ``"55m"``, ``"300s"``) and the walltimes of batch systems, so that a value written for
    dask or for ``sbatch`` means the same here. ``zero`` lets a setting whose 0 means
    "off" or "at once" (a reconnect timeout, a margin) be 0.

    >>> parse_interval("500ms"), parse_interval("1h30m"), parse_interval("2-01:00:00")
    (0.5, 5400.0, 176400.0)
    >>> parse_interval("55m"), parse_interval("00:30:00"), parse_interval("0s", zero=True)
    (3300.0, 1800.0, 0.0)
    """
    # a timedelta exists only once datetime is imported: no process imports it for this
    datetime = sys.modules.get("datetime")
    if datetime is not None and isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _duration_text(value, what, hh_mm, mm_ss)
    else:
        raise ValueError(f"{what}={value!r} is not a duration (e.g. 1.5, '500ms', '2s', "
                         "'01:00:00')")
    if not (seconds >= 0 if zero else seconds > 0) or math.isinf(seconds):
        kind = "finite duration >= 0" if zero else "positive finite duration"
        raise ValueError(f"{what} must be a {kind}, not {value!r}")
    return seconds


def _duration_text(value: str, what: str, hh_mm: bool, mm_ss: bool) -> float:
    text = "".join(value.split()).lower()
    clock = _CLOCK.fullmatch(text)
    if clock:
        fields = [int(f) for f in clock.group(2).split(":")]
        days = int(clock.group(1) or 0)
        if len(fields) == 2 and hh_mm and not clock.group(1):
            fields.append(0)
        elif len(fields) == 2 and mm_ss and not clock.group(1):
            fields = [*divmod(fields[0], 60), fields[1]]  # "90:00": 90 minutes
        elif len(fields) == 2:
            raise ValueError(f"{what}={value!r} is ambiguous (HH:MM or MM:SS?): write "
                             "HH:MM:SS, e.g. '01:30:00'")
        if len(fields) != 3:
            raise ValueError(f"{what}={value!r} is not a duration: write HH:MM:SS or "
                             "D-HH:MM:SS")
        h, m, s = fields
        if m >= 60 or s >= 60:
            raise ValueError(f"{what}={value!r}: minutes and seconds must be below 60")
        return days * 86400.0 + h * 3600 + m * 60 + s
    parts = list(_DURATION_PART.finditer(text))
    if text and "".join(p.group(0) for p in parts) == text:
        if len(parts) == 1 or all(p.group(2) for p in parts):
            return sum(float(p.group(1)) * _TIME_UNITS[p.group(2) or "s"] for p in parts)
    raise ValueError(f"{what}={value!r} is not a duration (e.g. 1.5, '500ms', '2s', '1h30m', "
                     "'01:00:00')")
