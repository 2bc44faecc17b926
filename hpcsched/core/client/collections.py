"""dask collections and task graphs on hpcsched: what dask hands a scheduler, made ours.

dask talks to a scheduler through a *get function*, ``get(graph, keys)``
(dask's "Scheduler overview" documentation). What ``graph`` is has changed
over dask's releases: a dict of tuples, a ``HighLevelGraph`` of layers, and
since 2025 an *expression* whose ``__dask_graph__()`` gives a dict of
task-spec nodes (``Task``, ``DataNode``, ``Alias``, with ``TaskRef``
pointers). This module accepts each of them through dask's own public
methods (``__dask_graph__``, ``__dask_annotations__``,
``convert_legacy_graph``) and turns them into the dict hpcsched's
:func:`~hpcsched.core.graph.dsk.normalize` reads:

* a legacy dict (tuples only) passes unchanged, so hpcsched's own fusion and
  ordering see its structure;
* a graph holding task-spec nodes is converted whole with dask's
  ``convert_legacy_graph`` (it also handles a mix of both forms); each node
  then runs as dask runs it, ``node(values_of_its_dependencies)``, so no
  copy of dask's evaluation rules lives here.

Annotations (``dask.annotate(retries=..., resources=..., priority=...,
workers=..., allow_other_workers=..., checkpoint=...)``) come back per key, as dask's
distributed scheduler reads them. ``checkpoint`` also applies to ``submit`` and ``map``
called inside ``dask.annotate`` (:func:`call_annotations`): a plain call has no graph
layer to carry it, and its keyword arguments are the function's.

dask is optional: nothing here imports it unless the graph came from it.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Collection, Mapping
from typing import Any

from hpcsched._lazy import not_when_imported, when_imported
from hpcsched.core.client.futures import Future
from hpcsched.core.client.worker_client import worker_client
from hpcsched.core.graph.dsk import Call, Ref
from hpcsched.core.protocol.annotations import annotation_problem
from hpcsched.core.worker.context import in_task

Key = Any
Annotations = dict[str, dict[Key, Any]]  # annotation name -> key -> value

#: the annotations hpcsched acts on (others are accepted and kept for plugins)
KNOWN_ANNOTATIONS = ("retries", "resources", "priority", "workers", "allow_other_workers",
                     "checkpoint", "ranks", "ranks_per_node", "duration")
#: the annotations of an enclosing ``dask.annotate`` that ``submit`` and ``map`` take
CALL_ANNOTATIONS = ("checkpoint", "ranks", "ranks_per_node")
#: annotations that are durations: seconds, or as dask writes them ("20m", "1h30m")
DURATIONS = ("duration", "time_limit")


def call_duration(name: str, value: Any) -> tuple[float, str] | None:
    """A ``submit``/``map`` call's ``duration`` or ``time_limit``: its own ``value``, else
    the enclosing ``dask.annotate``'s; as (seconds, the text written), None if neither."""
    from hpcsched.core.units import parse_interval

    if value is None:
        dask = sys.modules.get("dask")
        value = dask.get_annotations().get(name) if dask is not None else None
        if value is None:
            return None
    return parse_interval(value, name), str(value)


def timed(func: Callable, duration: Any, time_limit: Any) -> tuple[Callable, float | None]:
    """What a ``submit``/``map`` call runs and how long it is expected to take: ``func``,
    under its ``time_limit`` if it has one (a
    :class:`~hpcsched.core.worker.tasks.time_limit.TimeLimited` call), and its ``duration``
    in seconds (None: not said); each the call's own, else the enclosing
    ``dask.annotate``'s."""
    limit = call_duration("time_limit", time_limit)
    if limit is not None:
        from hpcsched.core.worker.tasks.time_limit import TimeLimited

        func = TimeLimited(func, *limit)
    expected = call_duration("duration", duration)
    return func, expected[0] if expected else None


