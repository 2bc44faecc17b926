"""The TCP transport's security layer: byte streams (plain or TLS) and the handshake.

See :mod:`hpcsched.core.comm.tcp` for the handshake's steps. This module holds
the parts that touch secrets and certificates, so they can be read (and
reviewed) on their own: the mutual HMAC-SHA256 challenge-response, TLS
contexts built from :class:`~hpcsched.core.comm.base.Security`, and the
stream classes the comm reads and writes through.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import ssl
import struct
import threading
import time

from hpcsched.core import config
from hpcsched.core.comm.base import HandshakeError, Security

logger = logging.getLogger("hpcsched.comm")

IOV_MAX = 512  # buffers per sendmsg call (the kernel limit is 1024)
BUFFER_SIZE = 256 * 1024  # reusable receive buffer per comm
HELLO_MAGIC = b"HPCS"
PROTOCOL_VERSION = 1
FLAG_TLS = 1
FLAG_AUTH = 2
_HELLO = struct.Struct("<4sBB32s")
_REPLY = struct.Struct("<4sBB32s32s")
_VERDICT = struct.Struct("<B32s")
_NO_MAC = bytes(32)
TLS_CHUNK = 256 * 1024


def _mac(secret: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, role + a + b, hashlib.sha256).digest()



# ---------------------------------------------------------------- byte streams
class _PlainStream:
    """The socket itself; ``sendv`` and ``recv_into`` are thin wrappers."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def recv_into(self, view: memoryview) -> int:
        return self.sock.recv_into(view)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def sendv(self, buffers: list[memoryview]) -> None:
        bufs = [b for b in buffers if b.nbytes]
        i = 0
        while i < len(bufs):
            sent = self.sock.sendmsg(bufs[i : i + IOV_MAX])
            while sent:  # advance past what the kernel took (partial sends are normal)
                n = bufs[i].nbytes
                if sent >= n:
                    sent -= n
                    i += 1
                else:
                    bufs[i] = bufs[i][sent:]
                    sent = 0


class _TLSStream:
    """TLS over memory BIOs; ``lock`` guards the OpenSSL object and the BIOs.

    Socket writes of encrypted records happen under ``send_lock`` (held by the
    caller of ``sendv``/``sendall``), also when a read produced records to send
    (TLS 1.3 session tickets, key updates): lock order is send_lock, then lock.
    """

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_side: bool,
                 server_hostname: str | None):
        self.sock = sock
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_side=server_side,
                                server_hostname=server_hostname)
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()

    def _feed(self) -> bool:
        data = self.sock.recv(BUFFER_SIZE)
        with self.lock:
            if data:
                self.incoming.write(data)
            else:
                self.incoming.write_eof()
        return bool(data)

    def handshake(self) -> None:
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                out = self.outgoing.read()
                if out:
                    self.sock.sendall(out)
                if not self._feed():
                    raise ConnectionError("peer closed the connection during the TLS handshake") from None
        out = self.outgoing.read()
        if out:
            self.sock.sendall(out)

    def recv_into(self, view: memoryview) -> int:
        while True:
            with self.lock:
                try:
                    n: int | None = self.obj.read(len(view), view)
                except ssl.SSLWantReadError:
                    n = None
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return 0
                pending = self.outgoing.pending
            # Records produced by a read (key updates) go out now if no writer is busy;
            # otherwise the writer sends them with its next chunk, in order. Waiting for
            # the send lock here could deadlock two peers that both send large messages.
            if pending and self.send_lock.acquire(blocking=False):
                try:
                    with self.lock:
                        out = self.outgoing.read()
                    if out:
                        self.sock.sendall(out)
                finally:
                    self.send_lock.release()
            if n is not None:
                return n
            if not self._feed():
                return 0

    def sendall(self, data: bytes) -> None:
        self.sendv([memoryview(data)])

    def sendv(self, buffers: list[memoryview]) -> None:
        for buf in buffers:
            for off in range(0, buf.nbytes, TLS_CHUNK):
                with self.lock:
                    self.obj.write(buf[off : off + TLS_CHUNK])
                    out = self.outgoing.read()
                self.sock.sendall(out)


