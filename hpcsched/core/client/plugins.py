"""Plugins of workers, the scheduler and nannies, registered by the client.

``Client.register_plugin``, ``register_worker_plugin``, ``unregister_worker_plugin``,
and the ``WorkerPlugin`` / ``SchedulerPlugin`` base classes, as distributed's
(https://distributed.dask.org/en/stable/plugins.html)::

    from hpcsched import Client, WorkerPlugin

    class Warm(WorkerPlugin):
        def setup(self, worker):
            worker.model = load_model()   # once per worker, and on workers joining later

    with Client() as client:
        client.register_plugin(Warm(), name="warm")

A worker plugin is pickled and sent to every worker through the scheduler,
which keeps it for workers that join later; ``setup(worker=)`` runs when it
arrives, ``teardown(worker=)`` when it is replaced, unregistered, or the
worker closes. A scheduler plugin runs in the scheduler: ``start(scheduler)``,
``add_worker(scheduler=, worker=)``, ``remove_worker(scheduler=, worker=,
stimulus_id=)``, ``close()``, and ``transition(key, start, finish,
stimulus_id=)`` for every change of a task's state (the scheduler's
``transition_log``; ``stimulus_id`` names the message that caused it), called
after the scheduler handled that message. Hooks run on the scheduler's loop
thread: keep them short; an error in one is logged and the scheduler goes on.
A worker plugin's ``transition(key, start, finish)`` is called for each change
of a task's state on its worker. A ``NannyPlugin``
runs in the process supervising a worker (``LocalCluster``, ``hpcsched worker
--nanny``) and is refused by workers nothing supervises (MPI ranks): see
:mod:`hpcsched.core.worker.nanny`.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from hpcsched.core.client.control import results
from hpcsched.core.protocol.calls import outcome
from hpcsched.core.protocol.messages import RegisterPlugin, SchedulerInfo, UnregisterPlugin
from hpcsched.core.protocol.serialize import dumps_object
from hpcsched.core.worker.plugins import WorkerPlugin

if TYPE_CHECKING:
    from hpcsched.core.client.connection import SchedulerConnection

#: how the scheduler reports a worker that left before answering (its nanny restarted it)
LEFT = "left before it answered"


class SchedulerPlugin:
    """Base class of scheduler plugins.

    Override ``start``, ``add_worker``, ``remove_worker``, ``transition``, ``close``.
    """

    def start(self, scheduler: Any) -> None:
        """Run when the plugin is registered."""

    def add_worker(self, scheduler: Any = None, worker: str | None = None) -> None:
        """A worker joined."""

    def remove_worker(self, scheduler: Any = None, worker: str | None = None,
                      **kwargs: Any) -> None:
        """A worker left."""

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   stimulus_id: str = "", **kwargs: Any) -> None:
        """Task ``key`` went from state ``start`` to ``finish`` (``forgotten``: deleted)."""

    def close(self) -> None:
        """The scheduler closes (or the plugin is replaced)."""


def _kind(plugin: Any) -> str:
    """worker, scheduler or nanny: by our base classes, else by distributed's class names."""
    if isinstance(plugin, SchedulerPlugin):
        return "scheduler"
    if isinstance(plugin, WorkerPlugin):
        return "worker"
    names = {c.__name__ for c in type(plugin).__mro__}
    if "SchedulerPlugin" in names:
        return "scheduler"
    if "NannyPlugin" in names:
        return "nanny"
    if "WorkerPlugin" in names or hasattr(plugin, "setup") or hasattr(plugin, "teardown"):
        return "worker"
    raise TypeError(f"{plugin!r} is not a WorkerPlugin or a SchedulerPlugin")


def register_plugin(conn: SchedulerConnection, plugin: Any, name: str | None = None,
                    idempotent: bool | None = None, kind: str | None = None) -> Any:
    """Register ``plugin`` (``Client.register_plugin``).

    A worker plugin returns ``{worker: {"status": "OK"}}`` and raises the first error a
    worker's ``setup`` raised.
    """
    kind = kind or _kind(plugin)
    if name is None:
        name = getattr(plugin, "name", None) or f"{type(plugin).__name__}-{uuid.uuid4()}"
    if idempotent is None:
        idempotent = bool(getattr(plugin, "idempotent", False))
    restart = kind == "nanny" and bool(getattr(plugin, "restart", False))
    if kind == "nanny":  # carried to each worker's nanny by a worker plugin
        from hpcsched.core.worker import nanny  # subprocess: imported when used

        plugin, kind = nanny.NannyRelay(str(name), plugin), "worker"
    reply = conn.request(RegisterPlugin("", kind, str(name), dumps_object(plugin),
                                        bool(idempotent)), 120.0)
    if restart:
        return results_after_restart(conn, results(reply))
    return _results(reply, kind)


def unregister_worker_plugin(conn: SchedulerConnection, name: str) -> Any:
    """Tear the worker plugin ``name`` down on every worker; ``{worker: result}``."""
    return _results(conn.request(UnregisterPlugin("", str(name)), 120.0), "worker")


def _results(reply: Any, kind: str) -> Any:
    if reply.results is None:
        ok, value = outcome(reply)
        if not ok:
            raise value
        return value
    out = {}
    for address, entry in sorted(reply.results.items()):
        ok, value = outcome(entry)
        if not ok:
            raise value
        out[address] = value
    return out


def results_after_restart(conn: SchedulerConnection, answers: dict) -> dict:
    """``register_plugin``'s answer for a ``restart=True`` nanny plugin, workers back.

    ``answers``: each worker's. A worker may have left before its answer went out (its
    nanny answered it, then restarted it): that worker is restarting, not failing; another
    error is raised."""
    out = {}
    for address, entry in sorted(answers.items()):
        if entry.get("status") != "OK" and LEFT in str(entry.get("traceback", "")):
            out[address] = {"status": "OK"}
            continue
        ok, value = outcome(entry)
        if not ok:
            raise value
        out[address] = value
    if out:
        wait_restarted(conn, list(out))
    return out


def wait_restarted(conn: SchedulerConnection, workers: list[str],
                   timeout: float = 120.0) -> None:
    """Wait until each of ``workers`` has left and as many workers are back.

    As distributed's ``register_plugin`` returns once nannies restarted their workers."""
    deadline = time.monotonic() + timeout
    old = set(workers)
    delay = 0.02
    while True:
        now = set(conn.request(SchedulerInfo(""), 30.0).info["workers"])
        if not (now & old) and len(now) >= len(old):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers restarted by a nanny plugin did not come back within "
                               f"{timeout}s: {sorted(old & now)} still there, {len(now)} of "
                               f"{len(old)} present")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
