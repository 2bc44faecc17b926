"""The one way a receiver handles a message: a table from record type to handler.

Every receiver in hpcsched -- the scheduler state, the worker state, the
scheduler server, the worker server, the client, the cluster-control and
coordination services -- declares its handlers where they are written, with
the decorator of one :class:`Handlers` table, and looks a record up by its
type (never by an op string, never with ``getattr`` on a name taken from a
message). A record type with no handler is a clear error naming the receiver
and the record, raised where the record arrives.

A handler is written as a method (or a plain function taking the receiver
first); :meth:`Handlers.bind` makes the per-instance table of bound handlers
once, so a message costs one dict look-up and one call::

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Ping:
    ...     n: int
    >>> class Server:
    ...     handlers = Handlers("server")
    ...     def __init__(self):
    ...         self.table = self.handlers.bind(self)
    ...     @handlers.on(Ping)
    ...     def _ping(self, msg, sender):
    ...         return f"pong {msg.n} to {sender}"
    >>> s = Server()
    >>> s.table[Ping](Ping(1), "w1")
    'pong 1 to w1'
    >>> Server.handlers.handler(s, "hello")
    Traceback (most recent call last):
    ...
    hpcsched.core.protocol.dispatch.Unhandled: server has no handler for str
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Unhandled(TypeError):
    """A record reached a receiver that declares no handler for its type."""


class Handlers:
    """One receiver's table: record type -> handler, filled with :meth:`on`."""

    __slots__ = ("name", "table")

    def __init__(self, name: str):
        self.name = name
        self.table: dict[type, Callable[..., Any]] = {}

    def on(self, *types: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: the decorated function handles records of ``types``."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            for t in types:
                if t in self.table:
                    raise TypeError(f"{self.name}: {t.__name__} already handled by "
                                    f"{self.table[t].__qualname__}")
                self.table[t] = fn
            return fn

        return register

    def bind(self, receiver: Any) -> dict[type, Callable[..., Any]]:
        """The table with each handler bound to ``receiver`` (make it once, at construction)."""
        return {t: fn.__get__(receiver) for t, fn in self.table.items()}

    def handler(self, receiver: Any, record: Any) -> Callable[..., Any]:
        """The handler of ``record`` bound to ``receiver``; :class:`Unhandled` if there is none."""
        try:
            fn = self.table[type(record)]
        except KeyError:
            raise Unhandled(f"{self.name} has no handler for {type(record).__name__}") from None
        return fn.__get__(receiver)

    def __contains__(self, t: type) -> bool:
        return t in self.table
