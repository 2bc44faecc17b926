"""A worker's side of cluster control: ``run`` a function, receive an uploaded file, set up
and tear down worker plugins, and call their ``transition`` hook.

The scheduler relays these from a client (see :mod:`hpcsched.core.scheduler.control`).
``run`` executes on a thread of its own, never on the worker's loop (which
must keep serving) nor in the task pool (which may be full): the function may
take as long as it likes, and may call back into the cluster. Its answer goes
back through the loop as a ``run-reply``.

An uploaded file is written into the worker's ``local_directory`` (a private
temporary one if it has none), which is put on ``sys.path``; a ``.py`` file is
then imported (reloaded if it was already), a ``.zip``/``.egg`` put on
``sys.path`` itself, as distributed's ``upload_file`` does.

A plugin's ``transition(key, start, finish, stimulus_id=...)`` is called on the
worker's loop thread for each task state change, as distributed's
``WorkerPlugin.transition``
(https://distributed.dask.org/en/stable/plugins.html#worker-plugins), after
the event that caused it is handled (the state is consistent then). The state
machine records changes only while a plugin defines the hook, so that a worker
without one pays nothing for it; an exception in the hook is logged, the
worker goes on.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol

from hpcsched.core.comm.loop import Loop
from hpcsched.core.protocol.calls import call_hook, call_with, check_filename, error_reply
from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.serialize import dumps_object, loads_function, loads_object
from hpcsched.core.protocol.worker import (
    PluginAdd,
    PluginRemove,
    PluginsReset,
    RunOnWorker,
    RunReply,
    UploadFile,
)
from hpcsched.core.state.worker_state import WorkerState
from hpcsched.core.worker.plugins import WorkerPlugin

logger = logging.getLogger("hpcsched.worker")

#: the scheduler's requests this module serves (the worker's table of handlers sends the
#: types of :attr:`WorkerControl.handlers` to :meth:`WorkerControl.handle`)
Request = RunOnWorker | UploadFile | PluginAdd | PluginRemove | PluginsReset


class ControlledWorker(Protocol):
    """What cluster control uses of its worker (the
    :class:`~hpcsched.core.worker.server.Worker`, which imports this module); the worker
    itself is what ``Client.run``'s functions get as ``dask_worker`` and plugins as
    ``worker``, as in dask."""

    state: WorkerState | None
    loop: Loop
    local_directory: str | None


class WorkerControl:
    """``handle(request)`` on the loop thread; ``send(reply)`` queues a ``RunReply`` to the
    scheduler from any thread."""

    handlers = Handlers("worker control")

    def __init__(self, worker: ControlledWorker, send: Callable[[RunReply], None]):
        self.worker = worker
        self.send = send
        self._lock = threading.Lock()
        self._made: str | None = None  # a temporary directory this worker made: removed at close
        self.plugins: dict[str, Any] = {}  # name -> worker plugin set up here
        # the plugins with a transition hook, each with whether it takes stimulus_id= (read
        # on the loop)
        self._watching: tuple[tuple[Any, bool], ...] = ()
        self._table = self.handlers.bind(self)

    def cleanup(self) -> None:
        """Tear the plugins down and remove the temporary directory made for uploads (the
        worker is closing)."""
        with self._lock:
            plugins, self.plugins = list(self.plugins.items()), {}
        for name, plugin in plugins:
            self._teardown(name, plugin)
        with self._lock:
            made, self._made = self._made, None
        if made is not None:
            import shutil  # here, as tempfile below: most workers never make a directory

            shutil.rmtree(made, ignore_errors=True)

    def handle(self, request: Request) -> None:
        """Carry out one of the scheduler's control requests (on the loop thread)."""
        self._table[type(request)](request)

    @handlers.on(UploadFile)
    def _on_upload(self, request: UploadFile) -> None:
        self._upload(request)  # at once: the tasks that follow may import it

    @handlers.on(PluginAdd)
    def _on_plugin_add(self, request: PluginAdd) -> None:
        if request.request_id == "replay":  # a worker that just joined: before any task
            self._plugin(request)
        else:
            _thread(self._plugin, request)

    @handlers.on(PluginRemove)
    def _on_plugin_remove(self, request: PluginRemove) -> None:
        _thread(self._plugin, request)

    @handlers.on(PluginsReset)
    def _on_plugins_reset(self, request: PluginsReset) -> None:
        _thread(self._reset, request)

    @handlers.on(RunOnWorker)
    def _on_run(self, request: RunOnWorker) -> None:
        _thread(self._run, request)

    def _run(self, request: RunOnWorker) -> None:
        try:
            fn = loads_function(request.function)
            args = loads_object(request.args) if request.args else ()
            kwargs = loads_object(request.kwargs) if request.kwargs else {}
            result = call_with(fn, tuple(args), dict(kwargs), "dask_worker", self.worker)
            reply: dict[str, Any] = {"status": "OK", "result": dumps_object(result if request.wait else None)}
        except Exception as e:  # noqa: BLE001 - the user's function: its error goes back
            reply = error_reply(e)
        self.send(RunReply(request.request_id, **reply))

    def _plugin(self, request: PluginAdd | PluginRemove) -> None:
        """Set up a plugin (``setup(worker=)``; one of the same name is torn down first), or
        tear one down; on a thread of its own, as ``run``."""
        name = str(request.name)
        try:
            with self._lock:
                old = self.plugins.pop(name, None)
            if old is not None:
                self._teardown(name, old)
            if isinstance(request, PluginAdd):
                plugin = loads_object(request.plugin)
                call_hook(plugin, "setup", worker=self.worker)
                with self._lock:
                    self.plugins[name] = plugin
            self._watch()
            reply: dict[str, Any] = {"status": "OK", "result": dumps_object({"status": "OK"})}
        except Exception as e:  # noqa: BLE001 - the user's plugin: its error goes back
            logger.warning("worker plugin %s: %s failed: %s", name, type(request).__name__, e)
            reply = error_reply(e)
        self.send(RunReply(request.request_id, **reply))

    def _reset(self, request: PluginsReset) -> None:
        """``Client.restart``: every plugin torn down and set up again."""
        try:
            with self._lock:
                plugins = list(self.plugins.items())
            for name, plugin in plugins:
                if getattr(plugin, "in_nanny", False):
                    continue  # a nanny plugin lives in the worker's nanny: kept as it is
                self._teardown(name, plugin)
                call_hook(plugin, "setup", worker=self.worker)
            reply: dict[str, Any] = {"status": "OK", "result": dumps_object(None)}
        except Exception as e:  # noqa: BLE001 - the user's plugin: its error goes back
            reply = error_reply(e)
        self.send(RunReply(request.request_id, **reply))

    def _watch(self) -> None:
        """Have the state machine report state changes while a plugin wants them."""
        with self._lock:
            watching = tuple((p, takes_stimulus_id(p.transition))
                             for p in self.plugins.values() if has_transition(p))

        def install() -> None:  # on the loop: the state machine is the loop's alone
            self._watching = watching
            assert self.worker.state is not None  # the worker started: plugins come after
            self.worker.state.watch_transitions(self._transitions if watching else None)

        self.worker.loop.call(install)

    def _transitions(self, changes: list, stimulus_id: str) -> None:
        for key, start, finish in changes:
            for plugin, takes in self._watching:
                try:
                    if takes:  # distributed's hook takes **kwargs for such extras
                        plugin.transition(key, start, finish, stimulus_id=stimulus_id)
                    else:
                        plugin.transition(key, start, finish)
                except Exception:  # noqa: BLE001 - a plugin's error is not the worker's
                    logger.exception("worker plugin %r failed in transition(%r, %r, %r)",
                                     plugin, key, start, finish)

    def _teardown(self, name: str, plugin: Any) -> None:
        try:
            call_hook(plugin, "teardown", worker=self.worker)
        except Exception:  # noqa: BLE001 - the worker goes on without it
            logger.exception("worker plugin %s failed to tear down", name)

    def directory(self) -> str:
        """The worker's directory for files, made (and put on ``sys.path``) on first use."""
        with self._lock:
            d = self.worker.local_directory
            if d is None:
                import tempfile

                d = self.worker.local_directory = tempfile.mkdtemp(prefix="hpcsched-worker-")
                self._made = d
            os.makedirs(d, exist_ok=True)
            if d not in sys.path:
                sys.path.insert(0, d)
            return d

    def _upload(self, request: UploadFile) -> None:
        try:
            name = check_filename(request.filename)
            data = request.data
            if not isinstance(data, bytes):
                raise TypeError("UploadFile: data must be bytes")
            path = os.path.join(self.directory(), name)
            tmp = f"{path}.{os.getpid()}.part"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # a reader never sees half a file
            if request.load:
                load(path)
            reply: dict[str, Any] = {"status": "OK", "result": dumps_object(path)}
        except Exception as e:  # noqa: BLE001 - a bad file errs the upload, not the worker
            logger.warning("upload of %r failed: %s", request.filename, e)
            reply = error_reply(e)
        self.send(RunReply(request.request_id, **reply))


