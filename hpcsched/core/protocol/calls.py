"""Calls that travel: a user's function or plugin hook run where a message asked for it,
and the answer that carries its result or its exception back.

``Client.run``, ``run_on_scheduler``, ``upload_file``, plugin registration and the
nanny's link all run code the client sent, somewhere else, and answer with the
same fields: ``status`` (``"OK"`` or ``"error"``), ``result`` or ``exception``
(cloudpickled) and ``traceback``. :func:`error_reply` writes the fields of a
failure where the code ran; :func:`outcome` reads one answer where it is
awaited. :func:`call_with` and :func:`call_hook` call the user's code as
distributed does (``dask_worker=`` / ``dask_scheduler=`` passed to a function
that takes it; an ``async`` hook run to its end).
"""

from __future__ import annotations

import inspect
import os
import traceback
from typing import Any

from hpcsched.core.protocol.serialize import dumps_object, loads_object
from hpcsched.core.protocol.wire import MalformedMessage


def check_filename(name: Any) -> str:
    """A bare file name (no directory, no ``..``): what a worker may write into its directory.

    >>> check_filename("model.py")
    'model.py'
    >>> check_filename("../etc/passwd")
    Traceback (most recent call last):
    ...
    hpcsched.core.protocol.wire.MalformedMessage: UploadFile: not a bare file name: '../etc/passwd'
    """
    if not isinstance(name, str) or not name or name in (".", "..") \
            or os.path.basename(name) != name or "\0" in name:
        raise MalformedMessage(f"UploadFile: not a bare file name: {name!r}")
    return name


def error_reply(e: BaseException) -> dict:
    """The fields of a reply carrying exception ``e`` (``status``, ``exception``,
    ``traceback``), the exception cloudpickled."""
    try:
        blob = dumps_object(e)
    except Exception:  # noqa: BLE001 - an exception that cannot travel is sent as its text
        blob = dumps_object(RuntimeError(f"{type(e).__name__}: {e}"))
    return {"status": "error", "exception": blob,
            "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))}


def outcome(entry: Any) -> tuple[bool, Any]:
    """(ok, result or exception) of one answer: a ``control-reply`` record, or one
    worker's ``{"status", "result" | "exception", "traceback"}`` of its ``results``.

    >>> outcome({"status": "OK", "result": dumps_object(42)})
    (True, 42)
    """
    if isinstance(entry, dict):
        status, result = entry.get("status"), entry.get("result")
        exception, tb = entry.get("exception"), entry.get("traceback")
    else:
        status, result = entry.status, entry.result
        exception, tb = entry.exception, entry.traceback
    if status == "OK":
        return True, loads_object(result) if result is not None else None
    exc = loads_object(exception) if exception else RuntimeError(str(tb or "unknown error"))
    if not isinstance(exc, BaseException):
        exc = RuntimeError(repr(exc))
    return False, exc


def call_with(fn: Any, args: tuple, kwargs: dict, name: str, value: Any) -> Any:
    """``fn(*args, **kwargs)``, adding ``name=value`` if ``fn`` takes that argument (distributed
    passes ``dask_worker`` / ``dask_scheduler`` so)."""
    try:
        takes = name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    if takes:
        kwargs = {**kwargs, name: value}
    return fn(*args, **kwargs)


def call_hook(plugin: Any, hook: str, *args: Any, **kwargs: Any) -> Any:
    """``plugin.hook(*args, **kwargs)`` if the plugin has that hook; a coroutine it returns
    (distributed's hooks may be ``async``) is run to its end."""
    fn = getattr(plugin, hook, None)
    if fn is None:
        return None
    out = fn(*args, **kwargs)
    if inspect.iscoroutine(out):
        import asyncio

        out = asyncio.run(out)
    return out
