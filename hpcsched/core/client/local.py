"""The single-machine scheduler: run a dask-style graph in this process.

``get(dsk, keys)`` runs the tasks needed for ``keys`` of a dask-style graph
dict (``{key: (func, *args)}``, see :mod:`hpcsched.core.graph.dsk`) on a pool of
threads and returns their results in the shape of ``keys``. It is
``hpcsched.get``.

Goal: a small memory footprint within a scheduling budget of well under a
millisecond per task. Three tie-breakers decide which ready task runs next:

1. *Last in, first out.* Ready tasks live on a stack; when a task finishes,
   the dependents it made ready go on top, so the work just started is
   finished before new work begins (and its inputs can be released).
2. *Static priorities.* Tasks made ready at the same moment (and the initial
   tasks) are pushed in the order computed by :func:`hpcsched.core.graph.order.order`
   before the run, the highest priority on top: a depth-first numbering in
   which, at each node, the dependencies on which the most depends come first.
3. *Release early.* A result is dropped as soon as no pending task needs it
   and nobody asked for it.

State lives in one place, the calling thread; worker threads only evaluate
expressions. They take ``(key, expr, inputs)`` from a queue and put
``(key, result, exception)`` on another; at most ``num_workers`` tasks are
handed out at once, so the LIFO decision is taken at the last moment. With
``num_workers=1`` tasks run in the calling thread (no thread hop, debuggers
work).

An exception in a task is re-raised to the caller with its own type once the
tasks already running have finished; nothing new starts after a failure.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

from hpcsched.core.client.collections import graph_of
from hpcsched.core.graph.dsk import Key, Task, evaluate, normalize
from hpcsched.core.graph.order import order

__all__ = ["get"]

# How long the scheduling thread blocks on the result queue before checking
# again; a wake-up per second is not spinning, and keeps Ctrl-C responsive.
_POLL = 1.0


def _flatten(keys: Any, out: list) -> list:
    if isinstance(keys, list):
        for k in keys:
            _flatten(k, out)
    else:
        out.append(keys)
    return out


def _pack(keys: Any, results: Mapping[Key, Any]) -> Any:
    """Results in the shape of ``keys``.

    A list of keys gives a tuple, as dask's get functions return (``dask.compute``
    unpacks that)."""
    if isinstance(keys, list):
        return tuple([_pack(k, results) for k in keys])
    return results[keys]


def _needed(tasks: Mapping[Key, Task], wanted: Collection[Key]) -> dict[Key, Task]:
    """The tasks ``wanted`` depends on, transitively (the rest is not run)."""
    seen: set[Key] = set(wanted)
    todo = list(wanted)
    while todo:
        for d in tasks[todo.pop()].dependencies:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return {k: t for k, t in tasks.items() if k in seen}


def get(dsk: Any, keys: Any, num_workers: int | None = None, **kwargs: Any) -> Any:
    """Compute ``keys`` of the dask-style graph ``dsk`` with ``num_workers`` threads.

    ``dsk`` is a graph dict, or whatever dask hands a get function
    (``dask.compute(x, scheduler=hpcsched.get)``: a HighLevelGraph, an expression).
    ``keys`` is a key or a (nested) list of keys; the result has the same
    shape, with tuples for lists as dask's get functions return. ``num_workers``
    defaults to the number of CPUs. Other keyword arguments (dask's schedulers
    take ``cache``, ``pool``...) are accepted and ignored, so callers written
    for dask's ``get`` work unchanged.
    Raises ``KeyError`` for a requested key that is not in the graph and
    :class:`~hpcsched.core.graph.dsk.GraphError` for a cycle.

    >>> inc = lambda x: x + 1
    >>> get({"x": 1, "y": (inc, "x")}, ["y", ["x"]])
    (2, (1,))
    """
    if num_workers is None:
        num_workers = os.cpu_count() or 1
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
    graph, _ = graph_of(dsk)
    wanted = _flatten(keys, [])
    for k in wanted:
        try:
            present = k in graph
        except TypeError:
            raise TypeError(f"requested key {k!r} is not hashable") from None
        if not present:
            raise KeyError(k)
    tasks = _needed(normalize(graph), wanted)
    results = _execute(tasks, set(wanted), num_workers)
    return _pack(keys, results)


def _execute(tasks: dict[Key, Task], wanted: set[Key], num_workers: int) -> dict[Key, Any]:
    priority = order({k: t.dependencies for k, t in tasks.items()})
    prio = priority.__getitem__
    waiting = {k: len(t.dependencies) for k, t in tasks.items()}
    dependents: dict[Key, list[Key]] = {k: [] for k in tasks}
    for k, t in tasks.items():
        for d in t.dependencies:
            dependents[d].append(k)
    consumers = {k: len(ps) for k, ps in dependents.items()}
    data: dict[Key, Any] = {}
    ready = sorted((k for k, n in waiting.items() if not n), key=prio, reverse=True)

    def finish(key: Key, value: Any) -> None:
        """Store a result, release inputs nobody needs, push what became ready."""
        data[key] = value
        for d in tasks[key].dependencies:
            consumers[d] -= 1
            if not consumers[d] and d not in wanted:
                del data[d]
        new = []
        for p in dependents[key]:
            waiting[p] -= 1
            if not waiting[p]:
                new.append(p)
        if new:
            if len(new) > 1:
                new.sort(key=prio, reverse=True)  # highest priority on top
            ready.extend(new)

    def inputs(key: Key) -> dict[Key, Any]:
        return {d: data[d] for d in tasks[key].dependencies}

    if num_workers == 1:
        while ready:
            key = ready.pop()
            finish(key, evaluate(tasks[key].expr, inputs(key)))
    else:
        _run_threads(tasks, ready, finish, inputs, min(num_workers, len(tasks)))
    return {k: data[k] for k in wanted}


def _worker(inq: queue.SimpleQueue, outq: queue.SimpleQueue) -> None:
    while True:
        item = inq.get()
        if item is None:
            return
        key, expr, args = item
        try:
            outq.put((key, evaluate(expr, args), None))
        except BaseException as e:  # noqa: B036 - every failure goes back to the caller
            outq.put((key, None, e))
        del item, expr, args  # do not keep the last task's inputs alive


def _run_threads(tasks: dict[Key, Task], ready: list[Key],
                 finish: Callable[[Key, Any], None],
                 inputs: Callable[[Key], dict[Key, Any]], num_workers: int) -> None:
    inq: queue.SimpleQueue = queue.SimpleQueue()
    outq: queue.SimpleQueue = queue.SimpleQueue()
    threads = [threading.Thread(target=_worker, args=(inq, outq), daemon=True,
                                name=f"hpcsched-local-{i}") for i in range(num_workers)]
    for t in threads:
        t.start()
    running = 0
    error: BaseException | None = None
    clean = False
    try:
        while ready or running:
            while ready and running < num_workers and error is None:
                key = ready.pop()
                inq.put((key, tasks[key].expr, inputs(key)))
                running += 1
            if not running:
                break
            try:
                item = outq.get(timeout=_POLL)
            except queue.Empty:
                continue
            while True:  # drain everything that finished meanwhile
                key, value, exc = item
                running -= 1
                if exc is not None:
                    if error is None:
                        error = exc
                        running -= _discard(inq)  # queued but not started: never start
                elif error is None:
                    finish(key, value)
                try:
                    item = outq.get_nowait()
                except queue.Empty:
                    break
            if error is not None and not running:
                break
        clean = True
    finally:
        for _ in threads:
            inq.put(None)
        for t in threads:
            # After an interrupt, running tasks finish on their own (daemon threads).
            t.join(None if clean else 0.1)
    if error is not None:
        raise error


def _discard(inq: queue.SimpleQueue) -> int:
    n = 0
    while True:
        try:
            inq.get_nowait()
        except queue.Empty:
            return n
        n += 1
