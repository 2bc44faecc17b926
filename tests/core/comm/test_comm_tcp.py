"""tcp:// comm: what only it does: zero-copy receives, pickling errors, a peer that does
not read, listening, connecting, authentication, hostile peers, TLS.

What every transport promises (order, intact frames, concurrent senders, close,
timeouts, deliver_to) is checked over tcp://, with a secret and over tls:// by the
conformance suite: tests/core/comm/test_comm_conformance.py.

Real sockets on 127.0.0.1 only. Every listener, comm and thread a test starts is ended
by the ``net`` fixture, also when the test fails.
"""

from __future__ import annotations

import mmap
import queue
import socket
import struct
import threading
import time
from typing import Any

import numpy as np
import pytest

from hpcsched.core import config
from hpcsched.core.comm import CommClosedError, HandshakeError, Security, registry
from hpcsched.core.comm import tcp as tcp_backend
from hpcsched.core.protocol.serialize import SerializationError
from tests.conftest import wait_until as wait_for
from tests.core.comm.tcp_net import (
    Server,
    authenticated_raw_socket,
    free_port,
    logged,
    read_until_eof,
)

pytestmark = pytest.mark.timeout(30)


# ---------------------------------------------------------------- messages
def _buffer_owner(arr: np.ndarray) -> Any:
    x: Any = arr
    while isinstance(x, np.ndarray) and x.base is not None:
        x = x.base
    return x.obj if isinstance(x, memoryview) else x


def test_64mib_array_arrives_equal_without_copy(net):
    srv = net.serve(echo=False)
    c = net.connect(srv.address)
    server_side = srv.accepted.get(timeout=5)
    arr = np.random.default_rng(0).random(8 * 2**20)  # 64 MiB
    c.send({"op": "data", "x": arr})  # queued: send never waits for the receiver
    msg = server_side.recv(timeout=20)
    got = msg["x"]
    np.testing.assert_array_equal(got, arr)
    assert not got.flags.owndata
    owner = _buffer_owner(got)
    # the array lives in the very buffer the frame was received into: a mapping of the
    # frame's size whose pages were committed as the bytes arrived
    assert isinstance(owner, mmap.mmap) and len(owner) == arr.nbytes
    assert got.flags.writeable


def test_unpicklable_message_raises_and_comm_stays_usable(net):
    srv = net.serve()
    c = net.connect(srv.address)
    with pytest.raises(SerializationError, match="lock"):
        c.send({"op": "bad", "lock": threading.Lock()})
    c.send("still fine")
    assert c.recv(timeout=5) == "still fine"


# ---------------------------------------------------------------- closing
def test_send_to_a_peer_that_does_not_read_never_blocks_and_close_ends_it(net):
    srv = net.serve(echo=False)  # never reads: the sender's queue fills, not its thread
    c = net.connect(srv.address)
    block = np.zeros(2**21)  # 16 MiB, queued by reference 8 times
    for _ in range(8):
        c.send(block)
    c.close()
    with pytest.raises(CommClosedError):
        c.send(block)


def test_stop_keeps_accepted_comms_and_leaves_no_threads(net):
    before = set(threading.enumerate())
    srv = net.serve()
    c = net.connect(srv.address)
    assert c.local_address.startswith("tcp://127.0.0.1:")
    c.send("x")
    assert c.recv(timeout=5) == "x"
    srv.listener.stop()
    srv.listener.stop()  # idempotent
    c.send("y")
    assert c.recv(timeout=5) == "y"  # accepted comm survives the listener
    with pytest.raises(OSError):
        registry.connect(srv.address, 0.2)

    def leftover() -> list[str]:
        return [t.name for t in set(threading.enumerate()) - before
                if t.name.startswith("hpcsched-") and t.name != "hpcsched-tcp-io"]

    wait_for(lambda: not leftover(), what=f"no threads left: {leftover()}")
    c.close()  # the last user of the I/O thread: it ends too
    wait_for(lambda: not [t for t in set(threading.enumerate()) - before
                          if t.name == "hpcsched-tcp-io"], what="the I/O thread to end")