def _read_exact(stream: _PlainStream | _TLSStream, n: int, deadline: float) -> bytes | None:
    """``n`` bytes before ``deadline`` (TimeoutError), or None if the peer closes first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        stream.sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        k = stream.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


# ---------------------------------------------------------------- TLS contexts
def _tls_files(security: Security | None) -> tuple[str | None, str | None, str | None]:
    s = security or Security()
    return (s.tls_cert or config.get("comm.tls.cert"), s.tls_key or config.get("comm.tls.key"),
            s.tls_ca or config.get("comm.tls.ca"))


def _server_context(security: Security | None) -> ssl.SSLContext | None:
    cert, key, ca = _tls_files(security)
    if not cert:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if ca:  # clients must present a certificate signed by this CA
            ctx.load_verify_locations(ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load TLS files cert={cert} key={key} ca={ca}: {e}") from e
    return ctx


def _client_context(security: Security | None, force: bool) -> ssl.SSLContext | None:
    cert, key, ca = _tls_files(security)
    if not (cert or ca or force):
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if ca:
            # A cluster CA pins the scheduler; its certificate need not name every host.
            ctx.load_verify_locations(ca)
            ctx.check_hostname = False
        else:
            ctx.load_default_certs()
        if cert:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load TLS files cert={cert} key={key} ca={ca}: {e}") from e
    return ctx


# ---------------------------------------------------------------- handshakes
class _Refused(Exception):
    """Server side: why a peer was not accepted."""


def _server_handshake(sock: socket.socket, secret: bytes | None, ctx: ssl.SSLContext | None,
                      timeout: float) -> _PlainStream | _TLSStream:
    deadline = time.monotonic() + timeout
    flags = (FLAG_TLS if ctx else 0) | (FLAG_AUTH if secret else 0)
    nonce = secrets.token_bytes(32)
    sock.settimeout(timeout)
    sock.sendall(_HELLO.pack(HELLO_MAGIC, PROTOCOL_VERSION, flags, nonce))
    stream: _PlainStream | _TLSStream = _PlainStream(sock)
    if ctx is not None:
        stream = _TLSStream(sock, ctx, server_side=True, server_hostname=None)
        try:
            stream.handshake()
        except (ssl.SSLError, ConnectionError) as e:
            raise _Refused(f"TLS handshake failed: {e}") from e
    reply = _read_exact(stream, _REPLY.size, deadline)
    if reply is None:
        raise _Refused("peer closed the connection during the handshake")
    magic, version, peer_flags, client_nonce, mac = _REPLY.unpack(reply)
    if magic != HELLO_MAGIC:
        raise _Refused(f"not an hpcsched peer (greeting {reply[:8]!r})")
    if version != PROTOCOL_VERSION:
        raise _Refused(f"protocol version {version}, we speak {PROTOCOL_VERSION}")
    if peer_flags != flags:
        stream.sendall(_VERDICT.pack(0, _NO_MAC))
        raise _Refused(f"security settings differ (peer flags {peer_flags}, ours {flags})")
    proof = _NO_MAC
    if secret:
        if not hmac.compare_digest(mac, _mac(secret, b"client", nonce, client_nonce)):
            stream.sendall(_VERDICT.pack(0, _NO_MAC))
            raise _Refused("wrong HMAC: the peer does not hold the cluster's secret")
        proof = _mac(secret, b"server", client_nonce, nonce)
    stream.sendall(_VERDICT.pack(1, proof))
    return stream


class _GoneBeforeHello(ConnectionError):
    """The server closed before greeting (overloaded or stopping): worth retrying."""


def _client_handshake(sock: socket.socket, address: str, host: str, security: Security | None,
                      ctx: ssl.SSLContext | None, timeout: float) -> _PlainStream | _TLSStream:
    deadline = time.monotonic() + timeout
    secret = security.secret if security else None
    stream: _PlainStream | _TLSStream = _PlainStream(sock)
    try:
        hello = _read_exact(stream, _HELLO.size, deadline)
    except TimeoutError:
        raise HandshakeError(f"no greeting from {address} within {timeout}s: is it an hpcsched "
                             "server (or one with TLS when we use none)?") from None
    if hello is None:
        raise _GoneBeforeHello(f"{address} closed the connection before greeting")
    magic, version, flags, nonce = _HELLO.unpack(hello)
    if magic != HELLO_MAGIC:
        raise HandshakeError(f"{address} is not an hpcsched server (greeting {hello[:8]!r})")
    if version != PROTOCOL_VERSION:
        raise HandshakeError(f"{address} speaks protocol {version}, we speak {PROTOCOL_VERSION}: "
                             "mixed hpcsched versions?")
    if flags & FLAG_TLS and ctx is None:
        raise HandshakeError(f"{address} requires TLS: set security.tls_ca (and tls_cert/tls_key "
                             "if it checks client certificates)")
    if not flags & FLAG_TLS and ctx is not None:
        raise HandshakeError(f"{address} does not use TLS but our security settings require it")
    if flags & FLAG_AUTH and not secret:
        raise HandshakeError(f"{address} requires the cluster's shared secret and we have none "
                             "(pass security= or set HPCSCHED_SECRET / HPCSCHED_SECRET_FILE)")
    if not flags & FLAG_AUTH and secret:
        raise HandshakeError(f"{address} does not authenticate its peers but we hold a secret: "
                             "refusing to talk to an unauthenticated server")
    if ctx is not None:
        stream = _TLSStream(sock, ctx, server_side=False,
                            server_hostname=host if ctx.check_hostname else None)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            stream.handshake()
        except (ssl.SSLError, OSError) as e:
            raise HandshakeError(f"TLS handshake with {address} failed: {e}") from e
    client_nonce = secrets.token_bytes(32)
    mac = _mac(secret, b"client", nonce, client_nonce) if secret else _NO_MAC
    try:
        stream.sendall(_REPLY.pack(HELLO_MAGIC, PROTOCOL_VERSION, flags, client_nonce, mac))
        verdict = _read_exact(stream, _VERDICT.size, deadline)
    except TimeoutError:
        raise HandshakeError(f"{address} did not answer our handshake within {timeout}s") from None
    except (ssl.SSLError, OSError) as e:
        verdict = None  # the server hung up on us: treated as a refusal below
        logger.debug("handshake with %s: %s", address, e)
    if verdict is None or verdict[0] != 1:
        if secret:
            raise HandshakeError(f"scheduler at {address} refused our credentials: wrong secret?")
        raise HandshakeError(f"{address} refused the connection during the handshake")
    if secret and not hmac.compare_digest(verdict[1:], _mac(secret, b"server", client_nonce, nonce)):
        raise HandshakeError(f"{address} could not prove it holds the cluster's secret: "
                             "not our scheduler?")
    return stream


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