# workers in one process (LocalCluster(processes=False)) share sys.modules: one loading
# while another pops the same name from it made the import fail with a KeyError
_LOAD_LOCK = threading.Lock()


def load(path: str) -> None:
    """Make an uploaded file usable: import a module, put an archive on ``sys.path``."""
    with _LOAD_LOCK:
        _load(path)


def _load(path: str) -> None:
    root, ext = os.path.splitext(os.path.basename(path))
    if ext in (".zip", ".egg", ".whl"):
        if path not in sys.path:
            sys.path.insert(0, path)
        return
    if ext == ".py":
        importlib.invalidate_caches()
        module = sys.modules.get(root)
        if module is not None and getattr(module, "__file__", None) == path:
            importlib.reload(module)
        else:
            sys.modules.pop(root, None)
            importlib.import_module(root)


def takes_stimulus_id(hook: Callable) -> bool:
    """Does ``hook`` accept ``stimulus_id=`` (by name or ``**kwargs``, as distributed's
    ``WorkerPlugin.transition(key, start, finish, **kwargs)``)? A hook written with three
    parameters only is still called, without it."""
    try:
        params = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is p.VAR_KEYWORD or (p.name == "stimulus_id" and p.kind is not
                                           p.POSITIONAL_ONLY) for p in params)


def has_transition(plugin: Any) -> bool:
    """Does ``plugin`` define a ``transition`` hook (not only inherit our base's no-op)?"""
    hook = getattr(type(plugin), "transition", None)
    return callable(hook) and hook is not WorkerPlugin.transition


def _thread(target: Callable[[Any], None], request: Any) -> None:
    """Carry ``request`` out on a thread of its own: a user's function or plugin may take
    as long as it likes, and call back into the cluster."""
    threading.Thread(target=target, args=(request,), daemon=True,
                     name=f"hpcsched-{type(request).__name__}").start()
