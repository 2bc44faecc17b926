"""hpcsched as an executor of TaPS, the Task Performance Suite (arXiv:2408.07236).

    python benchmarks/taps_hpcsched.py --app synthetic ... --engine.executor hpcsched \\
        --engine.executor.workers 2 [--engine.executor.preload MODULE ...]

TaPS's own command line (``python -m taps.run``) with one more executor, ``hpcsched``,
registered through TaPS's plugin decorator (``taps.plugins.register``) as its own
executors are: TaPS itself is not changed. The executor is a ``LocalCluster`` of
``workers`` processes x ``threads`` and the client's ``get_executor()``; its futures
are ``concurrent.futures.Future``s, which TaPS's engine passes back as arguments of
later tasks (dependencies, resolved on the workers) and calls ``result()`` on in a done
callback. ``preload`` names modules each worker imports at its start (dask's
``preload``), so that an application's imports are not timed in its first task.

At the end it prints ``RESULT {"app_s": ...}``: the seconds of TaPS's own timer around
``app.run`` (its ``Finished app (elapsed=...)`` line), for ``bench_taps.py``.
"""

from __future__ import annotations

import _checkout  # noqa: F401 - this checkout's hpcsched, here and in what it starts

import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, Literal

from pydantic import Field
from taps.executor import ExecutorConfig
from taps.plugins import register


class HpcschedExecutor(Executor):
    """A client's ``get_executor()`` that also closes the client and its cluster."""

    def __init__(self, client: Any, cluster: Any):
        self.client = client
        self.cluster = cluster
        self._executor = client.get_executor()

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        return self._executor.submit(fn, *args, **kwargs)

    def map(self, fn: Callable, *iterables: Iterable, timeout: float | None = None,
            chunksize: int = 1, **kwargs: Any) -> Iterator:
        return self._executor.map(fn, *iterables, timeout=timeout, chunksize=chunksize)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        try:
            self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)
        finally:
            self.client.close()
            self.cluster.close()


@register("executor")
class HpcschedConfig(ExecutorConfig):
    """``HpcschedExecutor`` plugin configuration: a local cluster of hpcsched."""

    name: Literal["hpcsched"] = Field("hpcsched", description="Executor name.")
    workers: int = Field(2, description="Worker processes.")
    threads: int = Field(1, description="Threads per worker.")
    preload: list[str] = Field(default_factory=list,
                               description="Modules each worker imports at its start.")

    def get_executor(self) -> HpcschedExecutor:
        from hpcsched import Client, LocalCluster

        cluster = LocalCluster(n_workers=self.workers, threads_per_worker=self.threads,
                               preload=self.preload or None)
        try:
            client = Client(cluster, set_as_default=False)
        except BaseException:
            cluster.close()
            raise
        return HpcschedExecutor(client, cluster)


class _AppTime(logging.Handler):
    """Keeps the seconds of TaPS's ``Finished app (elapsed=...)`` line."""

    pattern = re.compile(r"Finished app \(elapsed=([0-9.]+)s\)")

    def __init__(self) -> None:
        super().__init__(level=logging.NOTSET)
        self.seconds: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        m = self.pattern.search(record.getMessage())
        if m:
            self.seconds = float(m.group(1))


def main() -> int:
    from taps.run.main import main as taps_main

    app_time = _AppTime()
    logging.getLogger("taps.run").addHandler(app_time)  # init_logging resets the root's only
    code = taps_main(sys.argv[1:])
    if app_time.seconds is not None:
        print("RESULT " + json.dumps({"app_s": app_time.seconds}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
