"""The dashboard's HTTP server: pages, JSON snapshots, ``/metrics``; a token on every request.

Why the standard library's ``http.server`` and not bokeh (dask's choice): the
pages are static files that draw JSON snapshots on a ``<canvas>`` with one small
shipped script, so the server only hands out files and cached JSON — a few
requests a second from a handful of browsers. Bokeh would cost the scheduler's
process about a second and 50 MB to import, run a tornado loop that builds
document diffs in Python on the scheduler's GIL, and ship 1.3 MB of
JavaScript; ``http.server`` costs nothing until a page is opened and adds no
dependency. Each connection gets a thread (``ThreadingHTTPServer``); none of
them touches scheduler state (they read :class:`~.extension.Diagnostics`
snapshots, taken on the scheduler's thread).

Access: the token travels in the link (``?token=...``), as Jupyter's does.
A request with the right token gets it back as a cookie scoped to this
port's name, so the page's own requests need not repeat it; Prometheus sends
it as ``Authorization: Bearer <token>``. Anything else gets 403. Tokens are
compared in constant time.

A port already taken does not fail the cluster: the server takes a free port
and says so in the log (as dask does), so many clusters can run at once.
"""

from __future__ import annotations

import hmac
import json
import logging
import selectors
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

logger = logging.getLogger("hpcsched.diagnostics")

PAGES = ("status", "tasks", "workers", "events")
STATIC = {"dashboard.js": "text/javascript; charset=utf-8",
          "dashboard.css": "text/css; charset=utf-8"}
REQUEST_TIMEOUT = 30.0  # seconds an idle keep-alive connection holds its thread


def static_text(name: str) -> str:
    return resources.files("hpcsched.diagnostics").joinpath("static").joinpath(name).read_text("utf-8")


def page_html(page: str, data: str = "") -> str:
    """The HTML of ``page``: one shell, the script draws the rest. ``data`` (JSON) and the
    inlined assets make a self-contained file (the performance report)."""
    nav = "".join(f'<a href="/{p}" class="{"on" if p == page else ""}">{p}</a>'
                  for p in PAGES) if page in PAGES else ""
    if data:
        head = f"<style>{static_text('dashboard.css')}</style>"
        tail = (f'<script id="data" type="application/json">{data}</script>'
                f"<script>{static_text('dashboard.js')}</script>")
    else:
        head = '<link rel="stylesheet" href="/static/dashboard.css">'
        tail = '<script src="/static/dashboard.js"></script>'
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>hpcsched {page}</title>'
            f'<meta name="viewport" content="width=device-width">{head}</head>'
            f'<body data-page="{page}"><header><b>hpcsched</b><nav>{nav}</nav>'
            f'<span id="clock"></span></header><main id="main"></main>{tail}</body></html>')


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False  # a port in use must be seen as such (fallback below)

    def __init__(self, listener: socket.socket, handler: type, owner: DashboardServer):
        """Serve on ``listener``, bound and listening already."""
        self.owner = owner
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.address_family = listener.family
        self._stopping = False
        super().__init__(listener.getsockname(), handler, bind_and_activate=False)
        self.socket.close()
        self.socket = listener
        self.server_address = listener.getsockname()
        self._waker, self._woken = socket.socketpair()  # closed by server_close

    def serve(self) -> None:
        """Accept connections until :meth:`stop`, which wakes this at once (``serve_forever``
        would notice only at its next poll, so a scheduler's close would wait for it)."""
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._woken, selectors.EVENT_READ)
            while not self._stopping:
                for key, _ in selector.select():
                    if key.fileobj is self and not self._stopping:
                        self._handle_request_noblock()  # type: ignore[attr-defined]

    def stop(self) -> None:
        self._stopping = True
        try:
            self._waker.send(b"\0")
        except OSError:  # stopped already
            pass

    def server_close(self) -> None:
        super().server_close()
        self._waker.close()
        self._woken.close()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that went away mid-answer is no error worth a traceback on stderr."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            logger.debug("dashboard connection from %s: %s", client_address[0], exc)
        else:
            logger.warning("dashboard request from %s failed", client_address[0],
                           exc_info=True)

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.connections.discard(request)
        super().shutdown_request(request)


