"""The emulated compute nodes of ``ci/nodes/`` for the tests across nodes.

``ci/nodes/start-nodes.sh 3`` makes three nodes (network namespaces hsn1..hsn3, addresses
10.77.0.11-13, hostnames node1-3) and the login side (this host: 10.77.0.1 on hsbr0, and
10.78.0.1 on hsbr1, which the nodes cannot reach); ``ci/nodes/start-slurm-nodes.sh 3``
runs SLURM over them. Tests that take nodes by number use :func:`pick` (the first ones, or
those ``HPCSCHED_TEST_NODES`` names, on a machine whose other nodes are busy).
:func:`require` skips a test, saying how to make what it needs, unless ``ci/test-all.sh``
made it (``HPCSCHED_REQUIRE_NODES=1``, set as root and under
``CI=true``; ``slurm-nodes`` in ``HPCSCHED_REQUIRE_BATCH``): then it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ON_NODE = str(ROOT / "ci" / "nodes" / "on-node.sh")
LOGIN, UNREACHABLE = "10.77.0.1", "10.78.0.1"
SLURM_CONF = os.path.join(os.environ.get("BATCH_STATE_DIR", "/var/tmp/hpcsched-batch"),
                          "slurm-nodes", "slurm.conf")


def pick(count: int) -> list[int]:
    """The ``count`` nodes a test runs on: nodes 1..count (what ``ci/test-all.sh`` makes), or
    the first ``count`` of ``HPCSCHED_TEST_NODES`` (node numbers, e.g. ``4,5,6``)."""
    text = os.environ.get("HPCSCHED_TEST_NODES", "").strip()
    if not text:
        return list(range(1, count + 1))
    try:
        nodes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"HPCSCHED_TEST_NODES={text!r}: expected node numbers like 4,5,6") \
            from None
    if len(nodes) < count or not all(1 <= i <= 9 for i in nodes):
        raise ValueError(f"HPCSCHED_TEST_NODES={text!r}: {count} node numbers in 1..9 needed")
    return nodes[:count]


def address(node: int) -> str:
    """Node ``node``'s address on the cluster network (start-nodes.sh's 10.77.0.1<i>)."""
    return f"10.77.0.1{node}"


def missing_nodes(count: int, nodes: list[int] | None = None) -> str | None:
    """None when ``count`` nodes (``nodes``, else 1..count) and both login networks are
    there, else what is missing."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "entering network namespaces needs root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "ip (iproute2) or unshare (util-linux) is missing"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           timeout=30).stdout.split()
    missing = [f"hsn{i}" for i in nodes or range(1, count + 1) if f"hsn{i}" not in names]
    for link in ("hsbr0", "hsbr1"):
        if subprocess.run(["ip", "link", "show", link], capture_output=True,
                          timeout=30).returncode != 0:
            missing.append(link)
    return f"{', '.join(missing)} missing" if missing else None


def missing_slurm(count: int) -> str | None:
    """None when the SLURM of start-slurm-nodes.sh answers with ``count`` nodes."""
    why = missing_nodes(count)
    if why is not None:
        return why
    if not os.path.exists(SLURM_CONF):
        return f"{SLURM_CONF} missing"
    try:
        r = subprocess.run(["sinfo", "-h", "-p", "multi", "-o", "%D"], capture_output=True,
                           text=True, timeout=30, env=dict(os.environ, SLURM_CONF=SLURM_CONF))
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo: {e}"
    if r.returncode != 0 or r.stdout.strip() != str(count):
        return f"sinfo -p multi: {(r.stdout + r.stderr).strip()[-300:]}"
    return None


def require(why: str | None, how: str, slurm: bool = False) -> None:
    """Skip when ``why`` is not None, or fail when CI made the nodes: the nodes under
    ``HPCSCHED_REQUIRE_NODES=1``, their SLURM (``slurm``) when ``HPCSCHED_REQUIRE_BATCH``
    names ``slurm-nodes``."""
    if why is None:
        return
    msg = f"no emulated nodes ({why}); make them with: {how}"
    if slurm and "slurm-nodes" in os.environ.get("HPCSCHED_REQUIRE_BATCH", "").split(","):
        pytest.fail(f"HPCSCHED_REQUIRE_BATCH={os.environ['HPCSCHED_REQUIRE_BATCH']} but {msg}")
    if not slurm and os.environ.get("HPCSCHED_REQUIRE_NODES") == "1":
        pytest.fail(f"HPCSCHED_REQUIRE_NODES=1 but {msg}")
    pytest.skip(msg)
