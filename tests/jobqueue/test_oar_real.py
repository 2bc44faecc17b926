"""OARCluster on a real OAR (Debian 12's oar-server / oar-node, ci/batch/start-oar.sh).

OAR refuses jobs from root, so the cluster runs in a process of the OAR user that
start-oar.sh made (``OAR_TEST_USER``, default ``oartest``): tests/jobqueue/data/
oar_owner.py, under the system's Python with this tree and the test environment's
packages on ``PYTHONPATH`` (the environment's own interpreter may sit in a directory that
user cannot read). It makes a round trip and adapts on each road; whatever it submitted
is deleted with ``oardel`` if it fails. Skips when OAR does not answer, unless
``HPCSCHED_REQUIRE_BATCH`` names ``oar``.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

import hpcsched

OWNER = Path(__file__).resolve().parent / "data" / "oar_owner.py"
USER = os.environ.get("OAR_TEST_USER", "oartest")


def _why_not() -> str | None:
    if shutil.which("oarnodes") is None or shutil.which("/usr/bin/python3") is None:
        return "OAR's commands are not installed"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no OAR user {USER}"
    r = subprocess.run(["oarnodes", "-s"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or "Alive" not in r.stdout:
        return f"oarnodes -s: {r.stderr.strip()[-200:] or 'no node alive'}"
    return None


@pytest.fixture(scope="module")
def oar() -> None:
    why = _why_not()
    if why is not None:
        msg = f"OAR not available ({why}); start it with: bash ci/batch/start-oar.sh"
        if "oar" in os.environ.get("HPCSCHED_REQUIRE_BATCH", "").lower():
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.mark.timeout(660)
@pytest.mark.parametrize("road_name", ["bulk", "tasks"])
def test_oar_cluster_round_trip_and_adapt_on_real_oar(oar, road_name):
    path = os.pathsep.join(
        [
            str(Path(hpcsched.__file__).resolve().parents[1]),
            sysconfig.get_path("purelib"),
            sysconfig.get_path("platlib"),
        ]
    )
    cmd = ["su", USER, "-c", f"cd ~ && PYTHONPATH={path} exec /usr/bin/python3 {OWNER} {road_name}"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate(timeout=30)
        ids = [
            j
            for line in (out or "").splitlines()
            if line.startswith("JOBS ")
            for j in line.split()[1:]
        ]
        if ids and proc.returncode != 0:  # what a failed run left behind
            subprocess.run(
                ["su", USER, "-c", "oardel " + " ".join(ids)], capture_output=True, timeout=60
            )
    assert proc.returncode == 0 and out.rstrip().endswith("OK"), out[-4000:]
    assert len(set(ids)) == 4 and all(re.fullmatch(r"\d+", j) for j in ids)