def call_annotations(keys: Collection[Key], ranks: int | None = None,
                     ranks_per_node: int | None = None,
                     duration: float | None = None) -> Annotations | None:
    """The per-key annotations that the enclosing ``dask.annotate`` block (if dask is
    imported) gives ``submit``/``map`` calls of ``keys`` (None: none); ``ranks`` and
    ``ranks_per_node``, the call's own, win over the block's; ``duration``: the call's
    expected seconds (:func:`call_duration`)."""
    out: Annotations = {}
    if duration is not None:
        out["duration"] = dict.fromkeys(keys, duration)
    for name, value in (("ranks", ranks), ("ranks_per_node", ranks_per_node)):
        if value is None:
            continue
        if annotation_problem(name, value) is not None or isinstance(value, bool):
            raise ValueError(f"{name}={value!r} is not valid: a task holds ranks=N worker "
                             "slots at once, at most ranks_per_node=M of them on one host, "
                             "N and M integers >= 1")
        out[name] = dict.fromkeys(keys, value)
    dask = sys.modules.get("dask")
    if dask is None or not keys:
        return out or None
    found = dask.get_annotations()
    for name in CALL_ANNOTATIONS:
        if name in found and name not in out:
            value = found[name]
            if annotation_problem(name, value) is not None:
                raise ValueError(f"dask.annotate({name}={value!r}) is not valid: "
                                 f"{annotation_problem(name, value)}")
            out[name] = dict.fromkeys(keys, value)
    return out or None


def is_dask_collection(x: Any) -> bool:
    """``dask.is_dask_collection`` without importing dask for objects that cannot be one."""
    if type(x).__module__.split(".", 1)[0] in ("builtins", "hpcsched", "numpy"):
        return False
    dask = sys.modules.get("dask")
    if dask is None:
        return False
    return bool(dask.is_dask_collection(x))


def graph_of(obj: Any) -> tuple[dict, Annotations]:
    """``(graph dict, annotations)`` of whatever dask passes a get function.

    ``obj`` is a dict (legacy tuples or task-spec nodes), a ``HighLevelGraph``,
    or anything with ``__dask_graph__`` (an expression, a collection).
    """
    annotations: Annotations = {}
    if not isinstance(obj, Mapping):
        if not hasattr(obj, "__dask_graph__"):
            raise TypeError(f"expected a task graph (a dict of tasks, or a dask collection or "
                            f"expression), not {type(obj).__name__}")
        get_annotations = getattr(obj, "__dask_annotations__", None)
        if get_annotations is not None:
            for name, per_key in (get_annotations() or {}).items():
                annotations.setdefault(name, {}).update(per_key)
        obj = obj.__dask_graph__()
    layers = getattr(obj, "layers", None)
    if isinstance(layers, Mapping):  # a HighLevelGraph: annotations live on its layers
        for layer in layers.values():
            for name, value in (getattr(layer, "annotations", None) or {}).items():
                per_key = annotations.setdefault(name, {})
                for key in layer:
                    per_key.setdefault(key, value(key) if callable(value) else value)
    # a persisted collection's graph maps each key to the future holding its result: those
    # keys are already on the cluster, not tasks to run
    graph = {k: v for k, v in obj.items() if not (isinstance(v, Future) and v.key == k)}
    return convert_task_spec(graph), annotations


def convert_task_spec(graph: dict) -> dict:
    """``graph`` with dask task-spec nodes made into hpcsched expressions (unchanged when it
    holds none)."""
    spec = sys.modules.get("dask._task_spec")
    if spec is None:
        return graph
    node_type = spec.GraphNode
    if not any(isinstance(v, node_type) for v in graph.values()):
        return graph
    converted = spec.convert_legacy_graph(graph)
    alias_type = spec.Alias
    out: dict = {}
    for key, node in converted.items():
        if type(node) is alias_type:
            out[key] = Ref(node.target)
        else:
            out[key] = Call(run_node, (node, {d: Ref(d) for d in node.dependencies}))
    for key in graph.keys() - out.keys():
        # convert_legacy_graph drops a key that names itself (a persisted future)
        out[key] = graph[key]
    return out


def run_node(node: Callable, values: dict) -> Any:
    """Run a dask task-spec node with the results of its dependencies (on a worker)."""
    return node(values)


def annotations_for_wire(annotations: Annotations, keys: Collection[Any]) -> dict:
    """The annotations hpcsched acts on, restricted to ``keys``, in the form the scheduler
    checks (a worker or a set of them becomes a list); a bad value is an error here, in the
    caller, rather than a refused message."""
    out: dict = {}
    for name in KNOWN_ANNOTATIONS:
        per_key = annotations.get(name)
        if not per_key:
            continue
        vals = {k: v for k, v in per_key.items() if k in keys}
        for k, v in vals.items():
            if name == "workers":
                v = vals[k] = [v] if isinstance(v, (str, int)) else \
                    list(v) if isinstance(v, (list, tuple, set, frozenset)) else v
            elif name in DURATIONS and isinstance(v, str):
                from hpcsched.core.units import parse_interval

                v = vals[k] = parse_interval(v, f"annotation {name} of {k!r}")
            if annotation_problem(name, v) is not None:
                raise ValueError(f"annotation {name}={v!r} of {k!r} is not valid: "
                                 f"{annotation_problem(name, v)}")
        if vals:
            out[name] = vals
    return out


