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

Threads: one reader (scheduler messages update futures) and one sender (all
outgoing messages, so ``Future.__del__`` never blocks on a socket).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from hpcsched.core import client_control, config, plugins, seams, versions
from hpcsched.core import datasets as dataset_ops
from hpcsched.core.client_heartbeat import SchedulerWatch
from hpcsched.core.comm import registry
from hpcsched.core.comm.base import CommClosedError, Security
from hpcsched.core.dask_collections import (
    annotations_for_wire,
    become_dask_scheduler,
    finalize_expr,
    graph_of,
    is_dask_collection,
    persist_expr,
    restore_dask_scheduler,
)
from hpcsched.core.futures import (  # noqa: F401 - re-exported: the public names live here too
    CancelledError,
    ClientExecutor,
    DoneAndNotDoneFutures,
    Future,
    FutureState,
    RemoteTraceback,
    as_completed,
    collect_futures,
    fire_and_forget,
    futures_of,
    pack_futures,
    progress,
    run_callback,
    wait,
    wait_futures,
)
from hpcsched.core.graph import GraphError, Ref, gc_paused, normalize
from hpcsched.core.nanny import is_nanny_plugin
from hpcsched.core.scheduler_file import (  # noqa: F401 - re-exported
    looks_like_scheduler_file,
    read_scheduler_file,
    wait_for_scheduler_file,
    write_scheduler_file,
)
from hpcsched.core.serialize import (
    deserialize,
    dumps_function,
    dumps_object,
    serialize,
    sizeof,
)
from hpcsched.core.submission import (  # noqa: F401 - funcname/task_run_spec re-exported
    SCALARS,
    as_list,
    flatten_keys,
    funcname,
    pack_keys,
    pure_token,
    task_run_spec,
)

logger = logging.getLogger("hpcsched.client")

_default_lock = threading.Lock()
_default_client: Client | None = None
# set by `python -m hpcsched` / hpcsched.initialize() on rank 0
default_scheduler_address: str | None = None
default_security: Security | None = None


