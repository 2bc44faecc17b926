"""From a client's calls to ``update-graph`` messages: maps, task graphs, dask collections.

``Client.map``, ``get``, ``compute`` and ``persist`` are thin methods over a
:class:`Submitter`, with distributed's signatures
(https://distributed.dask.org/en/stable/api.html#client). Each builds the
tasks (see :mod:`hpcsched.core.client.submission` for their wire form), queues one
``update-graph`` message per batch on the client's connection, and returns
:class:`~hpcsched.core.client.futures.Future` objects for the keys asked for. A
Submitter needs the client's connection, its future table (which keys it
holds), a way to make its futures, and ``gather`` (``compute(sync=True)``).

Futures given as arguments, or found inside a graph, become references to
their keys (:class:`~hpcsched.core.graph.dsk.Ref`); the caller keeps those futures
alive until the message that depends on them is queued, or the scheduler could
hear of their release before it hears of the task that needs them.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from hpcsched.core import config
from hpcsched.core.client.collections import (
    annotations_for_wire,
    call_annotations,
    finalize_expr,
    graph_of,
    is_dask_collection,
    persist_expr,
)
from hpcsched.core.client.futures import Future
from hpcsched.core.client.submission import (
    SCALARS,
    as_list,
    blake2b,
    flatten_keys,
    funcname,
    pack_keys,
    pure_token,
    task_run_spec,
)
from hpcsched.core.graph.dsk import Ref, gc_paused, normalize
from hpcsched.core.protocol.messages import UpdateGraph, UpdateMap
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.protocol.serialize import dumps_function, dumps_object
from hpcsched.core.settings import ClientSettings

if TYPE_CHECKING:
    from hpcsched.core.client.connection import SchedulerConnection
    from hpcsched.core.client.future_state import FutureTable

FIRST_MAP_BATCH = 1000  # tasks of a large map sent ahead of the rest
#: maps of at least this many elements go as a bulk map (hpcsched.core.state.bulk): one
#: record per block of calls, held compactly by the scheduler, run in ranges by workers
BULK_MAP_MIN = 32
MAX_MAP_BATCH = 50_000  # tasks per update-graph message at most


def update_graph(client_id: str, tasks: dict, keys: list, *, priority: int = 0,
                 retries: int = 0, resources: dict | None = None, workers: Any = None,
                 allow_other_workers: bool = False, static_priorities: dict | None = None,
                 annotations: dict | None = None) -> UpdateGraph:
    """The ``update-graph`` record for ``tasks`` (``{key: {"run_spec", "deps"}}``) of which
    client ``client_id`` wants ``keys``."""
    return UpdateGraph(client_id, tasks, keys, priority,
                       {k: retries for k in tasks} if retries else {}, resources,
                       as_list(workers), allow_other_workers, static_priorities, annotations)


def map_batches(n: int, batch_size: int | None) -> list[tuple[int, int]]:
    """(start, stop) of the update-graph messages of a map of ``n`` items.

    Without ``batch_size``, a large map sends its first :data:`FIRST_MAP_BATCH`
    tasks on their own: the workers start on them while the client prepares,
    and the scheduler inserts, the rest (otherwise a 10,000-task map keeps every
    worker idle for as long as the whole graph takes to prepare and insert).
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


def refs_for_futures(x: Any, deps: dict, table: FutureTable) -> Any:
    """``x`` with the futures of ``table`` replaced by Refs, recorded in ``deps`` (a module
    function, not a closure: a recursive closure is a reference cycle that would keep
    ``deps``'s futures alive until the garbage collector runs)."""
    t = type(x)
    if t is Future:
        if x.client.future_table is not table:
            raise ValueError(f"{x!r} belongs to another client")
        deps[x.key] = x
        return Ref(x.key)
    if t is tuple:
        return tuple([refs_for_futures(i, deps, table) for i in x]) if x else x
    if t is list:
        return [refs_for_futures(i, deps, table) for i in x]
    if t is dict:
        return {k: refs_for_futures(v, deps, table) for k, v in x.items()}
    if t is set:
        return {refs_for_futures(i, deps, table) for i in x}
    return x


def unpack_futures(obj: Any, table: FutureTable) -> tuple[Any, dict]:
    """Replace futures inside ``obj`` by Refs; return (new obj, {key: future}). The caller
    keeps the futures until the message that depends on them is queued."""
    deps: dict = {}
    if type(obj) is tuple and len(obj) == 2 and type(obj[1]) is dict and not obj[1] \
            and all(type(a) in SCALARS for a in obj[0]):
        return obj, deps  # (args, {}) of plain values: the common case of submit/map
    return refs_for_futures(obj, deps, table), deps


def future_key(table: FutureTable, x: Any) -> Any:
    """The key of ``x`` if it is one of ``table``'s futures (for graph normalization)."""
    if type(x) is not Future:
        return None
    if x.client.future_table is not table:
        raise ValueError(f"{x!r} belongs to another client")
    return x.key


def annotated_keys(annotations: dict) -> set:
    """Keys that carry an annotation: fusion keeps them (their settings are theirs alone)."""
    out: set = set()
    for per_key in annotations.values():
        out.update(per_key)
    return out