class DashboardServer:
    """Serves ``diagnostics`` (a :class:`~.extension.Diagnostics`) on ``listener`` (a
    listening socket, :func:`~.extension.listen`)."""

    def __init__(self, diagnostics: Any, listener: socket.socket):
        self.diagnostics = diagnostics
        self.httpd = _Server(listener, _Handler, self)
        self.host = listener.getsockname()[0]
        self.port = listener.getsockname()[1]
        self.cookie = f"hpcsched-token-{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve,
                                        name=f"hpcsched-dashboard:{self.port}", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and end every connection's thread (they block on their socket)."""
        self.httpd.stop()
        self._thread.join(timeout)
        self.httpd.server_close()
        with self.httpd.lock:
            conns = list(self.httpd.connections)
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def authorized(self, handler: BaseHTTPRequestHandler, query: dict) -> tuple[bool, bool]:
        """(allowed, token came in the query: set the cookie)."""
        token = self.diagnostics.token
        given = query.get("token", [None])[0]
        if given is not None:
            return hmac.compare_digest(given.encode(), token.encode()), True
        auth = handler.headers.get("Authorization") or ""
        scheme, _, value = auth.partition(" ")
        if scheme.lower() in ("bearer", "token") and value:
            return hmac.compare_digest(value.strip().encode(), token.encode()), False
        for part in (handler.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie:
                return hmac.compare_digest(value.encode(), token.encode()), False
        return False, False


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT
    server_version = "hpcsched-dashboard"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        logger.debug("dashboard %s: " + format, self.client_address[0], *args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        owner = self.server.owner
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        ok, from_query = owner.authorized(self, query)
        if not ok:
            self._send(HTTPStatus.FORBIDDEN, "text/plain; charset=utf-8",
                       b"403: this dashboard needs its token: open the link the cluster "
                       b"printed (it ends in ?token=...)\n")
            return
        extra = {}
        if from_query:
            extra["Set-Cookie"] = (f"{owner.cookie}={owner.diagnostics.token}; Path=/; "
                                   "HttpOnly; SameSite=Strict")
        path = url.path.rstrip("/") or "/status"
        try:
            self._route(path, query, extra)
        except TimeoutError:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                       b"the scheduler is busy: try again\n", extra)
        except RuntimeError as e:  # the scheduler closed under us
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                       f"{e}\n".encode(), extra)

    def _route(self, path: str, query: dict, extra: dict) -> None:
        diag = self.server.owner.diagnostics
        name = path.lstrip("/")
        if name in PAGES:
            self._send(HTTPStatus.OK, "text/html; charset=utf-8", page_html(name).encode(),
                       extra)
        elif name.startswith("static/") and name[7:] in STATIC:
            self._send(HTTPStatus.OK, STATIC[name[7:]], static_text(name[7:]).encode(), extra)
        elif name == "api/status.json":
            self._json(diag.status(), extra)
        elif name == "api/task-stream.json":
            try:  # the counts of entries the page already has (-1: none yet)
                after = [int(query.get(k, ["-1"])[0]) for k in ("tasks", "transfers")]
            except ValueError:
                self._send(HTTPStatus.BAD_REQUEST, "text/plain; charset=utf-8",
                           b"tasks= and transfers= must be integers\n", extra)
                return
            self._json(diag.task_stream(*after), extra)
        elif name == "api/events.json":
            self._json(diag.events(), extra)
        elif name == "metrics":
            try:
                from hpcsched.diagnostics.metrics import CONTENT_TYPE, exposition
            except ImportError:
                self._send(HTTPStatus.NOT_IMPLEMENTED, "text/plain; charset=utf-8",
                           b"/metrics needs prometheus_client: pip install "
                           b"'hpcsched[diagnostics]'\n", extra)
                return
            self._send(HTTPStatus.OK, CONTENT_TYPE, exposition(diag), extra)
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8",
                       f"no page {path}\n".encode(), extra)

    def _json(self, value: Any, extra: dict) -> None:
        body = json.dumps(value, separators=(",", ":"), default=str).encode()
        self._send(HTTPStatus.OK, "application/json", body, extra)

    def _send(self, status: HTTPStatus, ctype: str, body: bytes,
              extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")  # the link's token stays here
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