def test_listen_on_all_interfaces_reports_a_contactable_address(net):
    srv = net.serve("tcp://:0")
    host, port = srv.address[len("tcp://"):].rsplit(":", 1)
    assert host not in ("", "0.0.0.0") and int(port) > 0
    c = net.connect(srv.address)
    c.send("hello")
    assert c.recv(timeout=5) == "hello"


def test_listen_on_a_busy_port_names_the_address(net):
    srv = net.serve()
    with pytest.raises(OSError, match=srv.address):
        net.serve(srv.address)


# ---------------------------------------------------------------- connecting
def test_connect_retries_until_the_listener_appears(net):
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    started: list[Server] = []

    def late_start() -> None:
        time.sleep(0.3)
        started.append(net.serve(address))

    t = threading.Thread(target=late_start)
    net.threads.append(t)
    t.start()
    c = net.connect(address, timeout=10)
    c.send("late")
    assert c.recv(timeout=5) == "late"
    assert started


def test_connect_to_a_closed_port_raises_naming_the_address():
    address = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(OSError, match=address):
        registry.connect(address, 0.3)
    assert time.monotonic() - t0 < 3


def test_connect_to_a_non_hpcsched_server_fails_clearly(net):
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        address = f"tcp://127.0.0.1:{plain.getsockname()[1]}"

        def greet() -> None:
            conn, _ = plain.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n" + b" " * 40)
                try:
                    conn.recv(100)  # until the client hangs up
                except ConnectionResetError:
                    pass

        t = threading.Thread(target=greet)
        net.threads.append(t)
        t.start()
        with pytest.raises(HandshakeError, match="not an hpcsched server"):
            registry.connect(address, 5)


# ---------------------------------------------------------------- authentication
def test_wrong_secret_is_refused_and_the_server_keeps_serving(net, comm_log):
    good = Security.generate()
    srv = net.serve(security=good)
    with pytest.raises(HandshakeError, match=f"scheduler at {srv.address} refused our credentials: wrong secret"):
        registry.connect(srv.address, 5, Security.generate())
    wait_for(lambda: logged(comm_log, "authentication failed", "tcp://127.0.0.1:", "wrong HMAC"),
             what="the refusal to be logged")
    assert srv.accepted.empty()  # on_connect never saw the impostor
    c = net.connect(srv.address, security=good)
    c.send({"op": "ok"})
    assert c.recv(timeout=5) == {"op": "ok"}


@pytest.mark.parametrize("server_secret, client_secret, match", [
    (True, False, "requires the cluster's shared secret"),
    (False, True, "does not authenticate its peers"),
])
def test_security_mismatch_fails_fast(net, server_secret, client_secret, match):
    srv = net.serve(security=Security.generate() if server_secret else None)
    t0 = time.monotonic()
    with pytest.raises(HandshakeError, match=match):
        registry.connect(srv.address, 5, Security.generate() if client_secret else None)
    assert time.monotonic() - t0 < 2


