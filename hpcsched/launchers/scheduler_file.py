"""Scheduler files: how workers and clients elsewhere find a scheduler and its secret.

JSON ``{"address": ..., "secret": <hex>}``, created with mode 0600 so that no
other user can read the secret.
"""

from __future__ import annotations

import json
import os
import time

from hpcsched.core.comm.base import Security


def write_scheduler_file(path: str, address: str, security: Security | None) -> None:
    """JSON with the address and the secret, created with mode 0600 (never readable by others)."""
    data = {"address": address, "secret": security.secret_hex() if security else ""}
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_scheduler_file(path: str, security: Security | None = None
                        ) -> tuple[str, Security | None]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read scheduler file {path}: {e}") from e
    if not isinstance(data, dict) or "address" not in data:
        raise ValueError(f"scheduler file {path} has no address")
    if security is None and data.get("secret"):
        security = Security.from_hex(data["secret"])
    return data["address"], security


def looks_like_scheduler_file(address: str) -> bool:
    """An address argument that names a file (``"sched.json"``, ``"~/run/sched"``), not a
    ``host:port``."""
    return (address.endswith(".json") or os.sep in address or address.startswith("~")
            or os.path.exists(address))


def wait_for_scheduler_file(path: str, timeout: float | None,
                            security: Security | None = None) -> tuple[str, Security | None]:
    """Read the scheduler file at ``path``, waiting up to ``timeout`` seconds for it to appear
    (a batch job's scheduler may start after the client), as dask's ``Client(scheduler_file=)``
    does; then an error that names the file."""
    path = os.path.expanduser(path)
    deadline = time.monotonic() + (timeout if timeout is not None else 30.0)
    delay = 0.01
    while True:
        if os.path.exists(path):
            try:
                return read_scheduler_file(path, security)
            except ValueError:
                if time.monotonic() >= deadline:  # still half-written, or not ours
                    raise
        elif time.monotonic() >= deadline:
            raise FileNotFoundError(
                f"scheduler file {path} did not appear within {timeout}s: start the scheduler "
                "with --scheduler-file pointing there, or check the path")
        time.sleep(min(delay, max(deadline - time.monotonic(), 0.001)))
        delay = min(delay * 2, 0.5)