def delayed_container(x: Any) -> Any:
    """A list/tuple/set/dict holding dask collections, as one ``dask.delayed`` (as
    ``dask.compute`` and distributed's ``compute(traverse=True)`` treat them)."""
    if isinstance(x, (list, tuple, set, dict)):
        values = x.values() if isinstance(x, dict) else x
        if any(is_dask_collection(v) for v in values):
            import dask

            return dask.delayed(x)
    return x


class Submitter:
    """Graphs and maps of one client to ``update-graph`` messages (module docstring)."""

    def __init__(self, conn: SchedulerConnection, table: FutureTable,
                 new_future: Callable[[Any], Future], gather: Callable[[Any], Any],
                 new_futures: Callable[[list], list[Future]] | None = None):
        self.conn = conn
        self.table = table
        self.new_future = new_future
        self.new_futures = new_futures or (lambda keys: [new_future(k) for k in keys])
        self.gather = gather
        # large maps go as bulk maps (not to a scheduler that keeps a journal: it takes up
        # tasks again after a restart, and a worker's results of a map's ranges are no tasks)
        self.bulk_maps = True
        # a pure bulk map's prefix (a hash of it) -> the prefix it was last sent under: a
        # prefix is sent once, so the same map sent again once partly released needs another
        self.pure_maps: dict[str, str] = {}

    def submit(self, func: Callable, args: tuple, kwargs: dict, *, key: Any, pure: bool,
               token: str, priority: int, retries: int, resources: dict | None, workers: Any,
               allow_other_workers: bool, annotate: Callable[[Any], Any]) -> Future:
        """``Client.submit``'s work: one task's ``update-graph``; ``annotate(key)`` gives its
        per-call annotations."""
        # ``held`` keeps the futures found in the arguments alive until the graph that needs
        # them is queued: a future passed inline (``submit(f, submit(g, 1))``) is otherwise
        # released, and the scheduler told so, before the task that depends on it arrives
        (args, kwargs), held = unpack_futures((args, kwargs), self.table)
        fblob = dumps_function(func)
        ablob = dumps_object((args, kwargs)) if (args or kwargs) else None
        if key is None:
            key = f"{funcname(func)}-" + (pure_token(fblob, ablob) if pure else token)
        if self.table.known(key):
            return self.new_future(key)
        fut = self.new_future(key)
        self.table.submitted(key, fut.state)  # its result is fetched with those around it
        task = {"run_spec": RunSpec(fblob, ablob, bool(held)), "deps": list(held)}
        self.conn.send(UpdateGraph(
            self.conn.client_id, {key: task}, [key], priority, {key: retries} if retries else {},
            resources, as_list(workers), allow_other_workers, {key: 0}, annotate(key)))
        del held
        return fut

    def map(self, func: Callable, items: list, kwargs: dict, *, keys: list | None, base: str,
            token: str, pure: bool, batch_size: int | None, ranks: int | None = None,
            duration: float | None = None, ranks_per_node: int | None = None,
            **opts: Any) -> list[Future]:
        """``Client.map``'s work: a bulk map (:meth:`bulk_map`) when it is large and plain
        (no ``dask.annotate`` of calls around it either: ``checkpoint``; no ``ranks``), else one task per item of ``items`` (argument tuples), sent in batches
        (:func:`map_batches`); keys from ``keys``, or ``base`` and a token (pure: of the
        call; else ``token`` and the item's index)."""
        if self.bulk_maps and keys is None and len(items) >= BULK_MAP_MIN \
                and not opts.get("resources") \
                and not opts.get("workers") and not opts.get("allow_other_workers") \
                and call_annotations((base,), ranks, ranks_per_node) is None:  # (per-call annotations: per task)
            bulk = self.bulk_map(func, items, kwargs, base=base, token=token, pure=pure,
                                 batch_size=batch_size, priority=opts.get("priority", 0),
                                 retries=opts.get("retries", 0), duration=duration)
            if bulk is not None:
                return bulk
        table = self.table
        known = table.known
        send = self.conn.send
        new_future = self.new_future
        fblob = dumps_function(func)
        futures: list[Future] = []
        with gc_paused(len(items)):
            for start, stop in map_batches(len(items), batch_size):
                tasks = {}
                held: list = []
                batch = []
                for i in range(start, stop):
                    (a, kw), deps = unpack_futures((items[i], kwargs), table)
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
                    if not known(k):
                        tasks[k] = {"run_spec": RunSpec(fblob, ablob, bool(deps)), "deps": list(deps)}
                futures += [new_future(k) for k in batch]
                if tasks:
                    send(update_graph(self.conn.client_id, tasks, list(tasks),
                                      static_priorities={k: start + i
                                                         for i, k in enumerate(tasks)},
                                      annotations=call_annotations(tasks, ranks, ranks_per_node,
                                                                   duration),
                                      **opts))
                del held
        return futures

    def bulk_map(self, func: Callable, items: list, kwargs: dict, *, base: str, token: str,
                 pure: bool, batch_size: int | None, priority: int,
                 retries: int, duration: float | None = None) -> list[Future] | None:
        """A map as a bulk map (:mod:`hpcsched.core.state.bulk`): the function pickled once,
        each element's arguments once, element ``i``'s key ``f"{prefix}{i}"``; None if an
        argument is a future (the map then goes task by task: its elements depend on
        others). With ``pure``, the prefix is a hash of the function and the arguments: the
        same map again, while its futures are held, gives the same futures."""
        table = self.table
        if kwargs:
            _, deps = unpack_futures(((), kwargs), table)
            if deps:
                return None
        scalars = not kwargs  # every argument a scalar: pickled as it is (no cloudpickle)
        for args in items:
            for a in args:
                if type(a) not in SCALARS:
                    scalars = False
                    _, deps = unpack_futures((args, kwargs), table)
                    if deps:
                        return None
                    break
        fblob = dumps_function(func)
        prefix = f"{base}-{token}-"
        n = len(items)
        if pure:
            h = blake2b(fblob, digest_size=12)
            h.update(self.conn.client_id.encode())
            h.update(dumps_object((items, kwargs)))
            pure_prefix = f"{base}-{h.hexdigest()}-"
            sent = self.pure_maps.get(pure_prefix)
            if sent is None:
                prefix = pure_prefix
            elif table.known(f"{sent}0") and all(table.known(f"{sent}{i}") for i in range(n)):
                return self.new_futures([f"{sent}{i}" for i in range(n)])
            # else: the map was sent and partly released; a new prefix, never reused
            self.pure_maps[pure_prefix] = prefix
        futures: list[Future] = []
        client_id, send = self.conn.client_id, self.conn.send
        dumps = partial(pickle.dumps, protocol=5) if scalars else dumps_object
        with gc_paused(n):
            # block by block, so that the workers start on the first while the rest is
            # pickled; each block's futures exist before its results can be reported
            for start, stop in map_batches(n, batch_size):
                futures += self.new_futures([f"{prefix}{i}" for i in range(start, stop)])
                send(UpdateMap(prefix=prefix, function=fblob,
                               args=[dumps((items[i], kwargs)) for i in range(start, stop)],
                               offset=start, priority=priority, retries=retries,
                               duration=duration, client=client_id))
        return futures

    def submit_graph(self, dsk: Any, keys: Any, *, fuse: bool | None = None,
                     **opts: Any) -> Any:
        """Send a graph (see :func:`~hpcsched.core.client.collections.graph_of`); return futures
        for ``keys`` in the same nesting."""
        graph, annotations = graph_of(dsk)
        flat = flatten_keys(keys)
        held = self.table.states
        missing = [k for k in flat if k not in graph and k not in held]
        if missing:
            raise KeyError(f"keys not in the graph: {missing[:10]!r}")
        with gc_paused(len(graph)):
            # one walk over the graph: futures inside it become references to their keys
            tasks = normalize(graph, known=set(held), ref_of=partial(future_key, self.table))
            if config.read(ClientSettings, fuse=fuse).fuse and len(tasks) > 1:
                from hpcsched.core.graph.fusion import fuse_linear

                tasks = fuse_linear(tasks, keep=set(flat) | annotated_keys(annotations))
            wire = {k: {"run_spec": task_run_spec(t), "deps": list(t.dependencies)}
                    for k, t in tasks.items()}
            del tasks
        futures = {k: self.new_future(k) for k in flat}
        self.conn.send(update_graph(
            self.conn.client_id, wire, list(futures),
            annotations=annotations_for_wire(annotations, wire.keys()) or None,
            **opts))
        return pack_keys(keys, futures)

    def compute(self, collections: Any, *, sync: bool, optimize_graph: bool,
                traverse: bool, fuse: bool | None, **opts: Any) -> Any:
        """``Client.compute`` of dask collections (and plain values, passed through)."""
        singleton = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if singleton else list(collections)
        if traverse:
            items = [delayed_container(a) for a in items]
        variables = [a for a in items if is_dask_collection(a)]
        futures: list = []
        if variables:
            expr, names = finalize_expr(variables, optimize_graph)
            by_name = self.submit_graph(expr, names, fuse=fuse, **opts)
            it = iter(by_name)
            futures = [next(it) if is_dask_collection(a) else a for a in items]
        else:
            futures = items
        result = self.gather(futures) if sync else futures
        return result[0] if singleton else result

    def persist(self, collections: Any, *, optimize_graph: bool, **opts: Any) -> Any:
        """``Client.persist``: the collections, rebuilt on futures of their keys."""
        singleton = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if singleton else list(collections)
        bad = [type(a).__name__ for a in items if not is_dask_collection(a)]
        if bad:
            raise TypeError(f"persist takes dask collections, not {', '.join(bad)}")
        expr, keys = persist_expr(items, optimize_graph)
        futures = self.submit_graph(expr, [list(flatten_keys(k)) for k in keys], **opts)
        out = []
        for coll, futs in zip(items, futures, strict=True):
            rebuild, args = coll.__dask_postpersist__()
            out.append(rebuild({f.key: f for f in futs}, *args))
        return out[0] if singleton else out
