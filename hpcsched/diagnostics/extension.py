"""The diagnostics extension of a scheduler: recorder, cached snapshots, dashboard server.

:func:`attach` is the ``dashboard`` seam (:mod:`hpcsched.core.seams`), which the
``scheduler.extensions`` setting lists by default, so every
:class:`~hpcsched.core.scheduler.server.Scheduler` gets it when it starts
(LocalCluster, ``hpcsched scheduler``, batch clusters, rank 0 under MPI)
without the core importing this package. It

* gives the scheduler's state a :class:`~hpcsched.diagnostics.recorder.Recorder`;
* serves the dashboard and ``/metrics`` (:mod:`hpcsched.diagnostics.server`)
  at ``diagnostics.dashboard.address`` unless that is None;
* answers clients' ``extension`` requests (task stream, worker logs, report
  data) on the scheduler's thread.

Pages read :meth:`Diagnostics.cached`, which takes a new snapshot on the
scheduler's thread at most every ``diagnostics.dashboard.refresh`` seconds
however many browsers poll.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import sqlite3
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from hpcsched.core import config
from hpcsched.core.comm.registry import backend_for
from hpcsched.core.settings import DashboardSettings
from hpcsched.diagnostics import history as history_mod
from hpcsched.diagnostics import snapshot
from hpcsched.diagnostics.recorder import Recorder

if TYPE_CHECKING:  # imported when a browser first connects: its HTTP server is not needed before
    from hpcsched.diagnostics.server import DashboardServer

logger = logging.getLogger("hpcsched.diagnostics")

NAME = "diagnostics"
DUTY_CYCLE = 0.02  # share of the scheduler's thread that snapshots may take at most


def dashboard_token(secret: bytes | None) -> str:
    """The token a dashboard link carries: derived from the cluster's secret (whoever holds
    the secret can open the dashboard; the token does not reveal the secret), random when
    the cluster has none (MPI, in-process)."""
    if not secret:
        return os.urandom(16).hex()  # as secrets.token_hex(16)
    import hashlib
    import hmac

    return hmac.new(secret, b"hpcsched dashboard token", hashlib.sha256).hexdigest()[:32]


def listen(host: str, port: int, asked: bool = True) -> socket.socket:
    """A socket listening at ``host:port`` for the dashboard; on another port when that one
    is in use. ``asked``: the port was the user's choice (not the default 8787), and
    serving elsewhere is worth a warning; for the default, the printed link says it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    def bound(p: int) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((host, p))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        return sock

    try:
        return bound(port)
    except OSError as e:
        if e.errno != errno.EADDRINUSE or port == 0:
            raise
    sock = bound(0)
    (logger.warning if asked else logger.info)(
        "port %d is already in use; the dashboard is served on port %d instead",
        port, sock.getsockname()[1])
    return sock


def _open_history(scheduler: Any) -> Any:
    """The scheduler's task history (``scheduler.history``, else beside its journal)."""
    settings = getattr(scheduler, "settings", None)
    path = getattr(settings, "history", None)
    if path is None:
        journal = getattr(scheduler, "journal", None)
        path = history_mod.default_path(None if journal is None else journal.path)
    if not path:
        return None
    workers = scheduler.state.workers

    def hosts() -> dict:
        return {a: ws.host for a, ws in list(workers.items())}

    try:
        return history_mod.History(str(path), hosts)
    except (OSError, sqlite3.Error) as e:
        logger.warning("no task history: %s cannot be written (%s)", path, e)
        return None


def attach(scheduler: Any) -> Diagnostics:
    return Diagnostics(scheduler)


