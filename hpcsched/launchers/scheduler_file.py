"""Scheduler files: how workers and clients elsewhere find a scheduler and its secret.

JSON ``{"address": ..., "secret": <hex>}``, created with mode 0600 so that no
other user can read the secret.
"""

from __future__ import annotations

import json
import os

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