def test_secret_never_goes_on_the_wire(net):
    """A recording proxy between client and server never sees the secret's bytes."""
    sec = Security.generate()
    srv = net.serve(security=sec)
    seen = bytearray()
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen()
    net.sockets.append(proxy)

    def relay(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                seen.extend(data)
                b.sendall(data)
        except OSError:
            pass
        finally:
            try:  # wakes the relay thread reading from b
                b.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            b.close()

    def run_proxy() -> None:
        conn, _ = proxy.accept()
        up = net.raw(srv.address)
        t = threading.Thread(target=relay, args=(up, conn))
        t.start()
        relay(conn, up)
        t.join(timeout=5)

    t = threading.Thread(target=run_proxy)
    net.threads.append(t)
    t.start()
    c = registry.connect(f"tcp://127.0.0.1:{proxy.getsockname()[1]}", 5, sec)
    c.send("through the proxy")
    assert c.recv(timeout=5) == "through the proxy"
    c.close()
    t.join(timeout=5)
    assert len(seen) > 100 and sec.secret not in seen and sec.secret.hex().encode() not in seen


def test_silent_peer_is_dropped_after_the_handshake_timeout(net, comm_log):
    with config.set({"comm.timeouts.handshake": 0.3}):
        sec = Security.generate()
        srv = net.serve(security=sec)
        s = net.raw(srv.address)
        t0 = time.monotonic()
        hello = read_until_eof(s)  # the greeting, then EOF when the server gives up
        assert hello.startswith(b"HPCS")
        assert 0.2 < time.monotonic() - t0 < 3
        wait_for(lambda: logged(comm_log, "authentication failed", "no complete handshake"))
        assert srv.accepted.empty()
        c = net.connect(srv.address, security=sec)
        c.send(1)
        assert c.recv(timeout=5) == 1


def test_garbage_instead_of_a_handshake_is_dropped(net, comm_log):
    sec = Security.generate()
    srv = net.serve(security=sec)
    s = net.raw(srv.address)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 60)
    read_until_eof(s)
    wait_for(lambda: logged(comm_log, "authentication failed", "not an hpcsched peer"))
    assert srv.accepted.empty()
    c = net.connect(srv.address, security=sec)
    c.send(2)
    assert c.recv(timeout=5) == 2


@pytest.mark.parametrize("name, wire, complaint", [
    ("bad magic", b"EVIL" + struct.pack("<IQ", 1, 4) + b"abcd", "bad frame header"),
    ("huge frame", b"HSm1" + struct.pack("<IQ", 1, 2**40), "comm.max-frame-bytes"),
    ("too many frames", b"HSm1" + struct.pack("<I", 10**7), "comm.max-frames"),
    ("zero frames", b"HSm1" + struct.pack("<I", 0), "comm.max-frames"),
    ("garbage pickle", b"HSm1" + struct.pack("<IQ", 1, 12) + b"not a pickle", "undecodable message"),
])
def test_malformed_frames_close_the_comm_not_the_server(net, comm_log, name, wire, complaint):
    sec = Security.generate()
    srv = net.serve(security=sec, echo=False)
    s = authenticated_raw_socket(net, srv.address, sec.secret)
    server_side = srv.accepted.get(timeout=5)
    s.sendall(wire)
    with pytest.raises(CommClosedError, match=complaint):
        server_side.recv(timeout=5)
    assert server_side.closed
    assert read_until_eof(s) == b""  # the server hung up on the peer
    assert logged(comm_log, "closing comm with tcp://127.0.0.1:", complaint)
    c = net.connect(srv.address, security=sec)  # the listener is unaffected
    srv.accepted.get(timeout=5).send(f"still serving after {name}")
    assert c.recv(timeout=5) == f"still serving after {name}"


def test_a_valid_raw_message_is_accepted(net):
    """The hand-made frames above fail for the stated reason, not for bad framing."""
    sec = Security.generate()
    srv = net.serve(security=sec, echo=False)
    s = authenticated_raw_socket(net, srv.address, sec.secret)
    server_side = srv.accepted.get(timeout=5)
    import pickle
    payload = pickle.dumps({"op": "hello"}, protocol=5)
    s.sendall(b"HSm1" + struct.pack("<IQ", 1, len(payload)) + payload)
    assert server_side.recv(timeout=5) == {"op": "hello"}
    # a header larger than the receive buffer (40,000 frames; unused buffers are ignored)
    n = 40_000
    s.sendall(b"HSm1" + struct.pack(f"<I{n}Q", n, len(payload), *[0] * (n - 1)) + payload)
    assert server_side.recv(timeout=5) == {"op": "hello"}


def test_many_pending_handshakes_do_not_block_accepts(net):
    with config.set({"comm.timeouts.handshake": 5.0}):
        sec = Security.generate()
        srv = net.serve(security=sec)
        for _ in range(10):  # silent peers each occupy a handshake thread
            net.raw(srv.address)
        t0 = time.monotonic()
        c = net.connect(srv.address, security=sec)
        c.send("fast")
        assert c.recv(timeout=5) == "fast"
        assert time.monotonic() - t0 < 2


