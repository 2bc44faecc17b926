"""Cluster control on the scheduler: ``Client.run``, ``who_has``, ``upload_file``, ...

The client asks the scheduler (it talks to nobody else, as in distributed);
the scheduler answers from its state (``who-has``, ``has-what``,
``nthreads``), runs a function itself (``run-on-scheduler``), or fans a
request out to the workers and answers once each has replied or left
(``run``, ``upload-file``). Every answer is one ``control-reply`` carrying the
client's ``request_id``.

Functions, arguments and results travel as cloudpickle blobs the scheduler
relays without unpickling, except for ``run-on-scheduler``, whose function
runs here (the peer proved it holds the cluster's secret, like any client
whose tasks run on the workers). Uploaded files are kept and sent to every
worker that joins later, as distributed does with its upload-file plugin
(https://distributed.dask.org/en/stable/api.html#distributed.Client.upload_file).

``shutdown`` (``Client.shutdown``: end the scheduler and its workers, as
distributed's does) is answered here and sets :attr:`ClusterControl.shutdown_requested`;
the process that runs the scheduler (``hpcsched scheduler``, an MPI job serving
clients) watches it and ends the cluster.

Runs on the scheduler's loop thread, like every server op.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from hpcsched.core.protocol import messages as pr
from hpcsched.core.protocol.calls import call_hook, call_with, check_filename, error_reply
from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.serialize import dumps_object, loads_function, loads_object
from hpcsched.core.scheduler.interfaces import ControlHost
from hpcsched.core.state import events as ev

logger = logging.getLogger("hpcsched.scheduler")

MAX_UPLOAD = 256 * 2**20  # bytes: a file is held in the scheduler's memory for later workers


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


class ClusterControl:
    """The scheduler's side of cluster control; ``handle`` is its one entry point (one
    handler per record type: the requests of clients, and the workers' ``run-reply``)."""

    handlers = Handlers("cluster control")

    def __init__(self, scheduler: ControlHost):
        self.scheduler = scheduler
        self.files: dict[str, bytes] = {}  # uploaded: replayed to workers that join later
        self.worker_plugins: dict[str, bytes] = {}  # name -> pickled plugin: replayed too
        self.scheduler_plugins: dict[str, Any] = {}  # name -> plugin object, started here
        self._pending: dict[str, dict] = {}  # sub-request id -> fan-out in progress
        self._ids = itertools.count()
        #: a client asked for the cluster to end (``Client.shutdown``): set once
        self.shutdown_requested = threading.Event()
        scheduler.add_worker_callback(self._on_worker)
        self._table = self.handlers.bind(self)

    # ------------------------------------------------------------ dispatch
    def handle(self, source: str, msg: Any) -> None:
        """Serve ``msg``, a decoded record of one of :attr:`handlers`' types, from peer
        ``source``."""
        self._table[type(msg)](source, msg)

    @handlers.on(pr.WhoHas)
    def _who_has(self, source: str, msg: pr.WhoHas) -> None:
        keys = None if msg.keys is None else [k for k in msg.keys if _hashable(k)]
        self._reply(source, msg.request_id, result=self.scheduler.state.who_has(keys))

    @handlers.on(pr.HasWhat)
    def _has_what(self, source: str, msg: pr.HasWhat) -> None:
        state = self.scheduler.state
        self._reply(source, msg.request_id, result={
            a: state.has_what(a) for a in self._workers(msg.workers)})

    @handlers.on(pr.Processing)
    def _processing(self, source: str, msg: pr.Processing) -> None:
        state = self.scheduler.state
        self._reply(source, msg.request_id, result={
            a: state.processing(a) for a in self._workers(msg.workers)})

    @handlers.on(pr.NThreads)
    def _nthreads(self, source: str, msg: pr.NThreads) -> None:
        workers = self.scheduler.state.workers
        self._reply(source, msg.request_id, result={
            a: workers[a].nthreads for a in self._workers(msg.workers)})

    @handlers.on(pr.Run)
    def _run(self, source: str, msg: pr.Run) -> None:
        self._fan_out(source, msg.request_id, self._workers(msg.workers), lambda sub: pr.RunOnWorker(
            sub, msg.function, msg.args, msg.kwargs, msg.wait))

    @handlers.on(pr.UploadFile)
    def _upload_file(self, source: str, msg: pr.UploadFile) -> None:
        name, data = check_filename(msg.filename), msg.data
        if len(data) > MAX_UPLOAD:
            raise ev.MalformedMessage(f"UploadFile: data must be bytes of at most "
                                      f"{MAX_UPLOAD} (got {len(data)})")
        self.files[name] = data
        self._fan_out(source, msg.request_id, list(self.scheduler.state.workers),
                      lambda sub: pr.UploadFile(sub, name, data, msg.load))

    @handlers.on(pr.Restart)
    def _restart(self, source: str, msg: pr.Restart) -> None:
        # every task is cancelled (its clients hear so, workers drop its data), then each
        # worker tears its plugins down and sets them up again
        state = self.scheduler.state
        self.scheduler.handle_event(ev.CancelKeys(source, list(state.tasks), now=time.time(),
                                                  stimulus_id=self.scheduler.stimulus("restart")))
        self._fan_out(source, msg.request_id, list(state.workers), pr.PluginsReset)

    @handlers.on(pr.Shutdown)
    def _shutdown(self, source: str, msg: pr.Shutdown) -> None:
        logger.info("client %s asks the cluster to shut down", source)
        self._reply(source, msg.request_id, status="OK")
        self.shutdown_requested.set()

    @handlers.on(pr.Rebalance)
    def _rebalance(self, source: str, msg: pr.Rebalance) -> None:
        # a state-machine event: it answers once every moved key's sender dropped its copy
        workers = None if msg.workers is None else self._workers(msg.workers)
        self.scheduler.handle_event(ev.RebalanceKeys(
            msg.request_id, source, msg.keys, workers, now=time.time(),
            stimulus_id=self.scheduler.stimulus("rebalance")))

    @handlers.on(pr.UnregisterPlugin)
    def _unregister_plugin(self, source: str, msg: pr.UnregisterPlugin) -> None:
        name = self._plugin_name(msg.name)
        if name not in self.worker_plugins:
            self._reply(source, msg.request_id, **error_reply(ValueError(
                f"Could not find plugin {name!r} among the registered worker plugins")))
            return
        del self.worker_plugins[name]
        self._fan_out(source, msg.request_id, list(self.scheduler.state.workers),
                      lambda sub: pr.PluginRemove(name, sub))

    # ------------------------------------------------------------ replicas
    @handlers.on(pr.Replicate)
    def _replicate(self, source: str, msg: pr.Replicate) -> None:
        """Copy each key in memory onto workers (of ``workers``, least loaded first) until
        ``n`` of them (all: None) hold it; answers at once with ``{key: [workers that will
        hold it]}`` (the client waits for ``who_has`` to show them). Extra copies are kept."""
        state = self.scheduler.state
        keys, n = msg.keys, msg.n
        pool = [state.workers[a] for a in self._workers(msg.workers)
                if state.workers[a].status == "running"]
        want = len(pool) if n is None else min(n, len(pool))
        orders: dict[str, pr.AcquireReplicas] = {}
        result: dict = {}
        for key in keys:
            ts = state.promote(key) if _hashable(key) else None
            if ts is None or ts.state != "memory" or not ts.who_has:
                continue
            holders = sorted(ws.address for ws in ts.who_has)
            have = [ws for ws in pool if ws in ts.who_has]
            lacking = sorted((ws for ws in pool if ws not in ts.who_has),
                             key=lambda ws: (ws.nbytes, ws.address))
            targets = lacking[:max(0, want - len(have))]
            for ws in targets:
                order = orders.get(ws.address)
                if order is None:
                    order = orders[ws.address] = pr.AcquireReplicas({}, {})
                order.who_has[key] = holders
                order.nbytes[key] = ts.nbytes
            result[key] = sorted(ws.address for ws in [*have, *targets])
        for address, order in orders.items():
            self.scheduler.send(address, order)
        self._reply(source, msg.request_id, status="OK", result=result)

    # ------------------------------------------------------------ plugins
    @staticmethod
    def _plugin_name(name: str) -> str:
        if not name or len(name) > 1024:
            raise ev.MalformedMessage("RegisterPlugin: name must be a string of 1 to 1024 "
                                      "characters")
        return name

    @handlers.on(pr.RegisterPlugin)
    def _register_plugin(self, source: str, msg: pr.RegisterPlugin) -> None:
        """A worker plugin is set up on every worker (and every worker that joins later); a
        scheduler plugin here: ``start(scheduler)`` now, ``add_worker`` / ``remove_worker``
        as workers come and go, ``close()`` with the scheduler."""
        name, kind, blob, rid = self._plugin_name(msg.name), msg.kind, msg.plugin, msg.request_id
        if kind not in ("worker", "scheduler") or len(blob) > MAX_UPLOAD:
            raise ev.MalformedMessage("RegisterPlugin: kind must be worker or scheduler, "
                                      f"plugin bytes of at most {MAX_UPLOAD}")
        idempotent = msg.idempotent
        if kind == "worker":
            if idempotent and name in self.worker_plugins:
                self._reply(source, rid, status="OK", results={})
                return
            self.worker_plugins[name] = blob
            self._fan_out(source, rid, list(self.scheduler.state.workers),
                          lambda sub: pr.PluginAdd(name, blob, sub))
            return
        if idempotent and name in self.scheduler_plugins:
            self._reply(source, rid, status="OK", result=dumps_object(None))
            return
        try:
            plugin = loads_object(blob)
            old = self.scheduler_plugins.pop(name, None)
            if old is not None:
                call_hook(old, "close")
            call_hook(plugin, "start", self.scheduler)
            self.scheduler_plugins[name] = plugin
            if self.scheduler.state.transition_listener is None:
                self.scheduler.state.transition_listener = []  # for its transition hook
            reply = {"status": "OK", "result": dumps_object(None)}
        except Exception as e:  # noqa: BLE001 - the user's plugin: its error goes back
            reply = error_reply(e)
        self._reply(source, rid, **reply)

    def close(self) -> None:
        """The scheduler closes: its plugins' ``close()``."""
        for name, plugin in list(self.scheduler_plugins.items()):
            try:
                call_hook(plugin, "close")
            except Exception:  # noqa: BLE001
                logger.exception("scheduler plugin %s failed to close", name)
        self.scheduler_plugins.clear()

    # ------------------------------------------------------------ helpers
    def _workers(self, wanted: list | None) -> list[str]:
        """The workers named by ``wanted`` (addresses or names; None: all)."""
        workers = self.scheduler.state.workers
        if wanted is None:
            return list(workers)
        names = {str(w) for w in wanted}
        return [a for a, ws in workers.items() if a in names or str(ws.name) in names]

    def _reply(self, to: str, rid: str, **fields: Any) -> None:
        self.scheduler.send(to, pr.ControlReply(rid, **fields))

    @handlers.on(pr.RunOnScheduler)
    def _run_here(self, source: str, msg: pr.RunOnScheduler) -> None:
        rid = msg.request_id
        try:
            fn = loads_function(msg.function)
            args = loads_object(msg.args) if msg.args else ()
            kwargs = loads_object(msg.kwargs) if msg.kwargs else {}
            result = call_with(fn, tuple(args), dict(kwargs), "dask_scheduler", self.scheduler)
            reply = {"status": "OK", "result": dumps_object(result)}
        except Exception as e:  # noqa: BLE001 - the user's function: its error goes back
            reply = error_reply(e)
        self._reply(source, rid, **reply)

    def _fan_out(self, client: str, rid: str, workers: list[str],
                 request: Callable[[str], Any]) -> None:
        """Send each of ``workers`` ``request(sub-request id)``; answer ``client`` once each
        has replied or left."""
        fan = {"client": client, "request_id": rid, "waiting": set(workers), "results": {}}
        sub = f"control-{next(self._ids)}"
        self._pending[sub] = fan
        for w in workers:
            self.scheduler.send(w, request(sub))
        self._maybe_done(sub)

    @handlers.on(pr.RunReply)
    def _worker_replied(self, worker: str, msg: pr.RunReply) -> None:
        sub = msg.request_id
        fan = self._pending.get(sub) if sub is not None else None
        if fan is None or sub is None or worker not in fan["waiting"]:
            return
        fan["waiting"].discard(worker)
        if msg.status == "OK":
            fan["results"][worker] = {"status": "OK", "result": msg.result}
        else:
            fan["results"][worker] = {"status": "error", "exception": msg.exception,
                                      "traceback": str(msg.traceback or "")}
        self._maybe_done(sub)

    def _maybe_done(self, sub: str) -> None:
        fan = self._pending[sub]
        if fan["waiting"]:
            return
        del self._pending[sub]
        self._reply(fan["client"], fan["request_id"], status="OK", results=fan["results"])

    def transitions(self, entries: list[tuple]) -> None:
        """Call the scheduler plugins' ``transition(key, start, finish, stimulus_id=)`` for
        each logged transition (on the loop thread); a plugin's error is logged, not fatal,
        as in distributed (https://distributed.dask.org/en/stable/plugins.html)."""
        for name, plugin in list(self.scheduler_plugins.items()):
            if getattr(plugin, "transition", None) is None:
                continue
            for key, start, finish, stimulus_id, _ in entries:
                try:
                    call_hook(plugin, "transition", key, start, finish,
                              stimulus_id=stimulus_id)
                except Exception:  # noqa: BLE001 - a plugin's error is logged, not fatal
                    logger.exception("scheduler plugin %s failed in transition(%r, %s, %s)",
                                     name, key, start, finish)

    def _on_worker(self, what: str, address: str, info: dict | None) -> None:
        for name, plugin in list(self.scheduler_plugins.items()):
            try:
                extra = {"stimulus_id": self.scheduler.removal_stimulus} \
                    if what == "remove" else {}
                call_hook(plugin, f"{what}_worker", scheduler=self.scheduler, worker=address,
                          **extra)
            except Exception:  # noqa: BLE001 - a plugin's error is logged, the scheduler goes on
                logger.exception("scheduler plugin %s failed in %s_worker", name, what)
        if what == "add":
            for name, blob in self.worker_plugins.items():
                self.scheduler.send(address, pr.PluginAdd(name, blob, "replay"),
                                    before_tasks=True)
            for name, data in self.files.items():
                self.scheduler.send(address, pr.UploadFile("replay", name, data, True),
                                    before_tasks=True)
            return
        for sub in [s for s, f in self._pending.items() if address in f["waiting"]]:
            fan = self._pending[sub]
            fan["waiting"].discard(address)
            fan["results"][address] = error_reply(
                RuntimeError(f"worker {address} left before it answered"))
            self._maybe_done(sub)
