"""The Client: submit work, hold futures, gather results. Talks only to the scheduler.

Names follow dask.distributed so that scripts move over unchanged::

    from hpcsched import Client
    with Client() as client:                       # starts a LocalCluster
        x = client.submit(pow, 2, 10)
        y = client.map(lambda i: i * i, range(100))
        print(x.result(), sum(client.gather(y)))

``Client()`` without an address connects, in order, to the scheduler of this
process (``python -m hpcsched script.py`` under mpiexec), to
``HPCSCHED_SCHEDULER_ADDRESS`` / ``HPCSCHED_SCHEDULER_FILE``, or starts a
``LocalCluster`` sized to the machine and closes it with the client.

The client is collaborating parts, each given what it works with: its
connection (``SchedulerConnection``: receiving, the sender thread,
request/reply, heartbeat; :mod:`.connection`), its futures (``FutureTable``:
states, reference counts, done callbacks; :mod:`.future_state`), and, over
those two, what builds graphs (``Submitter``, :mod:`.graphs`), moves data
(``Transfers``, :mod:`.data`) and controls the cluster (``ClusterRequests``,
:mod:`.control`). It sends protocol records (:mod:`hpcsched.core.protocol.client`);
each message the scheduler sends is decoded and handed to its handler by
record type (``Client.handlers``, the :class:`~hpcsched.core.protocol.dispatch.Handlers`
convention); a malformed message, or one its handler cannot take, is logged
with its op and dropped.

A client whose scheduler is lost for good (its cluster closed, or it vanished
and did not come back) has its futures err, then releases itself as ``close``
does, with ``status`` ``"disconnected"``: its threads end, and nothing of the
process (the default client, dask's scheduler setting, atexit) keeps it or its
cluster alive.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import logging
import reprlib
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from hpcsched.core import config, seams
from hpcsched.core.client import datasets as dataset_ops
from hpcsched.core.client import plugins, versions
from hpcsched.core.client.collections import (
    DaskClaim,
    become_dask_scheduler,
    call_annotations,
    restore_dask_scheduler,
    timed,
)
from hpcsched.core.client.connection import (
    CLOSE_REQUEST,
    SchedulerConnection,
    locate_scheduler,
    open_comm,
)
from hpcsched.core.client.control import ClusterRequests
from hpcsched.core.client.data import Transfers, pack_futures  # noqa: F401 - re-exported
from hpcsched.core.client.executor import ClientExecutor
from hpcsched.core.client.future_state import FutureTable
from hpcsched.core.client.futures import (  # noqa: F401 - re-exported: the public names live here too
    CancelledError,
    DoneAndNotDoneFutures,
    Future,
    FutureGroup,
    FutureState,
    RemoteTraceback,
    as_completed,
    collect_futures,
    finish_all,
    fire_and_forget,
    futures_of,
    progress,
    run_callback,
    wait,
    wait_futures,
)
from hpcsched.core.client.graphs import Submitter
from hpcsched.core.client.submission import (  # noqa: F401 - funcname/task_run_spec re-exported
    as_list,
    funcname,
    pure_token,
    task_run_spec,
)
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import Security
from hpcsched.core.comm.scheduler_file import (  # noqa: F401 - re-exported
    looks_like_scheduler_file,
    read_scheduler_file,
    wait_for_scheduler_file,
    write_scheduler_file,
)
from hpcsched.core.graph.dsk import GraphError
from hpcsched.core.protocol import messages as pc
from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.protocol.serialize import serialize
from hpcsched.core.settings import ClientSettings, CommSettings

logger = logging.getLogger("hpcsched.client")

_default_lock = threading.Lock()
_default_client: Client | None = None
# set by `python -m hpcsched` / hpcsched.initialize() on rank 0
default_scheduler_address: str | None = None
default_security: Security | None = None


def _journaled(reply: Any) -> bool:
    """Whether the scheduler keeps a journal, from its answer to our registration."""
    for m in reply if isinstance(reply, list) else [reply]:
        try:
            record = m if isinstance(m, pc.Registered) else pc.decode(pc.SCHEDULER_TO_CLIENT, m)
        except (pc.MalformedMessage, TypeError):
            continue
        if isinstance(record, pc.Registered):
            return record.journaled
    return False


class Client:
    """Connect to a scheduler (or start a LocalCluster) and run work on its workers.

    ``address``: a scheduler address or file, a cluster object, or None (module docstring);
    ``cluster_kwargs`` go to the LocalCluster started when there is no scheduler to
    connect to. As ``distributed.Client``."""

    #: dask asks whether a scheduler object is asynchronous before using its ``get``
    asynchronous = False
    #: what the scheduler sends: record type -> handler
    handlers = Handlers("client")

    def __init__(self, address: Any = None, *, scheduler_file: str | None = None,
                 security: Security | None = None, timeout: float | None = None,
                 set_as_default: bool = True, name: str = "", **cluster_kwargs: Any):
        self.id = f"client-{name + '-' if name else ''}{uuid.uuid4().hex[:12]}"
        self.cluster: Any = None
        self._owns_cluster = False
        self._dask_config: DaskClaim | None = None
        timeout = config.read(CommSettings, connect_timeout=timeout).connect_timeout
        where = locate_scheduler(address, scheduler_file, security, timeout, cluster_kwargs,
                                 (default_scheduler_address, default_security))
        self.cluster, self._owns_cluster = where.cluster, where.owns_cluster
        self.scheduler_address: str = where.address
        self.security = where.security if where.security is not None else \
            Security.from_environment()
        self._token = uuid.uuid4().hex[:16]  # keys: token + counter (os.urandom is slow here)
        self._keys = itertools.count()
        self._closed = False
        self._release_lock = threading.Lock()
        self._releaser = 0  # the thread releasing the client (see close)
        self._released = threading.Event()
        # its own atexit entry (a partial equals only itself), which the release takes out
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        self.status = "connecting"
        try:
            comm, reply, inproc = open_comm(self.scheduler_address, self.id, self.security,
                                            timeout)
        except Exception:
            self._close_owned_cluster()
            raise
        self._table = self.handlers.bind(self)
        #: the connection to the scheduler (``send(msg)`` queues a message for it)
        # a scheduler in this process cannot hang, die or restart apart from us
        sfile = scheduler_file or (address if isinstance(address, str)
                                   and looks_like_scheduler_file(address) else None)
        self.scheduler_comm = SchedulerConnection(
            comm, self.id, self.scheduler_address, self._receive, self._batch_done,
            self._lost_scheduler, watch=not inproc,
            reconnect_timeout=float(config.read(ClientSettings).scheduler_reconnect_timeout)
            if not inproc and registry.backend_for(self.scheduler_address).reconnectable
            else 0.0,
            security=self.security, scheduler_file=sfile, on_reconnected=self._reconnected)
        #: this client's futures: states, reference counts, done callbacks
        settings = config.read(ClientSettings)
        self.future_table = FutureTable(self.scheduler_comm.post,
                                        held_limit=settings.prefetch_held_bytes)
        self.futures: dict[Any, FutureState] = self.future_table.states
        self._control = ClusterRequests(self.scheduler_comm, self.future_table, self.cluster)
        self._transfers = Transfers(self.scheduler_comm, self.future_table, self._new_future,
                                    settings.prefetch_bytes, settings.prefetch_result_bytes)
        self._submitter = Submitter(self.scheduler_comm, self.future_table, self._new_future,
                                    self.gather, lambda keys: Future.of_keys(keys, self))
        # a journaled scheduler restarts with tasks, not with the ranges of a bulk map
        self._submitter.bulk_maps = not _journaled(reply)
        self.future_table.start(self.id)
        self.scheduler_comm.start(reply)
        self.status = "running"
        self.scheduler_comm.start_watch()
        if set_as_default:
            global _default_client
            with _default_lock:
                _default_client = self
            self._dask_config = become_dask_scheduler(self)
        self._finalizer = weakref.finalize(self, _close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    def _close_owned_cluster(self) -> None:
        if self._owns_cluster and self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self.id} scheduler={self.scheduler_address} status={self.status}>"

    def _new_future(self, key: Any) -> Future:
        return Future(key, self)

    # ================================================================ messages
    def request(self, msg: Any, timeout: float | None = None) -> Any:
        """Send the request ``msg`` to the scheduler and return its reply.

        ``msg`` is a record of :mod:`hpcsched.core.protocol.client` whose empty
        ``request_id`` gets a fresh one (the reply carries it back), e.g.
        ``client.request(WhoHas("", keys=None)).result``; the reply is a record. The way
        the client's extensions talk to the scheduler. ``TypeError`` for anything but a
        record, ``TimeoutError`` after ``timeout`` seconds (None: no limit),
        ``ConnectionError`` if the scheduler is lost.
        """
        return self.scheduler_comm.request(msg, timeout)

    def _receive(self, msg: Any) -> None:
        """Decode one scheduler message (``SCHEDULER_TO_CLIENT``) and hand it to its handler.

        On the thread the connection receives on (module docstring of
        :mod:`.connection`). One that is malformed, or that its handler cannot take, is
        logged and dropped, never raised."""
        try:
            record = pc.decode(pc.SCHEDULER_TO_CLIENT, msg)
            self._table[type(record)](record)
        except Exception as e:
            self._bad_message(msg, e)

    def _batch_done(self) -> None:
        """A batch of scheduler messages is handled: its callbacks, and the gathers it ends."""
        self.future_table.batch_done()

    def _bad_message(self, msg: Any, error: Exception) -> None:
        logger.error("client %s: dropped a message from the scheduler (%s): %s: %s",
                     self.id, reprlib.repr(msg), type(error).__name__, error)

    @handlers.on(pc.KeyInMemory)
    def _on_key_in_memory(self, msg: pc.KeyInMemory) -> None:
        st = self.futures.get(msg.key)
        if st is not None and st.status != "finished":
            cbs = st.finish(msg.type)
            if cbs:  # the common case has none: no call (one message per finished task)
                self.future_table.defer_callbacks(cbs)

    @handlers.on(pc.MapInMemory)
    def _on_map_in_memory(self, msg: pc.MapInMemory) -> None:
        prefix, n = msg.prefix, len(msg.indices)
        states = list(map(self.futures.get, [prefix + i for i in map(str, msg.indices)]))
        cbs = finish_all(states, msg.types if len(msg.types) == n else [""] * n)
        if cbs:
            self.future_table.defer_callbacks(cbs)

    @handlers.on(pc.TaskErredReport)
    def _on_task_erred(self, msg: pc.TaskErredReport) -> None:
        self.future_table.erred(msg.key, msg.exception, msg.traceback, msg.exception_text)

    @handlers.on(pc.CancelledKeys)
    def _on_cancelled_keys(self, msg: pc.CancelledKeys) -> None:
        table = self.future_table
        table.cancel([st for st in map(table.states.get, msg.keys) if st is not None])

    @handlers.on(pc.LostData)
    def _on_lost_data(self, msg: pc.LostData) -> None:
        st = self.futures.get(msg.key)
        if st is not None:
            st.lose()

    @handlers.on(pc.GatherReply, pc.SchedulerInfoReply, pc.RetireWorkersReply,
                 pc.ExtensionReply, pc.ControlReply)
    def _on_reply(self, msg: Any) -> None:
        self.scheduler_comm.deliver_reply(msg.request_id, msg)

    @handlers.on(pc.ScatterReply)
    def _on_scatter_reply(self, msg: pc.ScatterReply) -> None:
        self.scheduler_comm.deliver_reply(msg.scatter_id, msg)

    @handlers.on(pc.CloseClientReply)
    def _on_close_reply(self, msg: pc.CloseClientReply) -> None:
        self.scheduler_comm.deliver_reply(CLOSE_REQUEST, msg)

    @handlers.on(pc.Registered)
    def _on_registered(self, msg: pc.Registered) -> None:
        # only a scheduler with a journal comes back with our futures: for any other, a
        # lost connection is a lost scheduler, reported at once
        if not msg.journaled:
            self.scheduler_comm.reconnect_timeout = 0.0

    @handlers.on(pc.SchedulerClosing)
    def _on_scheduler_closing(self, msg: pc.SchedulerClosing) -> None:
        self.scheduler_comm.lost()

    @handlers.on(pc.Error)
    def _on_error(self, msg: pc.Error) -> None:  # the scheduler refused a message, drops us
        logger.error("scheduler at %s: %s", self.scheduler_address, msg.message)

    def _reconnected(self) -> None:
        """The connection found the scheduler again (restarted from its journal).

        Say again which keys this client holds futures to: those done are reported again
        (a finished future stays as it is), the others run or are found in a worker's
        memory."""
        keys = list(self.futures)
        if keys:
            try:
                self.scheduler_comm.send(pc.ClientDesiresKeys(self.id, keys))
            except RuntimeError:
                if not self.scheduler_comm.closed:
                    raise  # else: closed meanwhile, nobody waits for these futures

    def _lost_scheduler(self, reason: str) -> None:
        """The connection's ``on_lost``: every future not done errs with ``reason``.

        Nothing comes through the connection again (a closed cluster's client, one given
        up on): the client ends its threads and lets go of the cluster, the default
        client and dask's scheduler setting, as :meth:`close` does, on a thread of its own
        (this runs on the connection's thread, which that close waits for)."""
        self.status = "disconnected"
        self.future_table.fail(serialize(ConnectionError(reason)), "lost the scheduler")
        if not self._closed:
            threading.Thread(target=self._release, args=("disconnected", 5.0),
                             name=f"{self.id}-release", daemon=True).start()

    # ================================================================ submit / map
    def submit(self, func: Callable, *args: Any, key: Any = None, workers: Any = None,
               resources: dict | None = None, retries: int = 0, priority: int = 0,
               allow_other_workers: bool = False, pure: bool = True,
               ranks: int | None = None, ranks_per_node: int | None = None,
               duration: float | str | None = None, time_limit: float | str | None = None,
               **kwargs: Any) -> Future:
        """Run ``func(*args, **kwargs)`` on a worker; a :class:`Future` of its result.

        ``duration`` (seconds, or as dask writes it: ``"20m"``): how long the task is
        expected to run; it is not started on a worker that leaves sooner (its
        ``--lifetime``, its job's walltime) while another stays long enough (without it,
        its group's measured durations count). ``time_limit`` (``"1h"``): past it the task
        fails with ``TaskTimeLimitExceeded`` and its slot is free again; Python cannot stop
        the code, which goes on in the background until it returns (see
        :mod:`hpcsched.core.worker.tasks.time_limit`). Both may come from an enclosing
        ``dask.annotate``.

        ``ranks=N``: the task holds a slot on each of N distinct workers at once and runs
        on every one of them (in MPI mode, N ranks: :func:`hpcsched.get_task_comm` inside
        it is their communicator); its result is what the first of them returned. Its
        slots are packed on as few hosts as can be, unless ``ranks_per_node=M`` spreads
        them: at most M on one host. Its environment names them for an MPI launcher
        (``HPCSCHED_MPI_PREFIX``, ``HPCSCHED_HOSTFILE``: :mod:`hpcsched.hpc.gang`).

        Futures among the arguments (also inside lists, tuples, dicts and sets) are waited
        for and replaced by their results.

        ``pure=True`` (the default, as in dask): the key is derived from the function and its
        arguments, so submitting the same call twice shares one task; pass ``pure=False`` for
        functions with side effects or randomness.

        Raises :class:`~hpcsched.core.protocol.serialize.SerializationError` here, in the caller, when
        the function or an argument cannot be pickled.
        """
        if not callable(func):
            raise TypeError(f"submit expects a callable as its first argument, not {func!r}")
        if ranks is not None or ranks_per_node is not None:
            call_annotations(("",), ranks, ranks_per_node)  # an error here, before any work
        func, seconds = timed(func, duration, time_limit)
        return self._submitter.submit(
            func, args, kwargs, key=key, pure=pure,
            token=f"{self._token}{next(self._keys):08x}", priority=priority, retries=retries,
            resources=resources, workers=workers, allow_other_workers=allow_other_workers,
            annotate=lambda k: call_annotations((k,), ranks, ranks_per_node, seconds))

    def map(self, func: Callable, *iterables: Iterable, key: Any = None, workers: Any = None,
            resources: dict | None = None, retries: int = 0, priority: int = 0,
            allow_other_workers: bool = False, batch_size: int | None = None,
            pure: bool = True, ranks: int | None = None, ranks_per_node: int | None = None,
            duration: float | str | None = None, time_limit: float | str | None = None,
            **kwargs: Any) -> list[Future]:
        """``[submit(func, *args) for args in zip(*iterables)]`` as one submission.

        Large maps go in batches of ``batch_size``; ``key`` is a prefix, or one key per
        item. A map of many plain elements (none of them a future; no ``key`` list,
        ``resources`` or ``workers``) travels, is held and runs as a bulk map: in blocks
        and ranges, at a task farm's speed (:mod:`hpcsched.core.state.bulk`), every
        element still its own future; with ``pure``, the same map again (while its
        futures are held) gives the same futures. ``ranks=N``: each element is a task
        holding N slots, as with :meth:`submit` (and ``ranks_per_node``); ``duration`` and
        ``time_limit`` are each element's, as with :meth:`submit` (on both roads)."""
        if not callable(func):
            raise TypeError(f"map expects a callable as its first argument, not {func!r}")
        if not iterables:
            raise TypeError("map needs at least one iterable")
        items = list(zip(*iterables, strict=False))
        keys: list | None = None
        if isinstance(key, (list, tuple)):
            keys = list(key)
            if len(keys) != len(items):
                raise ValueError(f"map got {len(keys)} keys for {len(items)} items")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"map: batch_size must be >= 1, got {batch_size}")
        if ranks is not None or ranks_per_node is not None:
            call_annotations(("",), ranks, ranks_per_node)  # an error here, before any work
        func, seconds = timed(func, duration, time_limit)
        futures = self._submitter.map(
            func, items, kwargs, keys=keys,
            base=key if isinstance(key, str) else funcname(func),
            token=f"{self._token}{next(self._keys):08x}", pure=pure, batch_size=batch_size,
            priority=priority, retries=retries, resources=resources, workers=workers,
            allow_other_workers=allow_other_workers, ranks=ranks, ranks_per_node=ranks_per_node,
            duration=seconds)
        group = FutureGroup(futures)  # their results are fetched together (futures.py)
        for f in futures:
            f.group = group
        return futures

    def history(self, *, job: Any = None, group: str | None = None,
                outcome: str | None = None, worker: str | None = None,
                limit: int | None = None) -> Any:
        """Every task the scheduler ran, from its history file (``scheduler.history``).

        A pandas DataFrame (else dicts), filtered; see :mod:`hpcsched.diagnostics.history`."""
        return seams.resolve("history")(self, job=None if job is None else str(job), group=group,
                                        outcome=outcome, worker=worker, limit=limit)

    # ================================================================ commands
    def submit_command(self, args: Any, **options: Any) -> Future:
        """Run a program on a worker: a future of its exit status and output.

        A list, or a string for ``/bin/sh -c``; ``cwd=``, ``env=``, ``stdout=`` / ``stderr=``
        files, :meth:`submit`'s options. A non-zero exit fails it naming the command, its
        status and its stderr's tail. See :func:`hpcsched.commands.run.submit_command`."""
        return seams.resolve("submit-command")(self, args, **options)

    def map_command(self, args: Any, entries: Iterable, **options: Any) -> list[Future]:
        """:meth:`submit_command` once per entry, as one map (``commands.run.map_command``)."""
        return seams.resolve("map-command")(self, args, entries, **options)

    def forward_logging(self, logger_name: str | None = None, level: int = 0) -> None:
        """As dask's: log records of tasks handled here too; see :mod:`hpcsched.diagnostics.forwarding`."""
        seams.resolve("forward-output")(self, "logging", logger_name, level)

    def forward_print(self, tasks: bool = True) -> None:
        """What tasks print (``tasks=False``: ``hpcsched.print``'s only) printed here too."""
        seams.resolve("forward-output")(self, "print", tasks=tasks)

    # ================================================================ graphs
    def get(self, dsk: Any, keys: Any, *, sync: bool = True, fuse: bool | None = None,
            priority: int = 0, retries: int = 0, resources: dict | None = None,
            workers: Any = None, allow_other_workers: bool = False,
            timeout: float | None = None, **kwargs: Any) -> Any:
        """Compute ``keys`` of a task graph.

        The graph is a dask-style dict ``{key: (func, *args)}``, or whatever dask hands a
        scheduler (``dask.compute(x, scheduler=client.get)``). Nested lists of keys give
        nested lists of results."""
        futures = self._submitter.submit_graph(
            dsk, keys, fuse=fuse, priority=priority, retries=retries,
            resources=resources, workers=workers, allow_other_workers=allow_other_workers)
        if not sync:
            return futures
        try:
            return self.gather(futures, timeout=timeout)
        finally:
            del futures

    def compute(self, collections: Any, keys: Any = None, *, sync: bool = False,
                optimize_graph: bool = True, fuse: bool | None = None, priority: int = 0,
                retries: int = 0, resources: dict | None = None, workers: Any = None,
                allow_other_workers: bool = False, traverse: bool = True,
                **kwargs: Any) -> Any:
        """Start computing dask collections on the cluster.

        One :class:`Future` per collection (a list for a list) whose result is its final
        value, as ``dask.compute`` gives; ``sync=True`` returns the results. With ``keys``,
        ``collections`` is a task-graph dict and the futures are ``keys``' (same nesting).
        """
        opts = dict(priority=priority, retries=retries, resources=resources, workers=workers,
                    allow_other_workers=allow_other_workers)
        if keys is not None:
            return self._submitter.submit_graph(collections, keys, fuse=fuse, **opts)
        return self._submitter.compute(collections, sync=sync, optimize_graph=optimize_graph,
                                       traverse=traverse, fuse=fuse, **opts)

    def persist(self, collections: Any, *, optimize_graph: bool = True, priority: int = 0,
                retries: int = 0, resources: dict | None = None, workers: Any = None,
                allow_other_workers: bool = False, **kwargs: Any) -> Any:
        """Start computing dask collections; the same collections, backed by futures."""
        return self._submitter.persist(
            collections, optimize_graph=optimize_graph, priority=priority,
            retries=retries, resources=resources, workers=workers,
            allow_other_workers=allow_other_workers)

    def retry(self, futures: Any) -> None:
        """Run erred futures again (with the erred tasks they depend on)."""
        flat: list[Future] = []
        collect_futures(futures, flat)
        for f in flat:
            if f.state.status == "error":
                f.state.lose()  # pending again until the scheduler reports
        self.scheduler_comm.send(pc.RetryKeys(self.id, [f.key for f in flat]))

    # ================================================================ data
    def gather(self, futures: Any, errors: str = "raise", timeout: float | None = None) -> Any:
        """Results of ``futures`` (a future, or lists/dicts/tuples of them), same structure.

        ``errors="skip"`` leaves out erred and cancelled ones."""
        return self._transfers.gather(futures, errors, timeout)

    def result_of(self, future: Future, timeout: float | None = None) -> Any:
        """The result of ``future`` (``Future.result``).

        The small finished results this client is about to ask for come along
        (:mod:`hpcsched.core.client.futures`)."""
        return self._transfers.result(future, timeout)

    def scatter(self, data: Any, workers: Any = None, broadcast: bool = False,
                timeout: float | None = 60.0) -> Any:
        """Move local data to workers; returns futures (same structure as ``data``)."""
        return self._transfers.scatter(data, workers, broadcast, timeout)

    def cancel(self, futures: Any) -> None:
        """Cancel futures, and drop their data if they finished.

        Their tasks stop if no other client wants them."""
        flat: list[Future] = []
        collect_futures(futures, flat)
        self.future_table.cancel([f.state for f in flat])  # finished ones too: data dropped
        self.scheduler_comm.send(pc.CancelKeys(self.id, [f.key for f in flat]))

    # ================================================================ cluster
    def scheduler_info(self, timeout: float | None = 30.0) -> dict:
        """The scheduler's description of itself and its workers, as distributed's.

        ``"workers"`` is ``{address: info}``."""
        return self._control.scheduler_info(timeout)

    # ---------------------------------------------------------------- cluster control
    def run(self, function: Callable, *args: Any, workers: Any = None, wait: bool = True,
            nanny: bool = False, on_error: str = "raise", **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on every worker now (not as a task).

        Returns ``{address: result}``; the function gets ``dask_worker=`` if it takes that
        argument. ``nanny=True``: in each worker's nanny (``dask_worker=`` is the ``Nanny``),
        as distributed; a worker with no nanny (an MPI rank) answers a ``RuntimeError``."""
        return self._control.run(function, args, kwargs, workers=workers, wait=wait,
                                 on_error=on_error, nanny=nanny)

    def run_on_scheduler(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` in the scheduler's process.

        It runs on the scheduler's loop thread (``dask_scheduler=`` is passed if it takes
        it): keep it short."""
        return self._control.run_on_scheduler(function, args, kwargs)

    def who_has(self, futures: Any = None) -> dict:
        """``{key: [addresses of the workers holding it]}`` (all keys, or ``futures``')."""
        return self._control.who_has(futures)

    def has_what(self, workers: Any = None) -> dict:
        """``{worker address: [keys it holds]}``."""
        return self._control.has_what(workers)

    def processing(self, workers: Any = None) -> dict:
        """``{worker address: [keys it runs or was given to run]}``.

        All workers, or those of ``workers``; as ``distributed.Client.processing``."""
        return self._control.processing(workers)

    def nthreads(self, workers: Any = None) -> dict:
        """``{worker address: number of threads}``."""
        return self._control.nthreads(workers)

    ncores = nthreads

    def upload_file(self, filename: str, load: bool = True) -> dict:
        """Send a local file to every worker, and to every worker that joins later.

        A ``.py`` is imported (reloaded), a ``.zip``/``.egg`` put on ``sys.path``."""
        return self._control.upload_file(filename, load=load)

    # ---------------------------------------------------------------- datasets, versions
    def publish_dataset(self, *args: Any, name: str | None = None, override: bool = False,
                        **kwargs: Any) -> None:
        """Publish named datasets on the scheduler.

        ``publish_dataset(x=f)`` or ``publish_dataset(f, name="x")``; the scheduler keeps
        their futures alive until unpublished. ``KeyError`` if the name is taken (unless
        ``override=True``)."""
        dataset_ops.publish_dataset(self, args, name, override, kwargs)

    def get_dataset(self, name: str, default: Any = dataset_ops.NO_DEFAULT) -> Any:
        """A published dataset, its futures bound to this client.

        ``KeyError`` if there is none by that name and no ``default``."""
        return dataset_ops.get_dataset(self, name, default)

    def list_datasets(self) -> list[str]:
        """Names of the published datasets."""
        return dataset_ops.list_datasets(self)

    def unpublish_dataset(self, name: str) -> None:
        """Remove a published dataset (its futures are released by the scheduler)."""
        dataset_ops.unpublish_dataset(self, name)

    @property
    def datasets(self) -> dataset_ops.Datasets:
        """The published datasets as a mutable mapping."""
        return dataset_ops.Datasets(self)

    def get_versions(self, check: bool = False, packages: Any = None) -> dict:
        """Versions of Python and key packages in the client, the scheduler and each worker.

        ``check=True`` raises ``ValueError`` if they differ."""
        return versions.collect(self._control, check=check, packages=packages)

    def register_plugin(self, plugin: Any, name: str | None = None,
                        idempotent: bool | None = None) -> Any:
        """Register a worker, scheduler or nanny plugin.

        A ``WorkerPlugin`` is set up on every worker, and on workers joining later; a
        ``SchedulerPlugin`` is started in the scheduler; see :mod:`hpcsched.core.client.plugins`."""
        return plugins.register_plugin(self.scheduler_comm, plugin, name, idempotent)

    def register_worker_plugin(self, plugin: Any = None, name: str | None = None,
                               nanny: bool | None = None) -> Any:
        """``register_plugin`` for a worker plugin (distributed's older name).

        A nanny plugin with ``nanny=True`` (or a ``NannyPlugin`` and ``nanny=None``)."""
        if nanny and isinstance(plugin, plugins.WorkerPlugin):
            raise ValueError(f"register_worker_plugin(nanny=True): {plugin!r} is a WorkerPlugin")
        if nanny is None:  # as distributed: a NannyPlugin goes to the nannies
            from hpcsched.core.worker.nanny import is_nanny_plugin  # imported when used

            nanny = is_nanny_plugin(plugin)
        return plugins.register_plugin(self.scheduler_comm, plugin, name,
                                       kind="nanny" if nanny else "worker")

    def unregister_worker_plugin(self, name: str, nanny: bool | None = None) -> Any:
        """Tear a worker (or nanny) plugin down on every worker (nanny).

        Workers (nannies) that join later no longer get it."""
        return plugins.unregister_worker_plugin(self.scheduler_comm, name)

    def replicate(self, futures: Any, n: int | None = None, workers: Any = None,
                  branching_factor: int = 2) -> None:
        """Copy the futures' data onto ``n`` workers (all if None); returns once they hold it.

        Among ``workers`` if given. Copies beyond ``n`` are kept (distributed drops them);
        ``branching_factor`` is unused (workers fetch from holders)."""
        self._control.replicate(futures, n=n, workers=workers)

    def rebalance(self, futures: Any = None, workers: Any = None, **kwargs: Any) -> None:
        """Move data from workers holding more than the mean to those holding less.

        As distributed does; no copy is dropped before its new holder has it."""
        self._control.rebalance(futures, workers)

    def restart(self, timeout: float | None = 120.0, wait_for_workers: bool = True) -> None:
        """Reset the cluster: every client's futures cancelled, the workers' data dropped.

        Each worker plugin is torn down and set up again. Workers are *not* new processes:
        under MPI a rank cannot be respawned, and without a nanny no process is restarted
        over TCP either. Module-level state a task left in a worker's process remains; a
        task running now finishes, its result dropped."""
        self._control.restart(timeout, wait_for_workers)

    def wait_for_workers(self, n_workers: int = 1, timeout: float | None = None) -> None:
        """Block until ``n_workers`` workers have joined (``TimeoutError`` after ``timeout``)."""
        self._control.wait_for_workers(n_workers, timeout)

    def retire_workers(self, workers: list[str] | None = None, names: list[str] | None = None,
                       n: int | None = None, close: bool = True,
                       timeout: float | None = 120.0) -> list[str]:
        """Retire workers gracefully, their data moved to others first.

        Returns the retired workers' addresses."""
        reply = self.request(pc.RetireWorkersRequest("", workers, names, n, close), timeout)
        return list(reply.retired)

    # ---------------------------------------------------------------- diagnostics
    # (the work is done in hpcsched.diagnostics, reached through core.seams)
    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's link, with its access token; None when it is disabled."""
        return self.scheduler_info().get("services", {}).get("dashboard")

    def get_task_stream(self, start: Any = None, stop: Any = None, count: int | None = None,
                        plot: bool = False, filename: str = "task-stream.html") -> list:
        """Records of the tasks run between ``start`` and ``stop`` (or the last ``count``).

        ``plot=True`` also writes an HTML report to ``filename``."""
        data = seams.resolve("task-stream")(self, start, stop, count)
        if plot:
            seams.resolve("task-stream-report")(self, seams.resolve("as-time")(start), filename)
        return data

    def get_worker_logs(self, n: int | None = None, workers: list | None = None,
                        nanny: bool = False) -> dict:
        """Recent log records of each worker: ``{address: [(level, message), ...]}``."""
        return seams.resolve("worker-logs")(self, n, workers)

    def _repr_html_(self) -> str:
        return seams.resolve("client-html")(self)

    def get_executor(self, **kwargs: Any) -> ClientExecutor:
        """A ``concurrent.futures.Executor`` running on this cluster."""
        return ClientExecutor(self, **kwargs)

    # ================================================================ close
    def close(self, timeout: float = 5.0) -> None:
        """Release this client's futures, disconnect, and close the cluster it started."""
        if not self._closed and self.status == "running":
            with contextlib.suppress(Exception):  # the scheduler may be gone already
                self.scheduler_comm.request(pc.CloseClient(), timeout)
        self._release("closed", timeout)

    def _release(self, status: str, timeout: float) -> None:
        """End the threads, drop every hold on this client, close the cluster it started.

        The holds: the connection, the default client, dask's scheduler setting. The
        client's ``status`` is ``status`` after. A call while another thread releases the
        client returns when that is over."""
        with self._release_lock:
            first = not self._closed
            if first:
                self._closed = True
                self._releaser = threading.get_ident()
        if first:
            self.status = status
            try:
                self._end(timeout)
            finally:
                self._released.set()
            return
        if threading.get_ident() != self._releaser:
            self._released.wait(timeout + 5.0)
        if status == "closed":  # closed by the user after the scheduler was lost
            self.status = status

    def _end(self, timeout: float) -> None:
        atexit.unregister(self._at_exit)
        self.future_table.close()
        self.scheduler_comm.close(timeout)
        global _default_client
        with _default_lock:
            if _default_client is self:
                _default_client = None
        if self._dask_config is not None:
            restore_dask_scheduler(self._dask_config)
            self._dask_config = None
        self._close_owned_cluster()

    def shutdown(self, timeout: float = 5.0) -> None:
        """End the cluster -- its scheduler and workers -- then close this client.

        As distributed's ``Client.shutdown``: the process running the scheduler
        (``hpcsched scheduler``, an MPI job serving clients, a cluster this client
        started) ends it, whoever else is connected."""
        if not self._closed and self.status == "running":
            with contextlib.suppress(Exception):  # the scheduler may be gone already
                self._control.shutdown(timeout)
        self.close(timeout)


def _close_at_exit(ref: weakref.ref) -> None:
    client = ref()
    if client is not None and not client._closed:
        with contextlib.suppress(Exception):
            client.close(timeout=2.0)


def default_client() -> Client | None:
    """The client made last with ``set_as_default=True`` (and not closed), if any."""
    return _default_client


__all__ = ["Client", "Future", "wait", "as_completed", "progress", "GraphError",
           "CancelledError", "write_scheduler_file", "read_scheduler_file"]
