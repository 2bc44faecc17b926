"""Scheduler and secret files: private from their first byte, never left for good.

Real files in a temporary directory; the killed cluster is a real process
ended with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from hpcsched.core.comm.base import Security
from hpcsched.core.comm.scheduler_file import (
    read_scheduler_file,
    remove_stale_secrets,
    write_scheduler_file,
    write_secret_file,
)
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path, follow_symlinks=False).st_mode)


def test_scheduler_file_ignores_a_stale_world_readable_temporary_file(tmp_path):
    path = tmp_path / "scheduler.json"
    stale = tmp_path / f"scheduler.json.tmp-{os.getpid()}"  # what an earlier run left
    stale.write_text("stale")
    os.chmod(stale, 0o644)
    sec = Security.generate()
    write_scheduler_file(str(path), "tcp://10.0.0.1:8786", sec)
    assert mode(path) == 0o600
    assert read_scheduler_file(str(path)) == ("tcp://10.0.0.1:8786", sec)
    assert stale.read_text() == "stale"  # not reused, not written through
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, stale.name])


def test_scheduler_file_is_private_whatever_the_umask(tmp_path):
    path = tmp_path / "scheduler.json"
    old = os.umask(0)
    try:
        write_scheduler_file(str(path), "tcp://h:1", Security.generate())
    finally:
        os.umask(old)
    assert mode(path) == 0o600


def test_scheduler_file_never_writes_through_a_planted_link(tmp_path, monkeypatch):
    """Another user who guesses the temporary name and plants a link there gains nothing."""
    target = tmp_path / "attacker-readable"
    target.write_text("")
    import hpcsched.core.comm.scheduler_file as sf

    monkeypatch.setattr(sf, "_temp_suffix", lambda: "guessed")
    os.symlink(target, tmp_path / f"s.json.tmp-{os.getpid()}-guessed")
    with pytest.raises(FileExistsError):
        write_scheduler_file(str(tmp_path / "s.json"), "tcp://h:1", Security.generate())
    assert target.read_text() == ""


def test_secret_file_is_private_and_locked_while_its_cluster_lives(tmp_path):
    sec = Security.generate()
    sf = write_secret_file(str(tmp_path), "abc123", sec)
    try:
        assert os.path.basename(sf.path) == ".hpcsched-abc123.secret"
        assert mode(sf.path) == 0o600
        assert open(sf.path).read() == sec.secret_hex()
        assert remove_stale_secrets(str(tmp_path)) == []  # alive: kept
        assert os.path.exists(sf.path)
        assert os.listdir(tmp_path) == [".hpcsched-abc123.secret"]  # no temporary left
    finally:
        sf.close()
    assert not os.path.exists(sf.path)


def test_a_killed_clusters_secret_is_removed_by_the_next_cluster(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {REPO!r})
        from hpcsched.core.comm.base import Security
        from hpcsched.core.comm.scheduler_file import write_secret_file
        sf = write_secret_file({str(tmp_path)!r}, "killed", Security.generate())
        print(sf.path, flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        path = p.stdout.readline().strip()
        assert os.path.exists(path) and mode(path) == 0o600
        assert remove_stale_secrets(str(tmp_path)) == []  # its owner is alive
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        p.stdout.close()
    assert os.path.exists(path)  # SIGKILL left it behind ...
    sf = write_secret_file(str(tmp_path), "next", Security.generate())
    try:
        assert not os.path.exists(path)  # ... until the next cluster started here
        assert os.path.exists(sf.path)
    finally:
        sf.close()


def test_secret_file_refuses_a_name_in_use(tmp_path):
    sf = write_secret_file(str(tmp_path), "same", Security.generate())
    try:
        with pytest.raises(FileExistsError):
            write_secret_file(str(tmp_path), "same", Security.generate())
        assert os.listdir(tmp_path) == [".hpcsched-same.secret"]
    finally:
        sf.close()