class Diagnostics:
    name = NAME

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        self.recorder = Recorder()
        scheduler.state.recorder = self.recorder
        self.history = _open_history(scheduler)
        self.recorder.history = self.history
        recovery = getattr(scheduler, "recovery", None)
        if self.history is not None and recovery is not None and recovery.journal is not None:
            self.history.spool()  # its rows no later than the journal: a SIGKILL loses none
            recovery.before_sync.append(self.history.sync)
        self.refresh = float(config.read(DashboardSettings).refresh)
        self._cache: dict[Any, tuple[float, Any, float]] = {}  # what -> (time, value, cost)
        self._cache_lock = threading.Lock()
        self.server: DashboardServer | None = None
        self._listener: socket.socket | None = None
        self._wake: socket.socket | None = None  # closed to wake the thread waiting to serve
        self._server_lock = threading.Lock()
        self._closed = False
        self.link: str | None = None
        security = getattr(scheduler, "security", None)
        self.token = dashboard_token(security.secret if security is not None else None)
        address = scheduler.dashboard_address
        if address is not None:
            self._start_server(str(address))

    # ------------------------------------------------------------ dashboard server
    def _start_server(self, address: str) -> None:
        """Listen at ``address`` now (the link is printed at once) and serve from a thread
        of its own once a browser (or a scraper of ``/metrics``) first connects.

        The HTTP server's modules take ~40 ms to import: a scheduler's start does not wait
        for them, and a job nobody looks at never pays them. Under MPI, rank 0 would
        otherwise import them while it starts the scheduler and the script, every rank
        importing its own modules on the same cores.
        """
        host, _, port_text = address.rpartition(":")
        host = host.strip("[]")
        try:
            port = int(port_text or 0)
        except ValueError:
            logger.warning("diagnostics.dashboard.address %r is not host:port: no dashboard",
                           address)
            return
        if not host:
            host = self._default_host()
        try:
            asked = address != DashboardSettings().address
            listener = listen(host, port, asked)
        except OSError as e:
            logger.warning("could not serve the dashboard on %s:%s: %s", host, port, e)
            return
        self._listener = listener
        self._wake, woken = socket.socketpair()
        self._starting = threading.Thread(target=self._serve, args=(listener, woken),
                                          name="hpcsched-dashboard-start", daemon=True)
        self._starting.start()
        bound = listener.getsockname()[1]
        shown = host
        if shown in ("0.0.0.0", "::", ""):
            shown = socket.gethostname()
        self.link = f"http://{shown}:{bound}/status?token={self.token}"
        self.scheduler.services["dashboard"] = self.link
        logger.info("dashboard at %s", self.link)
        if backend_for(self.scheduler.address).reached_by_tunnel:
            self._print_tunnel(shown, bound)

    def _serve(self, listener: socket.socket, woken: socket.socket) -> None:
        try:  # sleeps until a connection waits to be accepted, or close() wakes it
            select.select([listener, woken], [], [])
        except (OSError, ValueError):  # the listener was closed meanwhile
            pass
        finally:
            woken.close()
        if self._closed:
            listener.close()
            return
        from hpcsched.diagnostics.server import DashboardServer

        with self._server_lock:
            if self._closed:
                listener.close()
                return
            try:
                self.server = DashboardServer(self, listener)
            except Exception:  # noqa: BLE001 - the scheduler goes on without its dashboard
                logger.warning("the dashboard could not be served", exc_info=True)
                listener.close()

    def _default_host(self) -> str:
        """Where to listen when the address names no host: as the scheduler's transport
        says (beside its TCP address; every interface under MPI, whose rank 0 is reached
        through an ssh tunnel from the login node; loopback in-process)."""
        return backend_for(self.scheduler.address).service_host(self.scheduler.address)

    def _print_tunnel(self, host: str, port: int) -> None:
        """Rank 0 says once where the dashboard is and how to reach it from a laptop."""
        print(f"hpcsched dashboard: {self.link}\n"
              f"  from your laptop: ssh -N -L {port}:{host}:{port} <login-node>\n"
              f"  then open http://localhost:{port}/status?token={self.token}",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        with self._server_lock:
            self._closed = True
            server, self.server = self.server, None
        if self._wake is not None:
            self._wake.close()  # the thread waiting to serve sees its peer closed
        if server is not None:
            server.close()
        elif self._listener is not None:
            self._listener.close()  # not served yet: its thread will not serve it
        self.scheduler.services.pop("dashboard", None)
        if self.history is not None:
            recovery = getattr(self.scheduler, "recovery", None)
            if recovery is not None and self.history.sync in recovery.before_sync:
                recovery.before_sync.remove(self.history.sync)
            self.history.close()

    # ------------------------------------------------------------ snapshots
    def cached(self, what: str, fn: Any, max_age: float | None = None) -> Any:
        """``fn(scheduler, recorder, now)`` run on the scheduler's thread, reused for
        ``max_age`` seconds (default ``diagnostics.dashboard.refresh``), or longer when it
        is costly (see ``DUTY_CYCLE``)."""
        max_age = self.refresh if max_age is None else max_age
        now = time.time()
        with self._cache_lock:
            hit = self._cache.get(what)
            # a snapshot that took the scheduler's thread c seconds is reused for at least
            # c / DUTY_CYCLE: however big the cluster, pages take at most that share of its
            # time
            if hit is not None and now - hit[0] < max(max_age, hit[2] / DUTY_CYCLE):
                return hit[1]

        def take(s: Any) -> tuple[Any, float]:
            t0 = time.perf_counter()
            return fn(s, self.recorder, now), time.perf_counter() - t0

        value, cost = self.scheduler.call(take, timeout=10.0)
        with self._cache_lock:
            self._cache[what] = (now, value, cost)
        return value

    def forget(self) -> None:
        """Drop cached snapshots: the next request takes new ones."""
        with self._cache_lock:
            self._cache.clear()

    def status(self) -> dict:
        return self.cached("status", _status_and_sample)

    def task_stream(self, after_tasks: int = -1, after_transfers: int = -1) -> dict:
        """Entries of the last minute a page has not seen yet, compact; the scheduler's
        thread only slices the ring buffers, the rest happens on the caller's."""
        def take(s: Any, rec: Any, now: float) -> dict:
            raw = snapshot.live_stream(rec, after_tasks, after_transfers)
            raw["workers"] = [[ws.address, ws.nthreads] for ws in s.state.workers.values()]
            return raw

        now = time.time()
        raw = self.scheduler.call(lambda s: take(s, self.recorder, now), timeout=10.0)
        return snapshot.compact_stream(raw, now, since=now - 60.0)

    def events(self) -> list:
        return self.cached("events", lambda s, rec, now: snapshot.events(rec))

    # ------------------------------------------------------------ client requests
    def handle(self, source: str, msg: dict) -> dict:
        """A client's request, on the scheduler's thread (see ``Scheduler._op_extension``)."""
        what = msg.get("what")
        rec = self.recorder
        if what == "task-stream":
            start = float(msg.get("start") or 0.0)
            stop = msg.get("stop")
            limit = int(msg.get("limit") or 100_000)
            return snapshot.task_stream(rec, start, None if stop is None else float(stop), limit)
        if what == "history":
            if self.history is None:
                raise ValueError("this scheduler keeps no task history: start it with "
                                 "--history FILE (or a --journal), or set scheduler.history")
            self.history.flush()
            return {"path": self.history.path}
        if what == "worker-logs":
            return {"logs": snapshot.worker_logs(rec, msg.get("workers"))}
        if what == "report":
            return self.report_data(float(msg.get("start") or 0.0), time.time())
        if what == "status":
            return _status_and_sample(self.scheduler, rec, time.time())
        if what == "dashboard-link":
            return {"link": self.link}
        raise ValueError(f"unknown diagnostics request {what!r}")

    def report_data(self, start: float, stop: float) -> dict:
        """What a performance report shows of ``[start, stop]`` (scheduler's thread)."""
        stream = snapshot.task_stream(self.recorder, start, stop, limit=100_000)
        workers = {ws.address: ws.nthreads for ws in self.scheduler.state.workers.values()}
        for w, *_ in stream["tasks"]:
            workers.setdefault(w, 1)
        return {
            "start": start, "stop": stop, "address": self.scheduler.address,
            "tasks": stream["tasks"], "transfers": stream["transfers"],
            "workers": [[w, n] for w, n in workers.items()],
            "events": snapshot.events(self.recorder, start, limit=2_000),
            "status": snapshot.status(self.scheduler, self.recorder, stop),
        }


def _status_and_sample(scheduler: Any, recorder: Any, now: float) -> dict:
    out = snapshot.status(scheduler, recorder, now)
    if now - recorder.last_sample >= 1.0:
        recorder.sample(now, (out["memory"], out["managed"], out["executing"], out["nthreads"]))
    out["samples"] = [list(s) for s in list(recorder.samples)[-600:]]
    return out
