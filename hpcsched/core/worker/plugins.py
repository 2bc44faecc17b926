"""The base class of worker plugins, as distributed's ``WorkerPlugin``
(https://distributed.dask.org/en/stable/plugins.html#worker-plugins).

A client registers one (``Client.register_plugin``, :mod:`hpcsched.core.client.plugins`);
the worker sets it up, calls its ``transition`` hook and tears it down
(:mod:`hpcsched.core.worker.control`).
"""

from __future__ import annotations

from typing import Any


class WorkerPlugin:
    """Base class of worker plugins.

    Override ``setup(worker)``, ``teardown(worker)``,
    ``transition(key, start, finish, **kwargs)``.
    """

    def setup(self, worker: Any) -> None:
        """Run when the plugin reaches a worker."""

    def teardown(self, worker: Any) -> None:
        """Run when the plugin is replaced or unregistered, or the worker closes."""

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """A task of this worker changed state.

        ``finish`` is "forgotten" when the worker drops it. Runs on the worker's loop
        thread, so keep it short. An exception is logged, the worker goes on.
        """
