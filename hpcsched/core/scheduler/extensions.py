"""Scheduler extensions: what higher layers attach to every scheduler.

The ``scheduler.extensions`` configuration key lists factories called with the
scheduler once it listens, each a seam name or a user's own ``module:factory``
(:func:`hpcsched.core.seams.resolve`); the default, ``dashboard``, is
:mod:`hpcsched.diagnostics.extension`. An extension that
fails to start is logged and skipped: the scheduler runs on without it. A
client reaches one with an ``extension`` op naming it; the extension answers
with a dict, or the client is sent the error (a bad request must not stop the
scheduler).
"""

from __future__ import annotations

import logging
from typing import Any

from hpcsched.core import seams
from hpcsched.core.protocol.messages import Extension, ExtensionReply, encode

logger = logging.getLogger("hpcsched.scheduler")


def start_extensions(scheduler: Any) -> dict[str, Any]:
    """The extensions configured (its settings' ``extensions``), started on ``scheduler``,
    by name."""
    out: dict[str, Any] = {}
    for spec in scheduler.settings.extensions or ():
        try:
            ext = seams.resolve(str(spec))(scheduler)
            out[getattr(ext, "name", spec)] = ext
        except Exception:
            logger.exception("scheduler extension %s failed to start", spec)
    return out


def close_extensions(extensions: dict[str, Any]) -> None:
    """Close each extension; one that fails to close is logged, the others still close."""
    for ext in list(extensions.values()):
        try:
            ext.close()
        except Exception:
            logger.exception("closing scheduler extension %r failed", ext)


def extension_reply(extensions: dict[str, Any], source: str, msg: Extension) -> ExtensionReply:
    """The ``extension-reply`` to ``msg`` (``msg.extension`` names the extension).

    An extension defines its own fields (an open record): it is handed them as the request's
    wire dict, ``{"op": "extension", "extension": ..., **fields}``, and answers a dict."""
    ext = extensions.get(msg.extension)
    try:
        reply = ext.handle(source, encode(msg)) if ext is not None else \
            {"error": f"no scheduler extension {msg.extension!r}"}
    except Exception as e:
        logger.warning("extension request %r from %s failed: %s", msg.extra.get("what"),
                       source, e)
        reply = {"error": f"{type(e).__name__}: {e}"}
    return ExtensionReply(msg.request_id, {k: v for k, v in reply.items()
                                           if k not in ("op", "request_id")})
