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

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
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


# exits 0 if this network namespace reaches the address argv[1]: a TCP connection to its
# port 9 is accepted or refused (an answer), not unreachable or unanswered
_REACHES = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=1).close()
except ConnectionRefusedError:
    pass
except OSError:
    sys.exit(1)
"""


def in_node(pid: int, node: int) -> bool:
    """Whether process ``pid`` runs in node ``node``'s network namespace."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/var/run/netns/hsn{node}").st_ino
    except OSError:
        return False


def crash_node(node: int, roots: Iterable[int]) -> list[int]:
    """A node crash as far as this test's processes go: SIGKILL every process among
    ``roots`` and their descendants that runs in node ``node``'s namespace (others' processes
    on that node are left alone). Returns the pids killed."""
    family: list[psutil.Process] = []
    for pid in roots:
        try:
            root = psutil.Process(pid)
            family += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    victims = [p for p in family if in_node(p.pid, node)]
    for p in victims:  # all found first: a parent killed first cannot hide its children
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    return [p.pid for p in victims]


@contextlib.contextmanager
def link_down(node: int) -> Iterator[None]:
    """Node ``node`` cut off the cluster network (its veth's login side, hsv<node>, down)
    until the block ends, however it ends."""
    subprocess.run(["ip", "link", "set", f"hsv{node}", "down"], check=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["ip", "link", "set", f"hsv{node}", "up"], check=True, timeout=30)
        # back once the node reaches the login side again (the link and its neighbours up)
        deadline = time.monotonic() + 30
        while subprocess.run(["ip", "netns", "exec", f"hsn{node}", sys.executable, "-c",
                              _REACHES, LOGIN], capture_output=True, timeout=30).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node} does not reach {LOGIN} 30 s after its link "
                                   "came back up")
            time.sleep(0.2)


#: a script that holds every worker with a task for 10 minutes, saying where each runs (a
#: job to crash a node under)
BUSY = textwrap.dedent("""
    import socket
    import time

    from hpcsched import Client


    def hold(seconds):
        print("busy on", socket.gethostname(), flush=True)
        time.sleep(seconds)


    with Client() as client:
        workers = sorted(client.run(socket.gethostname))
        client.gather([client.submit(hold, 600, workers=[w], pure=False) for w in workers])
""")
