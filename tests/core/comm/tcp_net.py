"""Helpers for the tcp:// tests: echo servers, raw sockets speaking the handshake by hand."""

from __future__ import annotations

import hashlib
import hmac
import queue
import socket
import struct
import threading
from typing import Any

from hpcsched.core.comm import CommClosedError, Security, registry


class Server:
    """A listener whose accepted comms are queued and, optionally, echo every message."""

    def __init__(self, address: str = "tcp://127.0.0.1:0", security: Security | None = None,
                 echo: bool = True):
        self.accepted: queue.Queue = queue.Queue()
        self.comms: list = []
        self.threads: list[threading.Thread] = []
        self.echo = echo
        self.listener = registry.listen(address, self._on_connect, security)
        self.address = self.listener.address

    def _on_connect(self, comm) -> None:
        self.comms.append(comm)
        self.accepted.put(comm)
        if self.echo:
            t = threading.Thread(target=self._echo, args=(comm,), daemon=True)
            self.threads.append(t)
            t.start()

    @staticmethod
    def _echo(comm) -> None:
        try:
            while True:
                comm.send(comm.recv())
        except CommClosedError:
            pass

    def close(self) -> None:
        self.listener.stop()
        for c in self.comms:
            c.close()
        for t in self.threads:
            t.join(timeout=5)


class Net:
    def __init__(self):
        self.servers: list[Server] = []
        self.comms: list = []
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []

    def serve(self, *args: Any, **kw: Any) -> Server:
        s = Server(*args, **kw)
        self.servers.append(s)
        return s

    def connect(self, address: str, timeout: float = 5.0, security: Security | None = None):
        c = registry.connect(address, timeout, security)
        self.comms.append(c)
        return c

    def raw(self, address: str) -> socket.socket:
        _, loc = address.split("://")
        host, port = loc.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
        self.sockets.append(s)
        return s

    def close(self) -> None:
        for c in self.comms:
            c.close()
        for s in self.sockets:
            s.close()
        for s in self.servers:
            s.close()
        for t in self.threads:
            t.join(timeout=5)


def logged(caplog, *fragments: str) -> bool:
    return any(all(f in r.getMessage() for f in fragments) for r in caplog.records)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def authenticated_raw_socket(net: Net, address: str, secret: bytes) -> socket.socket:
    """Speak the handshake by hand (an independent check of the documented protocol)."""
    s = net.raw(address)
    hello = b""
    while len(hello) < 38:
        hello += s.recv(38 - len(hello))
    magic, version, flags, nonce = struct.unpack("<4sBB32s", hello)
    assert (magic, version, flags) == (b"HPCS", 1, 2)
    cnonce = bytes(range(32))
    mac = hmac.new(secret, b"client" + nonce + cnonce, hashlib.sha256).digest()
    s.sendall(struct.pack("<4sBB32s32s", b"HPCS", 1, 2, cnonce, mac))
    verdict = b""
    while len(verdict) < 33:
        verdict += s.recv(33 - len(verdict))
    assert verdict[0] == 1
    assert verdict[1:] == hmac.new(secret, b"server" + cnonce + nonce, hashlib.sha256).digest()
    return s


def read_until_eof(s: socket.socket) -> bytes:
    """What the server still sends before hanging up (a reset also counts as hanging up)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out
