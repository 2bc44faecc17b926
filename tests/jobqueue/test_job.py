"""Memory and walltime parsing, worker lifetimes, job records."""

from __future__ import annotations

from datetime import timedelta

import pytest

from hpcsched.jobqueue.job import (
    Job,
    JobState,
    format_hms,
    format_memory,
    parse_memory,
    parse_walltime,
    worker_lifetime,
)


@pytest.mark.parametrize("text,expected", [
    ("16GB", 16 * 10**9), ("16 GB", 16 * 10**9), ("1.5GiB", 3 * 2**29), ("500MB", 5 * 10**8),
    ("2gb", 2 * 10**9), ("4G", 4 * 10**9), (2**30, 2**30), ("1e9", 10**9), ("100kB", 10**5),
])
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["16 gigs", "", "GB", "-1GB", "0", 0, -5])
def test_parse_memory_errors_name_the_parameter(bad):
    with pytest.raises(ValueError, match="memory"):
        parse_memory(bad)


def test_parse_memory_type_errors():
    with pytest.raises(TypeError, match="memory"):
        parse_memory(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="memory"):
        parse_memory(True)


@pytest.mark.parametrize("n,text", [(16 * 10**9, "16GB"), (2**31, "2GiB"), (5 * 10**8, "500MB"),
                                    (8 * 10**9, "8GB"), (12345, "12345B")])
def test_format_memory_is_exact(n, text):
    assert format_memory(n) == text
    assert parse_memory(text) == n


@pytest.mark.parametrize("text,seconds", [
    ("01:00:00", 3600), ("1-00:00:00", 86400), ("2-01:30:05", 2 * 86400 + 5405),
    ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("2h", 7200), (600, 600),
    (timedelta(minutes=5), 300), ("100:00:00", 360000),
])
def test_parse_walltime(text, seconds):
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("bad,match", [
    ("01:30", "ambiguous"), ("1:70:00", "below 60"), ("soon", "not a duration"),
    ("-01:00:00", "not a duration"), (0, "positive"), ("", "not a duration"),
])
def test_parse_walltime_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_walltime(bad)


def test_format_hms():
    assert format_hms(3600) == "01:00:00"
    assert format_hms(90061) == "25:01:01"


def test_worker_lifetime_leaves_margin_and_stagger_inside_walltime():
    assert worker_lifetime(3600, 60, 30) == (3540, 30)
    life, stagger = worker_lifetime(120, 60, 30)  # short job: margin shrinks to a quarter
    assert (life, stagger) == (90, 15)
    assert life + stagger < 120


def test_job_owns_its_workers_and_knows_when_it_ended():
    job = Job("42", "hpc-ab12-3", "/logs/hpc-ab12-3.out", 2)
    assert job.owns_worker("hpc-ab12-3") and job.owns_worker("hpc-ab12-3-1")
    assert not job.owns_worker("hpc-ab12-31") and not job.owns_worker("hpc-ab12-3.1")
    elem = Job("7.2", "hpc-ab12-4.2", "/logs/x", 1)
    assert elem.owns_worker("hpc-ab12-4.2-0") and not elem.owns_worker("hpc-ab12-4")
    assert job.active and not job.ended
    job.state = JobState.FAILED
    assert job.ended and not job.active
    job2 = Job("43", "x", "/l", 1, gone=True)
    assert job2.ended