def finalize_expr(collections: list, optimize_graph: bool = True) -> tuple[Any, list]:
    """One dask expression computing every collection to its final value, and its output keys
    (one per collection), as ``dask.compute`` builds it."""
    from dask.core import flatten

    try:
        from dask._expr import FinalizeCompute
        from dask.base import collections_to_expr
    except ImportError as e:  # pragma: no cover - dask older than the supported range
        raise ImportError(f"hpcsched needs dask >= 2025.7 for collections: {e}") from e
    expr = FinalizeCompute(collections_to_expr(collections, optimize_graph)).optimize()
    return expr, list(flatten(expr.__dask_keys__()))


def persist_expr(collections: list, optimize_graph: bool = True) -> tuple[Any, list]:
    """The optimized expression of ``collections`` and each one's (nested) keys, for persist."""
    from dask.base import collections_to_expr

    expr = collections_to_expr(collections, optimize_graph).optimize()
    return expr, list(expr.__dask_keys__())


# ----------------------------------------------------------------- dask's default scheduler
class DaskScheduler:
    """dask's default scheduler while an hpcsched client is (``dask.config`` ``scheduler``).

    Outside tasks it is ``client.get``. Inside a task (a task calling
    ``.compute()``, as dask's "Futures" documentation allows), it computes
    through the worker's own client with the task seceded meanwhile, so a
    worker whose threads all wait on such computations cannot deadlock. Worker
    processes install one without a client: outside tasks it is then dask's
    threaded scheduler.
    """

    def __init__(self, client: Any = None):
        self.client = client

    def __call__(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        if in_task():
            with worker_client() as client:
                return client.get(dsk, keys, **kwargs)
        if self.client is not None:
            return self.client.get(dsk, keys, **kwargs)
        import dask.threaded

        return dask.threaded.get(dsk, keys, **kwargs)

    def __repr__(self) -> str:
        return f"<hpcsched dask scheduler of {self.client!r}>"


class DaskClaim:
    """A client's claim on dask's default scheduler, taken once dask is loaded."""

    def __init__(self, client: Any):
        self._client = None if client is None else weakref.ref(client)
        self._saved: tuple | None = None  # (our scheduler, the settings it replaced)
        self._withdrawn = False

    def take(self) -> None:
        """Set dask's scheduler (dask.config is loaded), unless withdrawn meanwhile."""
        client = None if self._client is None else self._client()
        if self._withdrawn or (self._client is not None and client is None):
            return
        # a from-import: this may run while dask's package is still being initialized
        from dask import config as dask_config

        names = ("scheduler", "dataframe.shuffle.method")
        previous = {name: dask_config.get(name, None) for name in names}
        scheduler = DaskScheduler(client)
        dask_config.set({"scheduler": scheduler, "dataframe.shuffle.method": "tasks"})
        self._saved = (scheduler, previous)

    def withdraw(self) -> None:
        """Put back what :meth:`take` replaced, unless another client has taken over since."""
        self._withdrawn = True
        not_when_imported("dask.config", self.take)  # dask was never loaded: nothing to take
        if self._saved is None:
            return
        scheduler, previous = self._saved
        self._saved = None
        import dask.config

        if dask.config.get("scheduler", None) is scheduler:
            dask.config.set(previous)


def become_dask_scheduler(client: Any) -> DaskClaim:
    """Make ``client`` (None in a worker process) dask's default scheduler when dask is
    loaded, as distributed's ``Client(set_as_default=True)`` does; dataframe shuffles then
    run as tasks (dask's "disk" shuffle writes to one machine's files). If the program has
    not imported dask, this happens when it does (importing dask costs more than starting a
    client); without dask installed, never. Returns the claim, for
    :func:`restore_dask_scheduler`."""
    claim = DaskClaim(client)
    when_imported("dask.config", claim.take)
    return claim


def restore_dask_scheduler(claim: DaskClaim) -> None:
    """Undo :func:`become_dask_scheduler`, unless another client has taken over since."""
    claim.withdraw()
