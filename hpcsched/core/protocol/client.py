"""The protocol between a client and the scheduler: one record per op (see
:mod:`hpcsched.core.protocol.messages`).

A client talks to the scheduler only, as in distributed. It submits graphs
and says which keys it wants (``update-graph``, ``client-desires-keys``, ...);
the scheduler tells it when results are ready or erred. Requests carrying a
``request_id`` (``gather``, ``scatter``, cluster control, the coordination
primitives of :mod:`hpcsched.core.protocol.primitives`) get one reply carrying it back.
"""

from __future__ import annotations

from typing import Any

from hpcsched.core.protocol import checks as fc
from hpcsched.core.protocol import run_spec
from hpcsched.core.protocol.directions import C2S, INTRODUCTION, S2C, Stimulus
from hpcsched.core.protocol.records import Record, context, extra, wire
from hpcsched.core.protocol.wire import message

Key = Any

class FromClient(Stimulus):
    """Base of a client's requests to the scheduler's state machine: the scheduler fills in
    which client sent it."""

    client: str = context()


# ====================================================================== client -> scheduler

@message("register-client", C2S, INTRODUCTION)
class RegisterClient(Record):
    """A client introduces itself (its first message)."""

    client: str = wire(fc.string, doc="the client's id, unique in the cluster")


@message("update-graph", C2S)
class UpdateGraph(FromClient):
    """A client submits tasks: ``tasks[key] = {"run_spec": ..., "deps": [...]}``."""

    tasks: dict = wire(fc.dict_of(run_spec.task), doc="key -> {run_spec, deps}")
    keys: list = wire(fc.keys, doc="keys the client holds futures to")
    priority: int = wire(fc.number, 0, doc="user priority: higher runs earlier")
    retries: dict = wire(fc.dict_of(fc.count), factory=dict, doc="key -> times to retry")
    resources: dict | None = wire(fc.optional(fc.dict_of(fc.number, keyed=fc.string)), None,
                                  doc='what each task needs, e.g. `{"GPU": 1}`')
    workers: list | None = wire(fc.optional(fc.list_of(fc.worker_ref)), None,
                                doc="workers allowed (address, name or rank)")
    allow_other_workers: bool = wire(fc.boolean, False,
                                     doc="`workers` is a preference, not a restriction")
    static_priorities: dict | None = wire(fc.optional(fc.dict_of(fc.number)), None,
                                          doc="key -> order from the client (else order())")
    annotations: dict | None = wire(fc.optional(fc.dict_of(fc.mapping, keyed=fc.string)), None,
                                    doc="per-key annotations (dask.annotate): name -> "
                                        "{key: value}; they override the call's values")


@message("update-map", C2S)
class UpdateMap(FromClient):
    """A block of a bulk map: one function over many argument tuples. Element ``i`` of the
    map is the task ``f"{prefix}{i}"``; this block holds elements ``offset`` to
    ``offset + len(args) - 1`` (a map's first block creates it, later ones extend it)."""

    prefix: str = wire(fc.text(1000), doc="the map's key prefix (it ends with `-`)")
    function: bytes = wire(fc.blob, doc="the pickled function, once for the map")
    args: list = wire(fc.list_of(fc.blob), doc="each element's pickled (args, kwargs)")
    offset: int = wire(fc.count, 0, doc="the index of the block's first element")
    priority: int = wire(fc.number, 0, doc="user priority: higher runs earlier")
    retries: int = wire(fc.count, 0, doc="times each element is retried when it raises")
    duration: float | None = wire(fc.optional(fc.positive_number), None, sparse=True,
                                  doc="seconds an element is expected to take, as submitted")


@message("client-desires-keys", C2S)
class ClientDesiresKeys(FromClient):
    """The client wants the results of ``keys`` (it holds futures to them)."""

    keys: list = wire(fc.keys)
    fire_and_forget: bool = wire(fc.boolean, False, sparse=True,
                                 doc="run them even once no client wants them")


@message("retry-keys", C2S)
class RetryKeys(FromClient):
    """Run erred tasks again, with the erred tasks they depend on."""

    keys: list = wire(fc.keys)


@message("client-releases-keys", C2S)
class ClientReleasesKeys(FromClient):
    """The client dropped its futures to ``keys``."""

    keys: list = wire(fc.keys)


@message("cancel-keys", C2S)
class CancelKeys(FromClient):
    """Cancel ``keys`` and what depends on them, for every client."""

    keys: list = wire(fc.keys)


@message("scatter", C2S)
class ScatterData(FromClient):
    """A client moves its own data onto workers (``Client.scatter``); answered by
    ``scatter-reply``."""

    scatter_id: str = wire(fc.string)
    data: dict = wire(fc.dict_of(fc.serialized), doc="key -> serialized value")
    nbytes: dict = wire(fc.dict_of(fc.count), factory=dict)
    workers: list | None = wire(fc.optional(fc.list_of(fc.worker_ref)), None)
    broadcast: bool = wire(fc.boolean, False, doc="a copy on every worker")