# ---------------------------------------------------------------- TLS
def test_tls_round_trip(net, tls_files):
    cert, key = tls_files
    secret = Security.generate().secret
    server_sec = Security(secret=secret, tls_cert=cert, tls_key=key)
    client_sec = Security(secret=secret, tls_ca=cert)
    srv = net.serve(security=server_sec)
    c = net.connect(srv.address, security=client_sec)
    arr = np.arange(2**20, dtype="f8")  # 8 MiB both ways while the reader decrypts
    c.send({"op": "tls", "x": arr})
    back = c.recv(timeout=20)
    np.testing.assert_array_equal(back["x"], arr)
    for i in range(50):
        c.send(i)
    assert [c.recv(timeout=5) for _ in range(50)] == list(range(50))


def test_tls_mutual_and_tls_scheme(net, tls_files):
    cert, key = tls_files
    sec = Security(secret=Security.generate().secret, tls_cert=cert, tls_key=key, tls_ca=cert)
    srv = net.serve("tls://127.0.0.1:0", security=sec)  # the CA makes it check client certificates
    assert srv.address.startswith("tls://")
    c = net.connect(srv.address, security=sec)
    c.send("mutual")
    assert c.recv(timeout=5) == "mutual"


def connect_soon(net, address: str, security: Security | None, timeout: float = 5.0):
    """``registry.connect_soon``, waited for: the comm, or the error it called back with."""
    got: queue.Queue = queue.Queue()
    assert registry.connect_soon(address, lambda c, e: got.put((c, e)), timeout, security)
    comm, error = got.get(timeout=timeout + 10)
    if comm is not None:
        net.comms.append(comm)
    return comm, error


@pytest.mark.timeout(60)
def test_connect_soon_over_tls_and_plain_with_secrets(net, tls_files):
    """The handshake run on the I/O thread gives the same comm as ``connect``: over TLS with
    mutual certificates, and in clear with a secret; a wrong secret or missing TLS is
    called back as the same HandshakeError, at once."""
    cert, key = tls_files
    sec = Security(secret=Security.generate().secret, tls_cert=cert, tls_key=key, tls_ca=cert)
    srv = net.serve("tls://127.0.0.1:0", security=sec)
    c, error = connect_soon(net, srv.address, sec)
    assert error is None
    arr = np.arange(2**18, dtype="f8")
    c.send({"x": arr})
    np.testing.assert_array_equal(c.recv(timeout=20)["x"], arr)
    plain = net.serve(security=Security(secret=b"k" * 32))
    c, error = connect_soon(net, plain.address, Security(secret=b"k" * 32))
    c.send("plain")
    assert error is None and c.recv(timeout=5) == "plain"
    t0 = time.monotonic()
    _, error = connect_soon(net, plain.address, Security(secret=b"z" * 32))
    assert isinstance(error, HandshakeError) and "wrong secret" in str(error)
    _, error = connect_soon(net, srv.address.replace("tls://", "tcp://"), None)
    assert isinstance(error, HandshakeError) and "requires TLS" in str(error)
    assert time.monotonic() - t0 < 5
    assert not registry.connect_soon("tcp://localhost:1", lambda c, e: None)  # a host name


def test_plain_client_to_tls_server_fails_clearly(net, tls_files, comm_log):
    cert, key = tls_files
    srv = net.serve(security=Security(tls_cert=cert, tls_key=key))
    with pytest.raises(HandshakeError, match="requires TLS"):
        registry.connect(srv.address, 5, None)
    with pytest.raises(HandshakeError, match="TLS handshake .* failed"):
        # a client that trusts another CA (the system's) rejects the self-signed certificate
        registry.connect(srv.address.replace("tcp://", "tls://"), 5, None)


def test_bad_tls_files_are_named():
    with pytest.raises(ValueError, match="/nonexistent/cert.pem"):
        tcp_backend.TCPListener("tcp://127.0.0.1:0", lambda c: None,
                                Security(tls_cert="/nonexistent/cert.pem"))
