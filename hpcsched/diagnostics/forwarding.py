"""What tasks print and log, shown by the client that asked for it.

dask offers ``Client.forward_logging`` (log records of tasks handled again by the same
logger in the client) and ``distributed.print`` / ``distributed.warn`` (output of a task
printed by the clients too): https://distributed.dask.org/en/stable/api.html. Here:

* ``client.forward_logging(logger_name=None, level=logging.NOTSET)``: as dask's;
* ``client.forward_print()``: what tasks print (``print``, ``sys.stdout`` / ``sys.stderr``)
  printed by this client too; ``forward_print(tasks=False)``: only what they print with
  ``hpcsched.print`` / ``hpcsched.warn``;
* :func:`print` / :func:`warn` (``hpcsched.print``, ``hpcsched.warn``): in a task, print
  on the worker (kept with the task, :mod:`hpcsched.core.worker.tasks.output`) and on
  every client that called ``forward_print`` or ``forward_logging``. (Differs from dask,
  whose clients all show them: a client shows tasks' output once it asked.)

How: the client registers a worker plugin (:class:`ForwardOutput`) on every worker,
present and future, and reads a scheduler queue of its own (``hpcsched-output-<client
id>``) on a thread. On each worker the plugin collects the lines (a forwarder of
:mod:`~hpcsched.core.worker.tasks.output`) and log records (a ``logging.Handler``) of its
tasks and puts them on that queue in batches, at most every :data:`FLUSH_SECONDS`, from a
thread of its own: a task that prints never waits for the network. A queue that nobody
reads (its client gone) takes at most :data:`MAX_BATCHES` batches; a worker that cannot
keep up drops lines past :data:`MAX_PENDING` and says how many.
"""

from __future__ import annotations

import builtins
import logging
import sys
import threading
from typing import Any

from hpcsched.core.worker.context import current
from hpcsched.core.worker.plugins import WorkerPlugin
from hpcsched.core.worker.tasks import output

QUEUE_PREFIX = "hpcsched-output-"
FLUSH_SECONDS = 0.1
MAX_BATCHES = 1000
MAX_PENDING = 10_000


def print(*args: Any, **kwargs: Any) -> None:  # noqa: A001 - dask's name, distributed.print
    """``print`` in a task, shown by every client that asked for tasks' output too
    (dask's ``distributed.print``). Outside a task, the built-in ``print``."""
    file = kwargs.pop("file", None)
    if file not in (None, sys.stdout, sys.stderr):
        builtins.print(*args, file=file, **kwargs)
        return
    stream = "stderr" if file is sys.stderr else "stdout"
    sep, end = kwargs.pop("sep", " "), kwargs.pop("end", "\n")
    kwargs.pop("flush", None)
    if kwargs:
        raise TypeError(f"print() got unexpected keyword arguments {sorted(kwargs)}")
    text = ("" if sep is None else sep).join(map(str, args)) + ("\n" if end is None else end)
    output.write_explicit(stream, text)


def warn(*args: Any, **kwargs: Any) -> None:
    """:func:`print` to ``sys.stderr`` (dask's ``distributed.warn``)."""
    kwargs["file"] = sys.stderr
    print(*args, **kwargs)


class _Sender:
    """Batches of one worker's lines and records, put on a client's queue by a thread."""

    def __init__(self, worker: Any, queue: str) -> None:
        self.worker = worker
        self.queue = queue
        self._pending: list = []
        self._dropped = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="hpcsched-forward-output")
        self._thread.start()

    def add(self, item: tuple) -> None:
        with self._lock:
            if len(self._pending) < MAX_PENDING:
                self._pending.append(item)
            else:
                self._dropped += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _take(self) -> list:
        with self._lock:
            items, self._pending = self._pending, []
            dropped, self._dropped = self._dropped, 0
        if dropped:
            items.append(("out", "stderr", f"[{dropped} lines of output not forwarded: "
                                           "more than the client could take]\n"))
        return items

    def _run(self) -> None:
        from hpcsched.core.client.client import Client
        from hpcsched.core.client.coordination import Queue

        client = None
        try:
            while True:
                stopping = self._stop.wait(FLUSH_SECONDS)
                items = self._take()
                if items:
                    if client is None:
                        client = Client(self.worker.scheduler_address,
                                        security=self.worker.security, set_as_default=False,
                                        name=f"forward-{self.worker.name}")
                        queue = Queue(self.queue, client=client)
                    if queue.qsize() < MAX_BATCHES:
                        queue.put(items)
                if stopping:
                    return
        except Exception:  # noqa: BLE001 - forwarding ends; the tasks go on
            logging.getLogger("hpcsched.worker").exception("forwarding output to %s",
                                                           self.queue)
        finally:
            if client is not None:
                client.close()