class Client:
    #: dask asks whether a scheduler object is asynchronous before using its ``get``
    asynchronous = False

    def __init__(self, address: Any = None, *, scheduler_file: str | None = None,
                 security: Security | None = None, timeout: float | None = None,
                 set_as_default: bool = True, name: str = "", **cluster_kwargs: Any):
        self.id = f"client-{name + '-' if name else ''}{uuid.uuid4().hex[:12]}"
        self.cluster = None
        self._owns_cluster = False
        self._dask_config: tuple | None = None
        timeout = config.get("comm.timeouts.connect", timeout)
        if scheduler_file is not None:
            if address is not None:
                raise ValueError("give an address or a scheduler_file, not both")
            address = wait_for_scheduler_file(scheduler_file, timeout, security)
        if address is None:
            address, security = self._find_scheduler(security, cluster_kwargs)
        elif hasattr(address, "scheduler_address"):
            self.cluster = address
            security = security or getattr(address, "security", None)
            address = address.scheduler_address
        elif isinstance(address, tuple):  # from wait_for_scheduler_file
            address, security = address
        elif isinstance(address, str) and not address.startswith(("tcp://", "tls://", "inproc://",
                                                                   "mpi://")):
            if looks_like_scheduler_file(address):
                address, security = wait_for_scheduler_file(address, timeout, security)
            else:
                address = f"tcp://{address}"
        if security is None:
            security = Security.from_environment()
        self.scheduler_address: str = address
        from hpcsched.core.scheduler import LOCAL_SCHEDULERS

        # the scheduler lives in this process: no sockets, no pickling between us (for a
        # client holding its secret: a wrong one must be refused as over the network)
        connect_address = address
        local = LOCAL_SCHEDULERS.get(address)
        if local is not None and local[1] == (security.secret if security else None):
            connect_address = local[0]
        self.security = security
        self.futures: dict[Any, FutureState] = {}
        self._refcount: dict[Any, int] = {}
        self._ref_lock = threading.Lock()
        self._requests: dict[str, tuple[threading.Event, list]] = {}
        self._ids = itertools.count()
        self._outq: queue.SimpleQueue = queue.SimpleQueue()
        self._callback_q: queue.SimpleQueue = queue.SimpleQueue()
        self._changed = threading.Condition()  # a future's state changed
        self._token = uuid.uuid4().hex[:16]  # keys: token + counter (os.urandom is slow here)
        self._keys = itertools.count()
        self._closed = False
        self.status = "connecting"
        try:
            self._comm = registry.connect(connect_address, timeout=timeout, security=security)
        except Exception:
            self._close_owned_cluster()
            raise
        self._comm.send([{"op": "register-client", "client": self.id}])
        try:
            reply = self._comm.recv(timeout=timeout)
        except (CommClosedError, TimeoutError) as e:
            self._comm.close()
            self._close_owned_cluster()
            raise ConnectionError(f"scheduler at {address} did not accept this client: {e}") \
                from e
        self._lost_reason = ""
        # a scheduler in this process cannot hang apart from us: no watch needed
        self._watch = None if connect_address.startswith("inproc://") else SchedulerWatch(
            self.id, self._ping, self._scheduler_unresponsive)
        self._reader = threading.Thread(target=self._read_loop, name=f"{self.id}-reader",
                                        daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name=f"{self.id}-sender",
                                        daemon=True)
        self._callback_thread = threading.Thread(target=self._callback_loop,
                                                 name=f"{self.id}-callbacks", daemon=True)
        self._reader.start()
        self._sender.start()
        self._callback_thread.start()
        self._handle([reply] if isinstance(reply, dict) else reply)
        self.status = "running"
        if self._watch is not None:
            self._watch.start()
        if set_as_default:
            global _default_client
            with _default_lock:
                _default_client = self
            self._dask_config = become_dask_scheduler(self)
        self._finalizer = weakref.finalize(self, _close_at_exit, weakref.ref(self))
        atexit.register(_close_at_exit, weakref.ref(self))

    # ================================================================ setup
    def _find_scheduler(self, security: Security | None, cluster_kwargs: dict
                        ) -> tuple[str, Security | None]:
        from hpcsched.core.worker_client import task_scheduler

        in_task = task_scheduler()  # inside a task: the cluster it runs on, with its worker's
        found = None  # credentials (never a new cluster per task)
        if in_task is not None:
            found = in_task[0], security or in_task[1]
        elif default_scheduler_address is not None:
            found = default_scheduler_address, security or default_security
        elif os.environ.get("HPCSCHED_SCHEDULER_ADDRESS"):
            found = os.environ["HPCSCHED_SCHEDULER_ADDRESS"], security
        elif os.environ.get("HPCSCHED_SCHEDULER_FILE"):
            found = read_scheduler_file(os.environ["HPCSCHED_SCHEDULER_FILE"], security)
        if found is not None:
            if cluster_kwargs:
                # the same script runs on a laptop (a LocalCluster of this shape) and under
                # python -m hpcsched (the job's ranks): say what is not used, once
                logger.warning("Client(%s): connecting to the existing scheduler at %s; "
                               "these LocalCluster settings are not used",
                               ", ".join(f"{k}={v!r}" for k, v in cluster_kwargs.items()),
                               found[0])
            return found
        self.cluster = seams.resolve("local-cluster")(**cluster_kwargs)
        self._owns_cluster = True
        return self.cluster.scheduler_address, self.cluster.security

    def _close_owned_cluster(self) -> None:
        if self._owns_cluster and self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self.id} scheduler={self.scheduler_address} status={self.status}>"

    # ================================================================ messages
    def _send(self, msg: dict) -> None:
        if self._closed:
            raise RuntimeError("this client is closed")
        self._outq.put(msg)

    def _send_loop(self) -> None:
        get = self._outq.get
        get_nowait = self._outq.get_nowait
        while True:
            msg = get()
            if msg is None:
                return
            msgs = [msg]
            try:
                while len(msgs) < 10000:
                    m = get_nowait()
                    if m is None:
                        self._comm_send(_coalesce(msgs))
                        return
                    msgs.append(m)
            except queue.Empty:
                pass
            self._comm_send(_coalesce(msgs))

    def _comm_send(self, msgs: list) -> None:
        try:
            self._comm.send(msgs)
        except (CommClosedError, OSError) as e:
            logger.debug("client send failed: %s", e)

    def _read_loop(self) -> None:
        watch = self._watch
        try:
            while True:
                msgs = self._comm.recv()
                if watch is not None:
                    watch.heard()
                self._handle(msgs if isinstance(msgs, list) else [msgs])
        except (CommClosedError, OSError, EOFError):
            pass
        except Exception:
            logger.exception("client reader failed")
        finally:
            self._lost_scheduler()

    def _ping(self) -> None:
        if not self._closed:  # any answer will do: the reader hears it
            self._outq.put({"op": "scheduler-info", "request_id": self._new_id("ping")})

    def _scheduler_unresponsive(self, reason: str) -> None:
        logger.error("client %s: %s at %s: giving up on it", self.id, reason,
                     self.scheduler_address)
        self._lost_reason = f": {reason}"
        self._comm.close()  # the reader sees it closed and errs what waits

    def _lost_scheduler(self) -> None:
        if self._closed:
            return
        self.status = "disconnected"
        if self._watch is not None:
            self._watch.stop()
        exc = serialize(ConnectionError(f"lost the scheduler at {self.scheduler_address}"
                                        f"{self._lost_reason}"))
        for st in list(self.futures.values()):
            if not st.done():
                self._callbacks(st.error(exc, "", "lost the scheduler"))
        for event, box in list(self._requests.values()):
            box.append(None)
            event.set()
        with self._changed:
            self._changed.notify_all()

    def _handle(self, msgs: list) -> None:
        try:
            self._handle_msgs(msgs)
        finally:
            with self._changed:
                self._changed.notify_all()

    def _handle_msgs(self, msgs: list) -> None:
        for msg in msgs:
            op = msg.get("op")
            if op == "key-in-memory":
                st = self.futures.get(msg["key"])
                if st is not None and st.status != "finished":
                    self._callbacks(st.finish(msg.get("type", "")))
            elif op == "task-erred":
                st = self.futures.get(msg["key"])
                if st is not None:
                    self._callbacks(st.error(msg.get("exception"), msg.get("traceback", ""),
                                             msg.get("exception_text", "")))
            elif op == "cancelled-keys":
                for key in msg["keys"]:
                    st = self.futures.get(key)
                    if st is not None and st.status != "cancelled":
                        self._callbacks(st.cancel())
            elif op == "lost-data":
                st = self.futures.get(msg["key"])
                if st is not None:
                    st.lose()
            elif op in ("gather-reply", "scatter-reply", "scheduler-info-reply",
                        "retire-workers-reply", "close-client-reply", "extension-reply",
                        "control-reply"):
                rid = msg.get("request_id") or msg.get("scatter_id") or op
                entry = self._requests.get(rid)
                if entry is not None:
                    entry[1].append(msg)
                    entry[0].set()
            elif op == "registered":
                pass
            elif op == "scheduler-closing":
                self._lost_scheduler()
            elif op == "error":  # the scheduler refused a message of ours and drops us
                logger.error("scheduler at %s: %s", self.scheduler_address, msg.get("message"))
            else:
                logger.warning("client: unknown message %r", op)

    def _callbacks(self, cbs: list) -> None:
        """Done callbacks run on their own thread: one that calls ``result()`` (which needs
        the reader thread) must not block the reader."""
        if cbs:
            self._callback_q.put(cbs)

    def _callback_loop(self) -> None:
        while True:
            cbs = self._callback_q.get()
            if cbs is None:
                return
            fut = _strong = None
            for ref, fn, _strong in cbs:
                fut = ref()
                if fut is not None:
                    run_callback(fn, fut)
            del cbs, fut, _strong  # or the last future stays alive while we wait

    def _wait_done(self, states: list[FutureState], deadline: float | None,
                   timeout: float | None) -> None:
        """Block until every state is done: one condition for the whole client (notified per
        batch of scheduler messages), not an event per future."""
        for st in states:
            if st.done():
                continue
            with self._changed:
                while not st.done():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"futures not done within {timeout}s")
                    self._changed.wait(left if left is not None else 1.0)

    def _request(self, msg: dict, rid: str, timeout: float | None) -> dict:
        event = threading.Event()
        box: list = []
        self._requests[rid] = (event, box)
        try:
            self._send(msg)
            if not event.wait(timeout):
                raise TimeoutError(f"no answer from the scheduler to {msg['op']} within "
                                   f"{timeout}s")
        finally:
            self._requests.pop(rid, None)
        if box[0] is None:
            raise ConnectionError(f"lost the scheduler at {self.scheduler_address}")
        return box[0]

    def _new_id(self, what: str) -> str:
        return f"{self.id}-{what}-{next(self._ids)}"

    # ================================================================ futures bookkeeping
    def _state_for(self, key: Any) -> FutureState:
        st = self.futures.get(key)
        if st is None:
            st = self.futures[key] = FutureState()
        return st

    def _inc_ref(self, key: Any) -> None:
        with self._ref_lock:
            self._refcount[key] = self._refcount.get(key, 0) + 1

    def _dec_ref(self, key: Any) -> None:
        with self._ref_lock:
            n = self._refcount.get(key, 0) - 1
            if n > 0:
                self._refcount[key] = n
                return
            self._refcount.pop(key, None)
            self.futures.pop(key, None)
        if not self._closed:
            self._outq.put({"op": "client-releases-keys", "keys": [key]})

    # ================================================================ submit / map
    def submit(self, func: Callable, *args: Any, key: Any = None, workers: Any = None,
               resources: dict | None = None, retries: int = 0, priority: int = 0,
               allow_other_workers: bool = False, pure: bool = True,
               **kwargs: Any) -> Future:
        """Run ``func(*args, **kwargs)`` on a worker; futures among the arguments (also inside
        lists, tuples, dicts and sets) are waited for and replaced by their results.

        ``pure=True`` (the default, as in dask): the key is derived from the function and its
        arguments, so submitting the same call twice shares one task; pass ``pure=False`` for
        functions with side effects or randomness.

        Raises :class:`~hpcsched.core.serialize.SerializationError` here, in the caller, when
        the function or an argument cannot be pickled.
        """
        if not callable(func):
            raise TypeError(f"submit expects a callable as its first argument, not {func!r}")
        # ``held`` keeps the futures found in the arguments alive until the graph that needs
        # them is queued: a future passed inline (``submit(f, submit(g, 1))``) is otherwise
        # released, and the scheduler told so, before the task that depends on it arrives
        (args, kwargs), held = self._unpack((args, kwargs))
        fblob = dumps_function(func)
        ablob = dumps_object((args, kwargs)) if (args or kwargs) else None
        if key is None:
            key = f"{funcname(func)}-" + (pure_token(fblob, ablob) if pure else
                                          f"{self._token}{next(self._keys):08x}")
        if self._known(key):
            return Future(key, self)
        fut = Future(key, self)
        self._send({"op": "update-graph", "tasks": {key: {"run_spec": (fblob, ablob, bool(held)),
                                                          "deps": list(held)}},
                    "keys": [key], "priority": priority,
                    "retries": {key: retries} if retries else {},
                    "resources": resources, "workers": as_list(workers),
                    "allow_other_workers": allow_other_workers, "static_priorities": {key: 0}})
        del held
        return fut

    def map(self, func: Callable, *iterables: Iterable, key: Any = None, workers: Any = None,
            resources: dict | None = None, retries: int = 0, priority: int = 0,
            allow_other_workers: bool = False, batch_size: int | None = None,
            pure: bool = True, **kwargs: Any) -> list[Future]:
        """``[submit(func, *args) for args in zip(*iterables)]`` as one submission."""
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
        base = key if isinstance(key, str) else funcname(func)
        token = f"{self._token}{next(self._keys):08x}"
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"map: batch_size must be >= 1, got {batch_size}")
        fblob = dumps_function(func)
        futures: list[Future] = []
        with gc_paused(len(items)):
            for start, stop in _map_batches(len(items), batch_size):
                tasks = {}
                held: list = []
                batch = []
                for i in range(start, stop):
                    (a, kw), deps = self._unpack((items[i], kwargs))
                    ablob = dumps_object((a, kw))
                    if keys is not None:
                        k = keys[i]
                    elif pure:
                        k = f"{base}-{pure_token(fblob, ablob)}"
                    else:
                        k = f"{base}-{token}{i:08x}"
                    batch.append(k)
                    if deps:
                        held.append(deps)
                    if not self._known(k):
                        tasks[k] = {"run_spec": (fblob, ablob, bool(deps)), "deps": list(deps)}
                futures += [Future(k, self) for k in batch]
                if tasks:
                    self._send({"op": "update-graph", "tasks": tasks, "keys": list(tasks),
                                "priority": priority,
                                "retries": {k: retries for k in tasks} if retries else {},
                                "resources": resources, "workers": as_list(workers),
                                "allow_other_workers": allow_other_workers,
                                "static_priorities": {k: start + i
                                                      for i, k in enumerate(tasks)}})
                del held
        return futures

    def _known(self, key: Any) -> bool:
        """Whether this client already holds a live future for ``key`` (so submitting it again
        is the same task); a cancelled one is made pending, to be submitted anew."""
        st = self.futures.get(key)
        if st is None:
            return False
        if st.status == "cancelled":
            st.lose("pending")
            return False
        return True

    def _future_key(self, x: Any) -> Any:
        """The key of ``x`` if it is one of this client's futures (for graph normalization)."""
        if type(x) is not Future:
            return None
        if x.client is not self:
            raise ValueError(f"{x!r} belongs to another client")
        return x.key

    def _unpack(self, obj: Any) -> tuple[Any, dict]:
        """Replace futures inside ``obj`` by Refs; return (new obj, {key: future}). The caller
        keeps the futures until the message that depends on them is queued."""
        deps: dict = {}
        if type(obj) is tuple and len(obj) == 2 and type(obj[1]) is dict and not obj[1] \
                and all(type(a) in SCALARS for a in obj[0]):
            return obj, deps  # (args, {}) of plain values: the common case of submit/map

        return _refs_for_futures(obj, deps, self), deps

    # ================================================================ graphs
    def get(self, dsk: Any, keys: Any, *, sync: bool = True, fuse: bool | None = None,
            priority: int = 0, retries: int = 0, resources: dict | None = None,
            workers: Any = None, allow_other_workers: bool = False,
            timeout: float | None = None, **kwargs: Any) -> Any:
        """Compute ``keys`` of a task graph: a dask-style dict ``{key: (func, *args)}``, or
        whatever dask hands a scheduler (``dask.compute(x, scheduler=client.get)``).
        Nested lists of keys give nested lists of results."""
        futures = self._submit_graph(dsk, keys, fuse=fuse, priority=priority, retries=retries,
                                     resources=resources, workers=workers,
                                     allow_other_workers=allow_other_workers)
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
        """Start computing dask collections on the cluster: one :class:`Future` per collection
        (a list for a list), whose result is the collection's final value (one array, one
        DataFrame), as ``dask.compute`` would give. ``sync=True`` returns the results.

        ``client.compute(graph, keys)`` with a task-graph dict submits it and returns futures
        for ``keys`` (same nesting).
        """
        opts = dict(priority=priority, retries=retries, resources=resources, workers=workers,
                    allow_other_workers=allow_other_workers)
        if keys is not None:
            return self._submit_graph(collections, keys, fuse=fuse, **opts)
        singleton = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if singleton else list(collections)
        if traverse:
            items = [_delayed_container(a) for a in items]
        variables = [a for a in items if is_dask_collection(a)]
        futures: list = []
        if variables:
            expr, names = finalize_expr(variables, optimize_graph)
            by_name = self._submit_graph(expr, names, fuse=fuse, **opts)
            it = iter(by_name)
            futures = [next(it) if is_dask_collection(a) else a for a in items]
        else:
            futures = items
        result = self.gather(futures) if sync else futures
        return result[0] if singleton else result

    def persist(self, collections: Any, *, optimize_graph: bool = True, priority: int = 0,
                retries: int = 0, resources: dict | None = None, workers: Any = None,
                allow_other_workers: bool = False, **kwargs: Any) -> Any:
        """Start computing dask collections; return the same collections, backed by futures
        on the cluster (computing them later reads those results)."""
        singleton = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if singleton else list(collections)
        bad = [type(a).__name__ for a in items if not is_dask_collection(a)]
        if bad:
            raise TypeError(f"persist takes dask collections, not {', '.join(bad)}")
        expr, keys = persist_expr(items, optimize_graph)
        futures = self._submit_graph(expr, [list(flatten_keys(k)) for k in keys],
                                     priority=priority, retries=retries, resources=resources,
                                     workers=workers, allow_other_workers=allow_other_workers)
        out = []
        for coll, futs in zip(items, futures, strict=True):
            rebuild, args = coll.__dask_postpersist__()
            out.append(rebuild({f.key: f for f in futs}, *args))
        return out[0] if singleton else out

    def _submit_graph(self, dsk: Any, keys: Any, *, fuse: bool | None = None,
                      priority: int = 0, retries: int = 0, resources: dict | None = None,
                      workers: Any = None, allow_other_workers: bool = False) -> Any:
        """Send a graph (see :func:`~hpcsched.core.dask_collections.graph_of`); return futures
        for ``keys`` in the same nesting."""
        graph, annotations = graph_of(dsk)
        flat = flatten_keys(keys)
        missing = [k for k in flat if k not in graph and k not in self.futures]
        if missing:
            raise KeyError(f"keys not in the graph: {missing[:10]!r}")
        with gc_paused(len(graph)):
            # one walk over the graph: futures inside it become references to their keys
            tasks = normalize(graph, known=set(self.futures), ref_of=self._future_key)
            if config.get("scheduler.fuse", fuse) and len(tasks) > 1:
                from hpcsched.core.fusion import fuse_linear

                tasks = fuse_linear(tasks, keep=set(flat) | _annotated_keys(annotations))
            wire = {k: {"run_spec": task_run_spec(t), "deps": list(t.dependencies)}
                    for k, t in tasks.items()}
            del tasks
        futures = {k: Future(k, self) for k in flat}
        self._send({"op": "update-graph", "tasks": wire, "keys": list(futures),
                    "priority": priority,
                    "retries": {k: retries for k in wire} if retries else {},
                    "resources": resources, "workers": as_list(workers),
                    "allow_other_workers": allow_other_workers, "static_priorities": None,
                    "annotations": annotations_for_wire(annotations, wire.keys()) or None})
        return pack_keys(keys, futures)

    def retry(self, futures: Any) -> None:
        """Run erred futures again (with the erred tasks they depend on)."""
        flat: list[Future] = []
        collect_futures(futures, flat)
        for f in flat:
            if f._state.status == "error":
                f._state.lose()  # pending again until the scheduler reports
        self._send({"op": "retry-keys", "keys": [f.key for f in flat]})

    # ================================================================ results
    def _exception_of(self, st: FutureState) -> BaseException:
        exc = st.exception
        try:
            exc = deserialize(exc)
        except Exception as e:  # e.g. the exception's class does not exist here
            exc = RuntimeError(f"{st.exception_text} (could not rebuild the exception: {e})")
        if not isinstance(exc, BaseException):
            exc = RuntimeError(st.exception_text or repr(exc))
        if st.traceback and exc.__cause__ is None:
            exc.__cause__ = RemoteTraceback(f'\n"""\n{st.traceback}"""')
        return exc

    def _gather_one(self, fut: Future, timeout: float | None) -> Any:
        return self.gather([fut], timeout=timeout)[0]

    def gather(self, futures: Any, errors: str = "raise", timeout: float | None = None) -> Any:
        """Results of ``futures`` (a future, or lists/dicts/tuples of them), same structure."""
        if errors not in ("raise", "skip"):
            raise ValueError("errors must be 'raise' or 'skip'")
        flat: list[Future] = []
        collect_futures(futures, flat)
        deadline = None if timeout is None else time.monotonic() + timeout
        values: dict = {}
        pending = {f.key: f for f in flat}
        while pending:
            self._wait_done([f._state for f in pending.values()], deadline, timeout)
            for f in list(pending.values()):
                st = f._state
                if st.status == "error":
                    if errors == "raise":
                        raise self._exception_of(st)
                    del pending[f.key]
                elif st.status == "cancelled":
                    if errors == "raise":
                        raise CancelledError(f"{f.key!r} was cancelled")
                    del pending[f.key]
            if not pending:
                break
            rid = self._new_id("gather")
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            reply = self._request({"op": "gather", "request_id": rid, "keys": list(pending)},
                                  rid, left)
            for blob in reply.get("blobs") or ():
                for k, v in deserialize(blob).items():
                    values[k] = v
                    pending.pop(k, None)
            for k in reply.get("missing") or ():
                f = pending.get(k)
                if f is not None and f._state.status == "finished":
                    # the scheduler lost it after telling us: wait for the recomputation
                    f._state.lose()
                    self._send({"op": "client-desires-keys", "keys": [k]})
            if pending and deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"could not gather {list(pending)[:5]} within {timeout}s")
        return pack_futures(futures, values, errors)

    def scatter(self, data: Any, workers: Any = None, broadcast: bool = False,
                timeout: float | None = 60.0) -> Any:
        """Move local data to workers; returns futures (same structure as ``data``)."""
        if isinstance(data, dict):
            items = dict(data)
        elif isinstance(data, (list, tuple, set)):
            items = {f"{type(v).__name__}-{uuid.uuid4().hex}": v for v in data}
        else:
            items = {f"{type(data).__name__}-{uuid.uuid4().hex}": data}
        sid = self._new_id("scatter")
        payload = {k: serialize(v) for k, v in items.items()}
        futures = {k: Future(k, self) for k in items}
        reply = self._request({"op": "scatter", "scatter_id": sid, "data": payload,
                               "nbytes": {k: sizeof(v) for k, v in items.items()},
                               "workers": as_list(workers), "broadcast": broadcast},
                              sid, timeout)
        if reply.get("error"):
            raise RuntimeError(f"scatter failed: {reply['error']}")
        for f in futures.values():
            if not f.done():
                self._callbacks(f._state.finish())
        if isinstance(data, dict):
            return futures
        if isinstance(data, (list, tuple, set)):
            out = list(futures.values())
            return type(data)(out) if isinstance(data, tuple) else out
        return next(iter(futures.values()))

    def cancel(self, futures: Any) -> None:
        flat: list[Future] = []
        collect_futures(futures, flat)
        keys = [f.key for f in flat]
        for f in flat:  # finished ones too: their data is dropped
            if f._state.status != "cancelled":
                self._callbacks(f._state.cancel())
        with self._changed:
            self._changed.notify_all()
        self._send({"op": "cancel-keys", "keys": keys})

    # ================================================================ cluster
    def scheduler_info(self, timeout: float | None = 30.0) -> dict:
        rid = self._new_id("info")
        return self._request({"op": "scheduler-info", "request_id": rid}, rid, timeout)["info"]

    # ---------------------------------------------------------------- cluster control
    def run(self, function: Callable, *args: Any, workers: Any = None, wait: bool = True,
            nanny: bool = False, on_error: str = "raise", **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on every worker now (not as a task):
        ``{address: result}``; it gets ``dask_worker=`` if it takes that argument.
        ``nanny=True`` is refused: hpcsched workers have no nanny process."""
        if nanny:
            raise ValueError("Client.run(nanny=True): hpcsched workers have no nanny process")
        return client_control.run(self, function, args, kwargs, workers=workers, wait=wait,
                                  on_error=on_error)

    def run_on_scheduler(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` in the scheduler's process, on its loop thread
        (``dask_scheduler=`` is passed if it takes it): keep it short."""
        return client_control.run_on_scheduler(self, function, args, kwargs)

    def who_has(self, futures: Any = None) -> dict:
        """``{key: [addresses of the workers holding it]}`` (all keys, or ``futures``')."""
        return client_control.who_has(self, futures)

    def has_what(self, workers: Any = None) -> dict:
        """``{worker address: [keys it holds]}``."""
        return client_control.has_what(self, workers)

    def nthreads(self, workers: Any = None) -> dict:
        """``{worker address: number of threads}``."""
        return client_control.nthreads(self, workers)

    ncores = nthreads

    def upload_file(self, filename: str, load: bool = True) -> dict:
        """Send a local file to every worker, and to every worker that joins later; a
        ``.py`` is imported (reloaded), a ``.zip``/``.egg`` put on ``sys.path``."""
        return client_control.upload_file(self, filename, load=load)

    # ---------------------------------------------------------------- datasets, versions
    def publish_dataset(self, *args: Any, name: str | None = None, override: bool = False,
                        **kwargs: Any) -> None:
        """Publish named datasets (``publish_dataset(x=f)`` or ``publish_dataset(f,
        name="x")``) on the scheduler, which keeps their futures alive until unpublished;
        ``KeyError`` if the name is taken (unless ``override=True``)."""
        dataset_ops.publish_dataset(self, args, name, override, kwargs)

    def get_dataset(self, name: str, default: Any = dataset_ops.NO_DEFAULT) -> Any:
        """A published dataset (its futures bound to this client); ``KeyError`` if there is
        none by that name and no ``default``."""
        return dataset_ops.get_dataset(self, name, default)

    def list_datasets(self) -> list[str]:
        return dataset_ops.list_datasets(self)

    def unpublish_dataset(self, name: str) -> None:
        dataset_ops.unpublish_dataset(self, name)

    @property
    def datasets(self) -> dataset_ops.Datasets:
        """The published datasets as a mutable mapping."""
        return dataset_ops.Datasets(self)

    def get_versions(self, check: bool = False, packages: Any = None) -> dict:
        """Versions of Python and key packages in the client, the scheduler and each
        worker; ``check=True`` raises ``ValueError`` if they differ."""
        return versions.collect(self, check=check, packages=packages)

    def register_plugin(self, plugin: Any, name: str | None = None,
                        idempotent: bool | None = None) -> Any:
        """Register a ``WorkerPlugin`` (set up on every worker, and on workers joining
        later) or a ``SchedulerPlugin`` (started in the scheduler); see
        :mod:`hpcsched.core.plugins`."""
        return plugins.register_plugin(self, plugin, name, idempotent)

    def register_worker_plugin(self, plugin: Any = None, name: str | None = None,
                               nanny: bool | None = None) -> Any:
        """``register_plugin`` for a worker plugin (distributed's older name), for a nanny
        plugin with ``nanny=True`` (or a ``NannyPlugin`` and ``nanny=None``)."""
        if nanny and isinstance(plugin, plugins.WorkerPlugin):
            raise ValueError(f"register_worker_plugin(nanny=True): {plugin!r} is a WorkerPlugin")
        if nanny is None:  # as distributed: a NannyPlugin goes to the nannies
            nanny = is_nanny_plugin(plugin)
        return plugins.register_plugin(self, plugin, name, kind="nanny" if nanny else "worker")

    def unregister_worker_plugin(self, name: str, nanny: bool | None = None) -> Any:
        """Tear a worker (or nanny) plugin down on every worker (nanny); later ones no longer
        get it."""
        return plugins.unregister_worker_plugin(self, name)

    def replicate(self, futures: Any, n: int | None = None, workers: Any = None,
                  branching_factor: int = 2) -> None:
        """Copy the futures' data onto ``n`` workers (all if None), among ``workers`` if
        given; returns once they hold it. Copies beyond ``n`` are kept (distributed drops
        them); ``branching_factor`` is accepted and unused (workers fetch from holders)."""
        client_control.replicate(self, futures, n=n, workers=workers)

    def rebalance(self, futures: Any = None, workers: Any = None, **kwargs: Any) -> None:
        """Move data from workers holding more than the mean to those holding less, as
        distributed does; no copy is dropped before its new holder has it."""
        client_control.rebalance(self, futures, workers)

    def restart(self, timeout: float | None = 120.0, wait_for_workers: bool = True) -> None:
        """Reset the cluster: every future of every client is cancelled and the workers drop
        its data; each worker plugin is torn down and set up again.

        Workers are *not* new processes: under MPI a rank cannot be respawned, and without
        a nanny no process is restarted over TCP either. Module-level state a task left
        in a worker's process remains; a task running now finishes, its result dropped."""
        client_control.restart(self, timeout, wait_for_workers)

    def wait_for_workers(self, n_workers: int = 1, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        while True:
            n = len(self.scheduler_info()["workers"])
            if n >= n_workers:
                return
            if self.cluster is not None and hasattr(self.cluster, "check_failures"):
                self.cluster.check_failures()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"only {n} of {n_workers} workers joined within {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def retire_workers(self, workers: list[str] | None = None, names: list[str] | None = None,
                       n: int | None = None, close: bool = True,
                       timeout: float | None = 120.0) -> list[str]:
        rid = self._new_id("retire")
        reply = self._request({"op": "retire-workers", "request_id": rid, "workers": workers,
                               "names": names, "n": n, "close": close}, rid, timeout)
        return list(reply.get("retired", []))

    # ---------------------------------------------------------------- diagnostics
    # (the work is done in hpcsched.diagnostics, reached through core.seams)
    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's link, with its access token; None when it is disabled."""
        return self.scheduler_info().get("services", {}).get("dashboard")

    def get_task_stream(self, start: Any = None, stop: Any = None, count: int | None = None,
                        plot: bool = False, filename: str = "task-stream.html") -> list:
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
        if self._closed:
            return
        try:
            rid = "close-client-reply"
            if self.status == "running":
                self._request({"op": "close-client"}, rid, timeout)
        except Exception:
            pass
        self._closed = True
        self.status = "closed"
        if self._watch is not None:
            self._watch.stop()
        self._outq.put(None)
        self._callback_q.put(None)
        self._comm.close()
        self._sender.join(timeout)
        self._reader.join(timeout)
        global _default_client
        with _default_lock:
            if _default_client is self:
                _default_client = None
        if self._dask_config is not None:
            restore_dask_scheduler(self._dask_config)
            self._dask_config = None
        self._close_owned_cluster()

    shutdown = close


FIRST_MAP_BATCH = 1000  # tasks of a large map sent ahead of the rest
MAX_MAP_BATCH = 50_000  # tasks per update-graph message at most


def _map_batches(n: int, batch_size: int | None) -> list[tuple[int, int]]:
    """(start, stop) of the update-graph messages of a map of ``n`` items.

    Without ``batch_size``, a large map sends its first :data:`FIRST_MAP_BATCH`
    tasks on their own: the workers start on them while the client prepares,
    and the scheduler inserts, the rest (measured: a 10,000-task map kept every
    worker idle for the 0.15-0.35 s the whole graph took to prepare and insert).
    """
    if batch_size is None:
        if n <= 2 * FIRST_MAP_BATCH:
            return [(0, n)] if n else []
        bounds = [(0, FIRST_MAP_BATCH)]
        start = FIRST_MAP_BATCH
        step = MAX_MAP_BATCH
    else:
        bounds, start, step = [], 0, batch_size
    while start < n:
        bounds.append((start, min(start + step, n)))
        start += step
    return bounds


def _coalesce(msgs: list) -> list:
    """Merge runs of adjacent ``client-releases-keys`` (one per dropped future) into one
    message: the scheduler then handles one event for a whole map's worth of releases."""
    out: list = []
    run: list | None = None  # keys of the release message being built
    for m in msgs:
        if m.get("op") == "client-releases-keys":
            if run is None:
                run = list(m["keys"])
                out.append({"op": "client-releases-keys", "keys": run})
            else:
                run.extend(m["keys"])
        else:
            run = None
            out.append(m)
    return out


def _refs_for_futures(x: Any, deps: dict, client: Client) -> Any:
    """``x`` with ``client``'s futures replaced by Refs, recorded in ``deps`` (a module function,
    not a closure: a recursive closure is a reference cycle that would keep ``deps``'s
    futures alive until the garbage collector runs)."""
    t = type(x)
    if t is Future:
        if x.client is not client:
            raise ValueError(f"{x!r} belongs to another client")
        deps[x.key] = x
        return Ref(x.key)
    if t is tuple:
        return tuple([_refs_for_futures(i, deps, client) for i in x]) if x else x
    if t is list:
        return [_refs_for_futures(i, deps, client) for i in x]
    if t is dict:
        return {k: _refs_for_futures(v, deps, client) for k, v in x.items()}
    if t is set:
        return {_refs_for_futures(i, deps, client) for i in x}
    return x


def _delayed_container(x: Any) -> Any:
    """A list/tuple/set/dict holding dask collections, as one ``dask.delayed`` (as
    ``dask.compute`` and distributed's ``compute(traverse=True)`` treat them)."""
    if isinstance(x, (list, tuple, set, dict)):
        values = x.values() if isinstance(x, dict) else x
        if any(is_dask_collection(v) for v in values):
            import dask

            return dask.delayed(x)
    return x


def _annotated_keys(annotations: dict) -> set:
    """Keys that carry an annotation: fusion keeps them (their settings are theirs alone)."""
    out: set = set()
    for per_key in annotations.values():
        out.update(per_key)
    return out


def _close_at_exit(ref: weakref.ref) -> None:
    client = ref()
    if client is not None and not client._closed:
        try:
            client.close(timeout=2.0)
        except Exception:
            pass


def default_client() -> Client | None:
    return _default_client


__all__ = ["Client", "Future", "wait", "as_completed", "progress", "GraphError",
           "CancelledError", "write_scheduler_file", "read_scheduler_file"]
