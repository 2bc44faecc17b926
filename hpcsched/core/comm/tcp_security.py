"""The TCP transport's security layer: the authentication handshake and TLS.

Every connection starts with a handshake, bounded by ``comm.timeouts.handshake``:

1. server -> client, in clear: ``b"HPCS" version flags nonce[32]``; ``flags``
   says whether TLS follows and whether a shared secret is required, so a
   client whose settings differ fails at once with a clear message.
2. (TLS handshake, if the flag is set.)
3. client -> server: ``b"HPCS" version flags client_nonce[32] mac[32]`` with
   ``mac = HMAC-SHA256(secret, b"client" + nonce + client_nonce)``.
4. server -> client: ``accepted:uint8 proof[32]`` with
   ``proof = HMAC-SHA256(secret, b"server" + client_nonce + nonce)``; the client
   checks it, so both sides prove they hold the secret without sending it.

Without a secret the macs are zeros and only the flags are compared. Nothing a
peer sends is unpickled before step 4: until then only fixed-size structs are
parsed.

The server side is :class:`ServerHandshake`, a sans-IO state machine (wire
bytes in, wire bytes out) that the I/O thread advances as bytes arrive, so a
pending handshake never holds a thread. The client side
(:func:`client_handshake`) runs in the connecting thread with a blocking
socket: that thread waits for the connection anyway.

TLS uses :class:`ssl.SSLObject` over memory BIOs (:class:`TLSCodec`), so the
same non-blocking loop drives plain and encrypted connections.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import ssl
import struct
import time
from typing import cast

from hpcsched.core import config
from hpcsched.core.comm.base import HandshakeError, Security
from hpcsched.core.settings import CommSettings

HELLO_MAGIC = b"HPCS"
PROTOCOL_VERSION = 1
FLAG_TLS = 1
FLAG_AUTH = 2
HELLO = struct.Struct("<4sBB32s")
REPLY = struct.Struct("<4sBB32s32s")
VERDICT = struct.Struct("<B32s")
_NO_MAC = bytes(32)
TLS_CHUNK = 256 * 1024  # plaintext per TLS write
WIRE_CHUNK = 256 * 1024  # bytes per socket read


def _mac(secret: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, role + a + b, hashlib.sha256).digest()


class Refused(Exception):
    """Server side: why a peer was not accepted. ``verdict`` is what to tell it first."""

    def __init__(self, problem: str, verdict: bytes = b""):
        super().__init__(problem)
        self.verdict = verdict


class HandshakeInterrupted(ConnectionError):
    """The server hung up before greeting or before its verdict (overloaded, stopping, or
    it evicted our pending handshake to make room): worth retrying, unlike a refusal."""


# ---------------------------------------------------------------- TLS over memory BIOs
class TLSCodec:
    """An ``SSLObject`` between wire bytes and plaintext; used by one thread at a time."""

    def __init__(self, ctx: ssl.SSLContext, server_side: bool, server_hostname: str | None):
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_side=server_side,
                                 server_hostname=server_hostname)
        self.handshake_done = False

    def feed(self, wire: bytes) -> None:
        if wire:
            self._in.write(wire)
        else:
            self._in.write_eof()

    def wire_out(self) -> bytes:
        """Encrypted bytes waiting to go to the socket."""
        return self._out.read() if self._out.pending else b""

    def handshake(self) -> bool:
        """Advance the TLS handshake with what was fed; True once complete."""
        if not self.handshake_done:
            try:
                self._obj.do_handshake()
                self.handshake_done = True
            except ssl.SSLWantReadError:
                pass
        return self.handshake_done

    def read_into(self, view: memoryview) -> int | None:
        """Plaintext into ``view``: bytes written, 0 at the end of the stream, None if
        more wire bytes are needed."""
        try:
            # given a buffer, SSLObject.read fills it and returns the count (typeshed
            # types the call without one only: bytes)
            return cast(int, self._obj.read(len(view), view))
        except ssl.SSLWantReadError:
            return None
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return 0

    def write(self, plain: memoryview | bytes) -> None:
        view = memoryview(plain)
        for off in range(0, view.nbytes, TLS_CHUNK):
            self._obj.write(view[off:off + TLS_CHUNK])


# ---------------------------------------------------------------- TLS contexts
def _tls_files(security: Security | None) -> tuple[str | None, str | None, str | None]:
    s = security or Security()
    c = config.read(CommSettings)
    return s.tls_cert or c.tls_cert, s.tls_key or c.tls_key, s.tls_ca or c.tls_ca


def server_context(security: Security | None) -> ssl.SSLContext | None:
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


def client_context(security: Security | None, force: bool) -> ssl.SSLContext | None:
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


# ---------------------------------------------------------------- server side
class ServerHandshake:
    """The server's half of the handshake as a state machine.

    ``receive(wire_bytes)`` (``b""`` at end of stream) advances it and raises
    :class:`Refused` on any failure; ``data_to_send()`` returns wire bytes to
    write; once ``done``, ``tls`` (or None) and ``leftover`` (plaintext the peer
    sent after its reply) belong to the connection.
    """

    def __init__(self, secret: bytes | None, ctx: ssl.SSLContext | None):
        self._secret = secret
        self._flags = (FLAG_TLS if ctx else 0) | (FLAG_AUTH if secret else 0)
        self._nonce = secrets.token_bytes(32)
        self._out = bytearray(HELLO.pack(HELLO_MAGIC, PROTOCOL_VERSION, self._flags,
                                         self._nonce))
        self.tls = TLSCodec(ctx, server_side=True, server_hostname=None) if ctx else None
        self._plain = bytearray()
        self.done = False
        self.leftover = b""

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def _say(self, plain: bytes) -> bytes:
        """Plaintext as wire bytes (encrypted once TLS is up)."""
        if self.tls is None:
            return plain
        self.tls.write(plain)
        return self.tls.wire_out()

    def receive(self, wire: bytes) -> None:
        if self.done:
            raise Refused("data after the handshake was handed over")
        if self.tls is None:
            if not wire:
                raise Refused("peer closed the connection during the handshake")
            self._plain += wire
        else:
            self.tls.feed(wire)
            try:
                if not self.tls.handshake():
                    self._out += self.tls.wire_out()
                    if not wire:
                        raise Refused("peer closed the connection during the TLS handshake")
                    return
                self._out += self.tls.wire_out()
                buf = bytearray(4096)
                while (n := self.tls.read_into(memoryview(buf))):
                    self._plain += buf[:n]
                    if len(self._plain) > REPLY.size + (1 << 20):
                        break  # enough to decide; the rest waits in the codec
                if n == 0 and len(self._plain) < REPLY.size:
                    raise Refused("peer closed the connection during the handshake")
            except ssl.SSLError as e:
                raise Refused(f"TLS handshake failed: {e}") from e
        if len(self._plain) < REPLY.size:
            return
        magic, version, peer_flags, client_nonce, mac = REPLY.unpack_from(self._plain)
        if magic != HELLO_MAGIC:
            raise Refused(f"not an hpcsched peer (greeting {bytes(self._plain[:8])!r})")
        if version != PROTOCOL_VERSION:
            raise Refused(f"protocol version {version}, we speak {PROTOCOL_VERSION}")
        no = VERDICT.pack(0, _NO_MAC)
        if peer_flags != self._flags:
            raise Refused(f"security settings differ (peer flags {peer_flags}, ours "
                          f"{self._flags})", self._say(no))
        proof = _NO_MAC
        if self._secret:
            if not hmac.compare_digest(mac, _mac(self._secret, b"client", self._nonce,
                                                 client_nonce)):
                raise Refused("wrong HMAC: the peer does not hold the cluster's secret",
                              self._say(no))
            proof = _mac(self._secret, b"server", client_nonce, self._nonce)
        self._out += self._say(VERDICT.pack(1, proof))
        self.leftover = bytes(self._plain[REPLY.size:])
        self.done = True


# ---------------------------------------------------------------- client side
class ClientHandshake:
    """The client's half of the handshake as a state machine, the mirror of
    :class:`ServerHandshake`: ``receive(wire_bytes)`` (``b""`` at end of stream) advances
    it, ``data_to_send()`` returns wire bytes to write; once ``done``, ``tls`` (or None)
    and ``leftover`` (plaintext after the verdict) belong to the connection.

    Raises :class:`HandshakeError` when the server refuses us or our settings differ
    (retrying cannot help) and :class:`HandshakeInterrupted` when it hangs up (it may be
    overloaded: worth retrying). ``stage`` says what it waits for (a timeout's message).
    """

    def __init__(self, address: str, host: str, security: Security | None,
                 ctx: ssl.SSLContext | None):
        self.address = address
        self._host = host
        self._secret = security.secret if security else None
        self._ctx = ctx
        self._plain = bytearray()
        self._out = bytearray()
        self._nonce = b""
        self._client_nonce = b""
        self.stage = "greeting"  # then "tls" (if the server uses it), "verdict", "done"
        self.tls: TLSCodec | None = None
        self.leftover = b""

    @property
    def done(self) -> bool:
        return self.stage == "done"

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def receive(self, wire: bytes) -> None:
        if self.stage == "done":
            raise HandshakeError(f"{self.address}: data after the handshake was handed over")
        if self.tls is None:
            if not wire:
                self._hung_up()
            self._plain += wire
        else:
            self._tls_receive(wire)
        if self.stage == "greeting" and len(self._plain) >= HELLO.size:
            self._greeted()
        if self.stage == "verdict" and len(self._plain) >= VERDICT.size:
            self._judged()

    def _hung_up(self) -> None:
        if self.stage == "greeting":
            raise HandshakeInterrupted(f"{self.address} closed the connection before greeting")
        raise HandshakeInterrupted(f"{self.address} hung up before its verdict")

    def _tls_receive(self, wire: bytes) -> None:
        assert self.tls is not None
        tls = self.tls
        tls.feed(wire)
        try:
            if self.stage == "tls":
                done = tls.handshake()
                self._out += tls.wire_out()
                if not done:
                    if not wire:
                        raise HandshakeError(f"TLS handshake with {self.address} failed: the "
                                             "server closed the connection")
                    return
                self._reply()
            buf = bytearray(4096)
            while (n := tls.read_into(memoryview(buf))):
                self._plain += buf[:n]
            if n == 0 and len(self._plain) < VERDICT.size:
                self._hung_up()
        except ssl.SSLError as e:
            if self.stage == "tls":
                raise HandshakeError(f"TLS handshake with {self.address} failed: {e}") from e
            raise HandshakeInterrupted(f"{self.address} hung up during the handshake: {e}") from e

    def _greeted(self) -> None:
        address, secret, ctx = self.address, self._secret, self._ctx
        hello = bytes(self._plain[:HELLO.size])
        rest = bytes(self._plain[HELLO.size:])
        self._plain.clear()
        magic, version, flags, nonce = HELLO.unpack(hello)
        if magic != HELLO_MAGIC:
            raise HandshakeError(f"{address} is not an hpcsched server (greeting {hello[:8]!r})")
        if version != PROTOCOL_VERSION:
            raise HandshakeError(f"{address} speaks protocol {version}, we speak "
                                 f"{PROTOCOL_VERSION}: mixed hpcsched versions?")
        if flags & FLAG_TLS and ctx is None:
            raise HandshakeError(f"{address} requires TLS: set security.tls_ca (and "
                                 "tls_cert/tls_key if it checks client certificates)")
        if not flags & FLAG_TLS and ctx is not None:
            raise HandshakeError(f"{address} does not use TLS but our security settings "
                                 "require it")
        if flags & FLAG_AUTH and not secret:
            raise HandshakeError(f"{address} requires the cluster's shared secret and we have "
                                 "none (pass security= or set HPCSCHED_SECRET / "
                                 "HPCSCHED_SECRET_FILE)")
        if not flags & FLAG_AUTH and secret:
            raise HandshakeError(f"{address} does not authenticate its peers but we hold a "
                                 "secret: refusing to talk to an unauthenticated server")
        self._flags, self._nonce = flags, nonce
        self._client_nonce = secrets.token_bytes(32)
        if ctx is None:
            self._plain += rest
            self._reply()
            return
        try:
            self.tls = TLSCodec(ctx, server_side=False,
                                server_hostname=self._host if ctx.check_hostname else None)
            self.stage = "tls"
            self.tls.handshake()
        except ssl.SSLError as e:
            raise HandshakeError(f"TLS handshake with {self.address} failed: {e}") from e
        self._out += self.tls.wire_out()
        if rest:
            self._tls_receive(rest)

    def _reply(self) -> None:
        secret = self._secret
        mac = _mac(secret, b"client", self._nonce, self._client_nonce) if secret else _NO_MAC
        reply = REPLY.pack(HELLO_MAGIC, PROTOCOL_VERSION, self._flags, self._client_nonce, mac)
        if self.tls is None:
            self._out += reply
        else:
            self.tls.write(reply)
            self._out += self.tls.wire_out()
        self.stage = "verdict"

    def _judged(self) -> None:
        address, secret = self.address, self._secret
        verdict = bytes(self._plain[:VERDICT.size])
        self.leftover = bytes(self._plain[VERDICT.size:])
        self._plain.clear()
        if verdict[0] != 1:
            if secret:
                raise HandshakeError(f"scheduler at {address} refused our credentials: wrong "
                                     "secret?")
            raise HandshakeError(f"{address} refused the connection during the handshake")
        if secret and not hmac.compare_digest(
                verdict[1:], _mac(secret, b"server", self._client_nonce, self._nonce)):
            raise HandshakeError(f"{address} could not prove it holds the cluster's secret: "
                                 "not our scheduler?")
        self.stage = "done"


def client_handshake(sock: socket.socket, address: str, host: str, security: Security | None,
                     ctx: ssl.SSLContext | None, timeout: float
                     ) -> tuple[TLSCodec | None, bytes]:
    """Authenticate to the server on ``sock``, blocking (the connecting thread waits for
    the connection anyway); the TLS codec if any, and plaintext the server sent after
    its verdict."""
    hs = ClientHandshake(address, host, security, ctx)
    deadline = time.monotonic() + timeout
    try:
        while not hs.done:
            out = hs.data_to_send()
            if out:
                sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                sock.sendall(out)
            sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            hs.receive(sock.recv(WIRE_CHUNK))
        out = hs.data_to_send()
        if out:
            sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            sock.sendall(out)
    except TimeoutError:
        if hs.stage == "greeting":
            # a scheduler that thousands of workers reach at once may greet late: the caller
            # tries again until its connect timeout (a TimeoutError, not a refusal)
            raise TimeoutError(f"no greeting from {address} within {timeout}s: is it an "
                               "hpcsched server (or one with TLS when we use none)?") from None
        raise TimeoutError(f"{address} did not answer our handshake within {timeout}s") from None
    except (HandshakeError, HandshakeInterrupted):
        raise
    except OSError as e:
        if hs.stage == "greeting":
            raise
        raise HandshakeInterrupted(f"{address} hung up during the handshake: {e}") from e
    return hs.tls, hs.leftover


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
