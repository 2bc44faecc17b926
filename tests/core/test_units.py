"""The one parser of each kind of setting: sizes, memory limits, durations."""

from __future__ import annotations

from datetime import timedelta

import pytest

from hpcsched.core.units import (
    format_bytes,
    memory_limit_bytes,
    parse_bytes,
    parse_interval,
    parse_memory_limit,
)

GB, GiB, MiB = 10**9, 2**30, 2**20


# ---------------------------------------------------------------- sizes
@pytest.mark.parametrize(
    "text, expected",
    [
        ("16GB", 16 * 10**9), ("4GiB", 4 * GiB), ("500M", 500 * 10**6), ("1.5T", 15 * 10**11),
        ("100", 100), ("0", 0), ("1e3", 1000), ("2 kB", 2000), ("2KiB", 2048), ("3 mib", 3 * MiB),
        (" 7 Gi ", 7 * GiB), ("1PB", 10**15), ("12b", 12), (1024, 1024), (2.5e9, 2_500_000_000),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "GB", "12XB", "1.2.3G", "-5G", "five", "16 G B", None, True,
                                 float("nan"), -1, [16]])
def test_parse_bytes_rejects_garbage_with_a_clear_error(bad):
    with pytest.raises(ValueError, match="bytes"):
        parse_bytes(bad)


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (512, "512 B"), (2048, "2.00 KiB"), (1536 * MiB, "1.50 GiB"), (GiB, "1.00 GiB"),
     (1023.9 * MiB, "1.00 GiB"), (3 * 2**40, "3.00 TiB"), (5 * 2**50, "5.00 PiB")],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("n", [1, 999, 4096, 10**9, 123_456_789_012])
def test_format_then_parse_round_trips_within_rounding(n):
    assert abs(parse_bytes(format_bytes(n)) - n) <= max(1, n * 0.005)


@pytest.mark.parametrize("bad", [-1, float("inf"), "1GB", None])
def test_format_bytes_rejects_non_sizes(bad):
    with pytest.raises(ValueError, match="format_bytes"):
        format_bytes(bad)


# ---------------------------------------------------------------- memory limits
@pytest.mark.parametrize("value,limit", [
    ("4GB", 4 * GB), (4e9, 4 * GB), (4 * GB, 4 * GB), ("4000000000.0", 4 * GB),
    ("4GiB", 4 * GiB), (0.5, 0.5), ("0.5", 0.5), (1.0, 1.0),
    (None, 0), (0, 0), ("0", 0), ("None", 0), ("none", 0), (0.0, 0),
    ("auto", "auto"), ("AUTO", "auto"),
])
def test_memory_limit_as_dask_means_it(value, limit):
    """A float up to 1 is a fraction of the machine, a larger number or a size is
    bytes, None or 0 no limit: ``distributed.worker_memory.parse_memory_limit``."""
    assert parse_memory_limit(value) == limit
    assert type(parse_memory_limit(value)) is type(limit)


def test_a_memory_limit_keeps_its_meaning_through_a_command_line():
    for value in ("4GB", 4e9, 0.5, None, "auto", 3 * GiB):
        assert parse_memory_limit(str(value)) == parse_memory_limit(value)


@pytest.mark.parametrize("bad", ["lots", -1, -0.5, float("nan"), float("inf"), True, [1]])
def test_a_bad_memory_limit_names_the_setting(bad):
    with pytest.raises(ValueError, match="memory_limit"):
        parse_memory_limit(bad)


def test_memory_limit_bytes_on_a_machine():
    machine, share = 16 * GB, 4 * GB
    assert [memory_limit_bytes(v, machine=machine, share=share)
            for v in ("4GB", 4e9, 0.5, None, "auto")] == [4 * GB, 4 * GB, 8 * GB, 0, 4 * GB]


def test_no_worker_gets_more_than_the_machine(caplog):
    assert memory_limit_bytes("32GB", machine=16 * GB, share=0) == 16 * GB
    assert "more than this machine's memory" in caplog.text


# ---------------------------------------------------------------- durations
@pytest.mark.parametrize("value,seconds", [
    (3, 3.0), (1.5, 1.5), ("500ms", 0.5), ("2s", 2.0), ("1m", 60.0), ("1min", 60.0),
    ("1.5h", 5400.0), ("1d", 86400.0), ("1h30m", 5400.0), ("1 h 30 m", 5400.0), ("45", 45.0),
    ("01:00:00", 3600.0), ("2-01:30:05", 2 * 86400 + 5405.0), (timedelta(minutes=5), 300.0),
])
def test_parse_interval(value, seconds):
    assert parse_interval(value) == seconds


@pytest.mark.parametrize("value,seconds", [
    ("55m", 3300.0), ("4m", 240.0), ("300s", 300.0), ("00:30:00", 1800.0), ("1h30m", 5400.0),
    ("2h", 7200.0), ("1.5s", 1.5), ("250ms", 0.25),
])
def test_dask_strings_mean_what_they_mean_in_dask(value, seconds):
    """dask's ``parse_timedelta`` and dask-jobqueue's documented ``--lifetime 55m``."""
    assert parse_interval(value) == seconds


def test_zero_is_a_duration_only_where_a_setting_allows_it():
    assert parse_interval(0, zero=True) == 0.0
    assert parse_interval("0s", zero=True) == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        parse_interval(-1, "worker.walltime-margin", zero=True)
    with pytest.raises(ValueError, match="positive"):
        parse_interval(0)


def test_two_fields_are_hours_and_minutes_only_when_asked():
    with pytest.raises(ValueError, match="ambiguous"):
        parse_interval("01:30")
    assert parse_interval("01:30", hh_mm=True) == 5400.0


@pytest.mark.parametrize("bad,match", [
    ("soon", "not a duration"), ("1m30", "not a duration"), ("", "not a duration"),
    ("1:70:00", "below 60"), ("1:2:3:4", "HH:MM:SS"), (0, "positive"), ("0s", "positive"),
    (float("inf"), "positive"), (None, "not a duration"),
])
def test_a_bad_duration_names_the_setting(bad, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_interval(bad, "worker.death-timeout")
    assert "worker.death-timeout" in str(info.value)
