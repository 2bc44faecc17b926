"""What a task prints: kept with the task, forwarded when a client asked for it.

Tasks run in threads of one worker process, which share one ``sys.stdout`` and
``sys.stderr``. :func:`install` puts a :class:`TaskStream` in front of each, once per
process: a write from a thread that runs a task (:func:`~hpcsched.core.worker.context.current`)
is kept in that thread's :class:`Kept` tail of the task's last :data:`TAIL_LINES` lines,
handed to each of :data:`forwarders`, and written to the stream beneath as before (the
worker's log). A write from any other thread goes straight through.

Nothing is done per task: a thread's tail is made at the task's first write and replaced
when another task of the thread writes, so a task that prints nothing costs nothing. When
a task fails, :func:`annotate` adds its tail to the exception as a note (PEP 678), which
travels with the pickled exception and its traceback text to the client: the error of a
failed task comes with what it printed last, as dask users ask (dask/distributed #2033).

:data:`forwarders` are callables ``(stream, text, explicit)`` that the forwarding plugin
(:mod:`hpcsched.diagnostics.forwarding`) registers; ``explicit`` marks what
``hpcsched.print`` / ``hpcsched.warn`` wrote (:func:`write_explicit`), which is
forwarded to a client that asked only for the explicit lines.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from hpcsched.core.worker.context import current

#: lines of a task's output kept with it, and the characters kept of each line
TAIL_LINES = 20
LINE_CHARS = 1000

#: (stream name, text, explicit) -> None, called on the writing thread: must not block
forwarders: list[Callable[[str, str, bool], None]] = []

_local = threading.local()  # .kept: Kept of the last task of this thread that wrote
_explicit = threading.local()  # .on: the write is hpcsched.print's / warn's


class Kept:
    """The tail of one task's output: its last lines, bounded in number and length."""

    __slots__ = ("key", "lines", "partial")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self.partial = ""

    def add(self, text: str) -> None:
        head, *rest = text.split("\n")
        if not rest:
            self.partial = (self.partial + head)[:LINE_CHARS]
            return
        self.lines.append((self.partial + head)[:LINE_CHARS])
        for line in rest[-TAIL_LINES - 1:-1]:
            self.lines.append(line[:LINE_CHARS])
        self.partial = rest[-1][:LINE_CHARS]

    def text(self) -> str:
        lines = list(self.lines) + ([self.partial] if self.partial else [])
        return "\n".join(lines[-TAIL_LINES:])


class TaskStream:
    """``sys.stdout`` / ``sys.stderr`` of a worker process: keeps a task's writes with it
    (and forwards them), and writes everything to the stream beneath."""

    def __init__(self, name: str, inner: TextIO) -> None:
        self.name = name
        self.inner = inner

    def write(self, text: str) -> int:
        running = current()
        if running is not None and text:
            kept = getattr(_local, "kept", None)
            if kept is None or kept.key != running.key:
                kept = _local.kept = Kept(running.key)
            kept.add(text)
            if forwarders:
                explicit = getattr(_explicit, "on", False)
                for forward in list(forwarders):
                    forward(self.name, text, explicit)
        return self.inner.write(text)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...
        return getattr(self.inner, name)


def install() -> None:
    """Put a :class:`TaskStream` in front of ``sys.stdout`` and ``sys.stderr`` (again if
    something replaced it since). Called as a worker starts."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, TaskStream):
            setattr(sys, name, TaskStream(name, stream))


def take(key: Any) -> str:
    """The tail of what the task ``key``, run by this thread, printed ("" if nothing);
    forgotten after."""
    kept = getattr(_local, "kept", None)
    if kept is None or kept.key != key:
        return ""
    _local.kept = None
    return kept.text()


def annotate(exc: BaseException, key: Any) -> None:
    """Add the tail of what the failed task ``key`` printed to ``exc`` as a note."""
    text = take(key)
    if not text:
        return
    note = f"the last lines task {key!r} printed:\n{text}"
    add_note = getattr(exc, "add_note", None)  # Python >= 3.11 (PEP 678)
    try:
        if add_note is not None:
            add_note(note)
        else:
            exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # an exception type that refuses attributes
        pass


def write_explicit(stream: str, text: str) -> None:
    """Write ``text`` to ``sys.<stream>`` marked as forwarded to every client that asked
    for output (``hpcsched.print`` / ``hpcsched.warn``)."""
    _explicit.on = True
    try:
        target = getattr(sys, stream)
        target.write(text)
        target.flush()
    finally:
        _explicit.on = False
