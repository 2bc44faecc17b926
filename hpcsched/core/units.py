"""Quantities written by people: sizes (``"16GB"``) and durations (``"500ms"``).

The one place where such text becomes a number (and a size text again):
decimal units (kB, MB, GB, TB, PB; a bare K, M, G, T, P) are powers of 1000,
binary units (KiB, MiB, GiB, TiB, PiB; Ki, Mi, ...) powers of 1024, as in
dask's ``parse_bytes``; durations accept ``ms``, ``s``, ``m``/``min``, ``h``.
"""

from __future__ import annotations

import math
import re
from typing import Any

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


_TIME_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_interval(value: Any, what: str = "interval") -> float:
    """Seconds from a number or a string such as ``"500ms"``, ``"2s"``, ``"1m"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9.]+(?:e-?[0-9]+)?)\s*([a-z]*)\s*", value.lower())
        if not m or (m.group(2) and m.group(2) not in _TIME_UNITS):
            raise ValueError(f"{what}={value!r} is not a duration (e.g. 1.5, '500ms', '2s')")
        seconds = float(m.group(1)) * _TIME_UNITS.get(m.group(2) or "s", 1.0)
    else:
        raise ValueError(f"{what}={value!r} is not a duration (e.g. 1.5, '500ms', '2s')")
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"{what} must be a positive finite duration, not {value!r}")
    return seconds
