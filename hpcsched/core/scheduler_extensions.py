"""Scheduler extensions: the one seam from the scheduler to higher layers.

The ``scheduler.extensions`` configuration key names factories
(``module:function``) called with the scheduler once it listens (the
dashboard, :mod:`hpcsched.diagnostics.extension`, is one). An extension that
fails to start is logged and skipped: the scheduler runs on without it. A
client reaches one with an ``extension`` op naming it; the extension answers
with a dict, or the client is sent the error (a bad request must not stop the
scheduler).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from hpcsched.core import config

logger = logging.getLogger("hpcsched.scheduler")


def start_extensions(scheduler: Any) -> dict[str, Any]:
    """The extensions configured, started on ``scheduler``, by name."""
    out: dict[str, Any] = {}
    for spec in config.get("scheduler.extensions") or ():
        try:
            module, _, attr = str(spec).partition(":")
            ext = getattr(importlib.import_module(module), attr)(scheduler)
            out[getattr(ext, "name", spec)] = ext
        except Exception:
            logger.exception("scheduler extension %s failed to start", spec)
    return out


def close_extensions(extensions: dict[str, Any]) -> None:
    for ext in list(extensions.values()):
        try:
            ext.close()
        except Exception:
            logger.exception("closing scheduler extension %r failed", ext)


def extension_reply(extensions: dict[str, Any], source: str, msg: dict) -> dict:
    """The ``extension-reply`` to ``msg`` (``msg["extension"]`` names the extension)."""
    ext = extensions.get(msg.get("extension"))  # type: ignore[arg-type]
    try:
        reply = ext.handle(source, msg) if ext is not None else \
            {"error": f"no scheduler extension {msg.get('extension')!r}"}
    except Exception as e:
        logger.warning("extension request %r from %s failed: %s", msg.get("what"), source, e)
        reply = {"error": f"{type(e).__name__}: {e}"}
    return {**reply, "op": "extension-reply", "request_id": msg.get("request_id")}