@message("gather", C2S)
class Gather(Record):
    """Send me the values of ``keys``; answered by ``gather-reply``.

    ``extra`` are finished keys whose values the client expects to be asked for soon:
    those whose results weigh at most ``extra_each`` bytes come along, in order, while
    they add up to at most ``extra_bytes``; the others stay on their workers."""

    request_id: str = wire(fc.string)
    keys: list = wire(fc.keys)
    extra: list = wire(fc.keys, factory=list, doc="keys whose small values may come along")
    extra_bytes: int = wire(fc.count, 0, doc="bytes of ``extra`` values at most, in all")
    extra_each: int = wire(fc.count, 0, doc="bytes of one ``extra`` value at most")


@message("scheduler-info", C2S)
class SchedulerInfo(Record):
    """Describe the cluster; answered by ``scheduler-info-reply`` (also the client's ping)."""

    request_id: str = wire(fc.string)


@message("retire-workers", C2S)
class RetireWorkersRequest(Record):
    """Retire workers gracefully (their data moves to others first); answered by
    ``retire-workers-reply``."""

    request_id: str = wire(fc.string)
    workers: list | None = wire(fc.optional(fc.list_of(fc.string)), None, doc="by address")
    names: list | None = wire(fc.optional(fc.list_of(fc.anything)), None, doc="by name")
    n: int | None = wire(fc.optional(fc.count), None, doc="this many more, idle ones first")
    close: bool = wire(fc.boolean, True, doc="close them once their data has moved")


@message("close-client", C2S)
class CloseClient(Record):
    """The client leaves; answered by ``close-client-reply``."""


@message("extension", C2S)
class Extension(Record):
    """A request to a scheduler extension (e.g. ``diagnostics``); answered by
    ``extension-reply``."""

    extension: str = wire(fc.string, doc="the extension's name")
    request_id: str | None = wire(fc.optional(fc.string), None)
    extra: dict = extra(doc="the extension's own fields (diagnostics: `what`, `start`, ...)")


@message("run", C2S)
class Run(Record):
    """``Client.run``: run a function on workers now (not as a task); answered by one
    ``control-reply`` once each has answered or left."""

    request_id: str = wire(fc.string)
    function: bytes = wire(fc.blob)
    args: bytes | None = wire(fc.optional(fc.blob), None)
    kwargs: bytes | None = wire(fc.optional(fc.blob), None)
    wait: bool = wire(fc.boolean, True, doc="send the results back (else None)")
    workers: list | None = wire(fc.optional(fc.list_of(fc.anything)), None)


@message("run-on-scheduler", C2S)
class RunOnScheduler(Record):
    """``Client.run_on_scheduler``; answered by ``control-reply``."""

    request_id: str = wire(fc.string)
    function: bytes = wire(fc.blob)
    args: bytes | None = wire(fc.optional(fc.blob), None)
    kwargs: bytes | None = wire(fc.optional(fc.blob), None)


@message("who-has", C2S)
class WhoHas(Record):
    """``Client.who_has``: which workers hold ``keys`` (None: all); answered by
    ``control-reply``."""

    request_id: str = wire(fc.string)
    keys: list | None = wire(fc.optional(fc.keys), None)


@message("has-what", C2S)
class HasWhat(Record):
    """``Client.has_what``: the keys each worker holds; answered by ``control-reply``."""

    request_id: str = wire(fc.string)
    workers: list | None = wire(fc.optional(fc.list_of(fc.anything)), None)


@message("processing", C2S)
class Processing(Record):
    """``Client.processing``: the keys each worker runs or was given to run; answered by
    ``control-reply``."""

    request_id: str = wire(fc.string)
    workers: list | None = wire(fc.optional(fc.list_of(fc.anything)), None)


@message("nthreads", C2S)
class NThreads(Record):
    """``Client.nthreads``: each worker's threads; answered by ``control-reply``."""

    request_id: str = wire(fc.string)
    workers: list | None = wire(fc.optional(fc.list_of(fc.anything)), None)


@message("replicate", C2S)
class Replicate(Record):
    """``Client.replicate``: copy ``keys`` onto ``n`` workers; answered by
    ``control-reply``."""

    request_id: str = wire(fc.string)
    keys: list = wire(fc.keys)
    n: int | None = wire(fc.optional(fc.positive), None, doc="copies wanted (None: on every worker)")
    workers: list | None = wire(fc.optional(fc.list_of(fc.anything)), None)


@message("rebalance", C2S)
class Rebalance(Record):
    """``Client.rebalance``: move ``keys`` (all if None) from workers holding more bytes than
    the mean to those holding less, among ``workers`` (all if None); answered by
    ``control-reply``."""

    request_id: str = wire(fc.string)
    keys: list | None = wire(fc.optional(fc.keys), None)
    workers: list | None = wire(fc.optional(fc.list_of(fc.anything)), None)


@message("restart", C2S)
class Restart(Record):
    """``Client.restart``: cancel every task, set every worker plugin up again; answered by
    ``control-reply``."""

    request_id: str = wire(fc.string)


@message("shutdown", C2S)
class Shutdown(Record):
    """``Client.shutdown``: end the cluster, its scheduler and workers, as dask's does;
    answered by ``control-reply`` once the process running the scheduler has been asked."""

    request_id: str = wire(fc.string)


