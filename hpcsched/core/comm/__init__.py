"""Transports behind one ``Comm`` interface, chosen by URL scheme."""

from hpcsched.core.comm.base import (
    Comm,
    CommClosedError,
    HandshakeError,
    Inbox,
    Listener,
    Security,
    parse_address,
    parse_host_port,
)
from hpcsched.core.comm.registry import connect, listen, register

__all__ = [
    "Comm", "CommClosedError", "HandshakeError", "Inbox", "Listener", "Security",
    "connect", "listen", "register", "parse_address", "parse_host_port",
]