class _Handler(logging.Handler):
    """Log records of tasks, as dicts (dask's ForwardLoggingPlugin sends them so)."""

    def __init__(self, sender: _Sender, level: int) -> None:
        super().__init__(level)
        self.sender = sender

    def emit(self, record: logging.LogRecord) -> None:
        if current() is None:  # the worker's own records stay in its log
            return
        d = dict(record.__dict__)
        d["msg"] = record.getMessage()
        d["args"] = None
        d["exc_info"] = None
        if record.exc_info:
            d["exc_text"] = self.format(record).partition("\n")[2] or record.exc_text
        self.sender.add(("log", d))


class ForwardOutput(WorkerPlugin):
    """On each worker: its tasks' output (``prints``: everything they print, else only
    ``hpcsched.print``'s) or log records (``logger_name`` at ``level``, with ``logs``)
    put on the scheduler queue ``queue``."""

    def __init__(self, queue: str, *, prints: bool = False, logs: bool = False,
                 logger_name: str | None = None, level: int = logging.NOTSET) -> None:
        self.queue = queue
        self.prints = prints
        self.logs = logs
        self.logger_name = logger_name
        self.level = level
        self._sender: _Sender | None = None
        self._handler: _Handler | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_sender": None, "_handler": None}

    def setup(self, worker: Any) -> None:
        sender = self._sender = _Sender(worker, self.queue)
        if self.logs:
            self._handler = _Handler(sender, self.level)
            logging.getLogger(self.logger_name).addHandler(self._handler)
        else:
            output.forwarders.append(self._forward)

    def _forward(self, stream: str, text: str, explicit: bool) -> None:
        if (self.prints or explicit) and self._sender is not None:
            self._sender.add(("out", stream, text))

    def teardown(self, worker: Any) -> None:
        if self._handler is not None:
            logging.getLogger(self.logger_name).removeHandler(self._handler)
        elif self._forward in output.forwarders:
            output.forwarders.remove(self._forward)
        if self._sender is not None:
            self._sender.close()


class _Receiver:
    """The client's side: a thread taking the batches off its queue and showing them."""

    def __init__(self, client: Any, queue: str) -> None:
        from hpcsched.core.client.coordination import Queue

        self.client = client
        self.queue = Queue(queue, client=client)
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="hpcsched-forwarded-output")
        self.thread.start()

    def _run(self) -> None:
        while self.client.status == "running":
            try:
                batch = self.queue.get(timeout=0.5)
            except TimeoutError:
                continue
            except Exception:  # noqa: BLE001 - the client closed meanwhile
                if self.client.status != "running":
                    return
                raise
            show(batch)


def show(batch: list) -> None:
    """Print a batch's lines on this process's stdout / stderr, and handle its log
    records with the loggers they were made by."""
    for item in batch:
        if item[0] == "out":
            stream = sys.stderr if item[1] == "stderr" else sys.stdout
            stream.write(item[2])
            stream.flush()
        elif item[0] == "log":
            record = logging.makeLogRecord(item[1])
            logging.getLogger(record.name).handle(record)


_receivers: dict[str, _Receiver] = {}
_receivers_lock = threading.Lock()


def forward(client: Any, kind: str, logger_name: str | None = None,
            level: int = logging.NOTSET, tasks: bool = True) -> None:
    """``Client.forward_logging`` (``kind="logging"``) and ``Client.forward_print``
    (``kind="print"``): the plugin on the workers, the reader here (one per client)."""
    if kind not in ("logging", "print"):
        raise ValueError(f"forward: kind must be 'logging' or 'print', got {kind!r}")
    if not isinstance(level, int):
        raise TypeError(f"forward_logging: level must be an int (logging.INFO...), got {level!r}")
    queue = QUEUE_PREFIX + client.id
    if kind == "logging":
        plugin = ForwardOutput(queue, logs=True, logger_name=logger_name, level=level)
        name = f"{queue}-logging-{logger_name or ''}"
    else:
        plugin = ForwardOutput(queue, prints=bool(tasks))
        name = f"{queue}-print"
    with _receivers_lock:
        if queue not in _receivers or not _receivers[queue].thread.is_alive():
            _receivers[queue] = _Receiver(client, queue)
    client.register_plugin(plugin, name=name)