@message("register-plugin", C2S)
class RegisterPlugin(Record):
    """Register a worker or scheduler plugin; answered by ``control-reply``."""

    request_id: str = wire(fc.string)
    kind: str = wire(fc.string, doc="`worker` or `scheduler`")
    name: str = wire(fc.string)
    plugin: bytes = wire(fc.blob, doc="the plugin, cloudpickled")
    idempotent: bool = wire(fc.boolean, False, doc="keep one already registered under `name`")


@message("unregister-plugin", C2S)
class UnregisterPlugin(Record):
    """Tear a worker plugin down on every worker; answered by ``control-reply``."""

    request_id: str = wire(fc.string)
    name: str = wire(fc.string)


# ====================================================================== scheduler -> client

@message("key-in-memory", S2C)
class KeyInMemory(Record):
    """The result of ``key`` is ready."""

    key: Key = wire(fc.key)
    type: str = wire(fc.string, "", doc="the result's type name")


@message("map-in-memory", S2C)
class MapInMemory(Record):
    """The results of the elements ``indices`` of the bulk map ``prefix`` are ready (the
    keys ``f"{prefix}{i}"``; ``types`` their results' type names)."""

    prefix: str = wire(fc.string)
    indices: list = wire(fc.list_of(fc.count))
    types: list = wire(fc.list_of(fc.string), factory=list)


@message("task-erred", S2C)
class TaskErredReport(Record):
    """``key`` erred (itself or through a dependency: ``origin``)."""

    key: Key = wire(fc.key)
    exception: Any = wire(fc.anything, None)
    traceback: str = wire(fc.string, "")
    exception_text: str = wire(fc.string, "")
    origin: Key = wire(fc.optional(fc.key), None, doc="the task that raised")


@message("cancelled-keys", S2C)
class CancelledKeys(Record):
    """``keys`` were cancelled (or are unknown to the scheduler)."""

    keys: list = wire(fc.keys)


@message("lost-data", S2C)
class LostData(Record):
    """The result of ``key`` was lost (its workers left): it is computed again."""

    key: Key = wire(fc.key)


@message("gather-reply", S2C)
class GatherReply(Record):
    """The answer to ``gather``: the values the workers sent, relayed unopened."""

    request_id: str = wire(fc.string)
    blobs: list = wire(fc.list_of(fc.serialized), factory=list,
                       doc="serialized {key: value} dicts, one per worker")
    missing: list = wire(fc.keys, factory=list, doc="keys no worker could give")


@message("scatter-reply", S2C)
class ScatterReply(Record):
    """The answer to ``scatter``: the data is on the workers, or why not."""

    scatter_id: str = wire(fc.string)
    error: str | None = wire(fc.optional(fc.string), None)


@message("scheduler-info-reply", S2C)
class SchedulerInfoReply(Record):
    """The answer to ``scheduler-info``."""

    request_id: str = wire(fc.string)
    info: dict = wire(fc.mapping, doc="the scheduler's identity: workers, tasks, services")


@message("retire-workers-reply", S2C)
class RetireWorkersReply(Record):
    """The answer to ``retire-workers``."""

    request_id: str = wire(fc.string)
    retired: list = wire(fc.list_of(fc.string), factory=list)
    kept: list = wire(fc.list_of(fc.string), factory=list)
    reason: str = wire(fc.string, "", doc="why some were kept")


@message("close-client-reply", S2C)
class CloseClientReply(Record):
    """The answer to ``close-client``: the scheduler forgot the client."""


@message("extension-reply", S2C)
class ExtensionReply(Record):
    """The answer to ``extension``."""

    request_id: str | None = wire(fc.optional(fc.string), None)
    extra: dict = extra(doc="the extension's answer (`error`: why it failed)")


@message("control-reply", S2C)
class ControlReply(Record):
    """The answer to a cluster-control request or a primitive."""

    request_id: str = wire(fc.string)
    status: str | None = wire(fc.optional(fc.string), None, sparse=True,
                              doc="`OK`, `error` or `timeout`")
    result: Any = wire(fc.anything, None, sparse=True, doc="the answer")
    results: dict | None = wire(fc.optional(fc.mapping), None, sparse=True,
                                doc="worker -> {status, result | exception, traceback}")
    exception: Any = wire(fc.anything, None, sparse=True)
    traceback: str | None = wire(fc.optional(fc.string), None, sparse=True)
    blob: Any = wire(fc.anything, None, sparse=True, doc="a stored value, cloudpickled")
    keys: list | None = wire(fc.optional(fc.keys), None, sparse=True,
                             doc="the futures' keys inside `blob`")
    items: list | None = wire(fc.optional(fc.list_of(fc.mapping)), None, sparse=True,
                              doc="queue items: [{blob, keys}]")


@message("scheduler-closing", S2C)
class SchedulerClosing(Record):
    """The scheduler is closing."""


@message("error", S2C)
class Error(Record):
    """The scheduler refused a message of the client's and disconnects it."""

    message: str = wire(fc.string, doc="why")
