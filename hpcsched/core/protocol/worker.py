"""The protocol between a worker and the scheduler, and between workers: one record per
op (see :mod:`hpcsched.core.protocol.messages`).

The scheduler tells a worker what to compute (``compute-task``) and what to
forget (``free-keys``); the worker reports what ran (``task-finished``,
``task-erred``) and what it holds (``add-keys``). Workers fetch a task's
dependencies from each other (``get-data`` / ``data-reply``). A worker's
first message is ``register-worker``, a client's ``register-client``; the
scheduler answers either with ``registered``.
"""

from __future__ import annotations

from typing import Any

from hpcsched.core.protocol import checks as fc
from hpcsched.core.protocol.directions import C2S, INTRODUCTION, S2C, S2W, W2S, W2W, Stimulus
from hpcsched.core.protocol.records import Record, context, wire
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.protocol.wire import message

Key = Any


class FromWorker(Stimulus):
    """Base of a worker's reports to the scheduler's state machine: the scheduler fills in
    which worker sent it."""

    worker: str = context()


# ====================================================================== registration

@message("register-worker", W2S, INTRODUCTION)
class RegisterWorker(Record):
    """A worker introduces itself (its first message)."""

    address: str = wire(fc.string, doc="the address it listens on for its peers")
    nthreads: int = wire(fc.positive, 1, doc="threads running tasks")
    memory_limit: int | None = wire(fc.optional(fc.count), None, doc="bytes (None or 0: no limit)")
    name: Any = wire(fc.anything, None, doc="its name (default: its address)")
    host: str = wire(fc.string, "", doc="its host name")
    resources: dict | None = wire(fc.optional(fc.dict_of(fc.number, keyed=fc.string)), None,
                                  doc='abstract resources it offers, e.g. `{"GPU": 2}`')
    keys: dict | None = wire(fc.optional(fc.dict_of(fc.count)), None,
                             doc="key -> nbytes of data it already holds")
    pid: int | None = wire(fc.optional(fc.count), None, doc="its process id")
    running: list | None = wire(fc.optional(fc.keys), None, sparse=True,
                                doc="tasks it is running (a worker that lost its scheduler "
                                    "and registers again)")
    lifetime_end: float | None = wire(fc.optional(fc.number), None, sparse=True,
                                      doc="when it will leave (epoch seconds): its "
                                          "`--lifetime` or its job's walltime")
    gpus: list | None = wire(fc.optional(fc.list_of(fc.string)), None, sparse=True,
                             doc="the ids of the GPUs behind its `GPU` resource")
    resources_only: bool = wire(fc.boolean, False, sparse=True,
                                doc="it runs only tasks that ask for one of its resources "
                                    "(a GPU job's workers): no other task is placed there")
    job: str | None = wire(fc.optional(fc.string), None, sparse=True,
                           doc="the batch job it runs in, by its id: the slots of a task "
                               "with `ranks` come from one job")


@message("registered", S2W, S2C)
class Registered(Record):
    """The scheduler accepts a worker or a client."""

    address: str = wire(fc.string, doc="the scheduler's address")
    id: str = wire(fc.string, doc="the scheduler's id")
    heartbeat_interval: float | None = wire(fc.optional(fc.number), None, sparse=True,
                                            doc="seconds between a worker's heartbeats "
                                                "(it grows with the cluster)")
    journaled: bool = wire(fc.boolean, False, sparse=True,
                           doc="the scheduler keeps a journal: if it vanishes, it may come "
                               "back (wait for it) rather than be gone (exit)")
    usage: bool = wire(fc.boolean, False, sparse=True,
                       doc="send each task's `cpu` and `memory` (the scheduler keeps a task "
                           "history); without it they are left out")


@message("heartbeat-interval", S2W)
class HeartbeatInterval(Record):
    """The cluster grew or shrank: heartbeat every ``interval`` seconds from now on (sent to
    every worker when the cluster outgrows its interval; when it shrank, the answer to a
    heartbeat)."""

    interval: float = wire(fc.number, doc="seconds")


@message("register-error", S2W)
class RegisterError(Record):
    """The scheduler refuses a worker (a malformed introduction, a name already taken)."""

    message: str = wire(fc.string, doc="why")


# ====================================================================== worker -> scheduler

@message("task-started", W2S)
class TaskStarted(FromWorker):
    """``key`` started running on the worker."""

    key: Key = wire(fc.key)


@message("task-finished", W2S)
class TaskFinished(FromWorker):
    """``key`` ran on the worker, which holds its result (``cpu`` and ``memory`` only if
    the answer to its registration asked for them: ``registered``'s ``usage``)."""

    key: Key = wire(fc.key)
    nbytes: int = wire(fc.count, 0, doc="the result's size in bytes")
    typename: str = wire(fc.string, "", doc="the result's type name")
    start: float = wire(fc.number, 0.0)
    stop: float = wire(fc.number, 0.0)
    cpu: float = wire(fc.number, 0.0, sparse=True,
                      doc="CPU seconds it used (a command: its process's user + system)")
    memory: int = wire(fc.count, 0, sparse=True,
                       doc="peak memory in bytes (a command: its process's maximum RSS; a "
                           "Python task: the worker's peak RSS from its start to its end, "
                           "or under a millisecond its RSS as last sampled)")


@message("task-erred", W2S)
class TaskErred(FromWorker):
    """``key`` raised on the worker (``cpu`` and ``memory`` as ``task-finished``'s)."""

    key: Key = wire(fc.key)
    exception: Any = wire(fc.anything, None)
    traceback: str = wire(fc.string, "")
    exception_text: str = wire(fc.string, "")
    start: float = wire(fc.number, 0.0)
    stop: float = wire(fc.number, 0.0)
    cpu: float = wire(fc.number, 0.0, sparse=True,
                      doc="CPU seconds it used (a command: its process's user + system)")
    memory: int = wire(fc.count, 0, sparse=True,
                       doc="peak memory in bytes (a command: its process's maximum RSS; a "
                           "Python task: the worker's peak RSS from its start to its end, "
                           "or under a millisecond its RSS as last sampled)")


@message("range-finished", W2S)
class RangeFinished(FromWorker):
    """Elements ``indices`` of the bulk map ``prefix`` ran on the worker, which holds their
    results (``nbytes``, ``types``, ``starts``, ``stops``: each one's size, type name, and
    when it ran; ``cpu`` and ``memory`` for the report as a whole, not per element, and
    as ``task-finished``'s, only if asked for)."""

    prefix: str = wire(fc.string)
    indices: list = wire(fc.list_of(fc.count))
    nbytes: list = wire(fc.list_of(fc.count))
    types: list = wire(fc.list_of(fc.string))
    starts: list = wire(fc.list_of(fc.number))
    stops: list = wire(fc.list_of(fc.number))
    cpu: float = wire(fc.number, 0.0, sparse=True,
                      doc="CPU seconds the report's elements used, together")
    memory: int = wire(fc.count, 0, sparse=True,
                       doc="the largest peak RSS of its elements' processes (commands), "
                           "else the worker's peak RSS in bytes over the report's elements")


@message("range-released", W2S)
class RangeReleased(FromWorker):
    """The answer to ``release-range``: the elements the worker gave up, none of which it
    started or will start, by bulk map prefix (it may give up none)."""

    released: dict = wire(fc.dict_of(fc.list_of(fc.count), keyed=fc.string),
                          doc="prefix -> indices of the elements given up")


@message("missing-data", W2S)
class MissingData(FromWorker):
    """The worker could not get ``key`` from ``errant_worker``."""

    key: Key = wire(fc.key)
    errant_worker: str = wire(fc.string, doc="the worker that did not have it")


@message("long-running", W2S)
class LongRunning(FromWorker):
    """A task seceded from the worker's thread pool: it no longer occupies a slot."""

    key: Key = wire(fc.key)
    compute_duration: float = wire(fc.number, 0.0, doc="seconds it ran before seceding")


@message("result-erred", W2S)
class ResultErred(FromWorker):
    """The result of ``key``, held by the worker, could not be serialized to leave it."""

    key: Key = wire(fc.key)
    exception: Any = wire(fc.anything, None)
    traceback: str = wire(fc.string, "")
    exception_text: str = wire(fc.string, "")


@message("add-keys", W2S)
class AddKeys(FromWorker):
    """The worker now holds ``keys`` (replicas acquired, scattered data stored)."""

    keys: dict = wire(fc.dict_of(fc.count), doc="key -> nbytes")
    scatter_id: str | None = wire(fc.optional(fc.string), None, sparse=True)


@message("release-worker-data", W2S)
class ReleaseWorkerData(FromWorker):
    """The worker dropped its copy of ``keys``."""

    keys: list = wire(fc.keys)


@message("steal-response", W2S)
class StealResponse(FromWorker):
    """The answer to ``steal-request``: the task's state on the worker (a task not yet
    running is given up)."""

    key: Key = wire(fc.key)
    state: str = wire(fc.string, doc="the task's state there, before the request")


@message("heartbeat", W2S)
class Heartbeat(FromWorker):
    """The worker is alive; its metrics (memory, CPU, bandwidth, transfers, logs)."""

    metrics: dict = wire(fc.mapping, factory=dict)


@message("worker-status-change", W2S)
class WorkerStatusChange(FromWorker):
    """The worker paused (its memory is past the pause fraction: it starts nothing) or runs
    again; a paused worker is given no new task."""

    status: str = wire(fc.string, doc="`paused` or `running`")


@message("run-reply", W2S)
class RunReply(Record):
    """A worker's answer to ``run``, ``upload-file`` or a plugin op."""

    request_id: str | None = wire(fc.optional(fc.string), None)
    status: str = wire(fc.string, "", doc="`OK` or `error`")
    result: Any = wire(fc.anything, None, sparse=True, doc="the result, cloudpickled")
    exception: Any = wire(fc.anything, None, sparse=True)
    traceback: Any = wire(fc.anything, None, sparse=True)


@message("data-reply", W2S, W2W)
class DataReply(Record):
    """The answer to ``get-data``: the values the worker holds, the keys it does not."""

    request_id: str = wire(fc.string)
    missing: list | None = wire(fc.optional(fc.keys), factory=list, doc="keys it does not hold")
    data: dict = wire(fc.dict_of(fc.anything), factory=dict, sparse=True,
                      doc="key -> value (to a worker)")
    blob: Any = wire(fc.optional(fc.serialized), None, sparse=True,
                     doc="the values as one serialized {key: value} (to the scheduler)")
    errors: dict = wire(fc.dict_of(fc.anything), factory=dict, sparse=True,
                        doc="key -> (exception, traceback, text): held but unserializable")


@message("retire-me", W2S)
class RetireMe(Record):
    """The worker's lifetime is up: retire it gracefully."""


# ====================================================================== scheduler -> worker

@message("upload-file", C2S, S2W)
class UploadFile(Record):
    """``Client.upload_file``: a file for every worker, also those that join later (the
    scheduler relays it to each; they answer ``run-reply``, the client ``control-reply``)."""

    request_id: str = wire(fc.string, doc="`replay` when sent to a worker that joined later")
    filename: str = wire(fc.string, doc="a bare file name")
    data: bytes = wire(fc.blob, doc="the file's content")
    load: bool = wire(fc.boolean, True, doc="import it (a .py) or put it on sys.path (an archive)")


@message("compute-task", S2W)
class ComputeTask(Stimulus):
    """Run ``key`` (after fetching its dependencies from the workers holding them)."""

    key: Key = wire(fc.key)
    run_spec: RunSpec = wire(fc.anything, doc="what to run, as the client serialized it")
    priority: tuple = wire(fc.list_of(fc.number), (), doc="lower runs first")
    who_has: dict = wire(fc.dict_of(fc.list_of(fc.string)), factory=dict, sparse=True,
                         doc="dependency key -> workers holding it")
    nbytes: dict = wire(fc.dict_of(fc.count), factory=dict, sparse=True,
                        doc="dependency key -> its size in bytes")
    resource_restrictions: dict | None = wire(fc.optional(fc.dict_of(fc.number, keyed=fc.string)), None,
                                              sparse=True, doc="resources it holds while running")
    duration: float = wire(fc.number, 0.5, doc="expected seconds")
    gang: list = wire(fc.list_of(fc.string), factory=list, sparse=True,
                      doc="a task holding many slots (`ranks`): every member's address, in "
                          "order; each member is sent the task, the first one's result is "
                          "the task's")
    comm: int = wire(fc.count, 0, sparse=True,
                     doc="a task holding many slots: the number of its members' communicator "
                         "(made by a member that has none of that number, kept for the next "
                         "task on the same members)")
    free_comms: list = wire(fc.list_of(fc.count), factory=list, sparse=True,
                            doc="communicators of earlier tasks holding many slots that the "
                                "worker frees before this one starts")
    hosts: list = wire(fc.list_of(fc.string), factory=list, sparse=True,
                       doc="a task holding many slots: each member's host, in member order "
                           "(its MPI launcher's host list)")


@message("compute-range", S2W)
class ComputeRange(Stimulus):
    """Run elements ``indices`` of the bulk map ``prefix``, one after the other, each
    ``function(*args, **kwargs)`` with its ``args`` blob; hold each result under its key
    ``f"{prefix}{i}"`` and report them in batches (``range-finished``); an element that
    raises is reported alone (``task-erred``)."""

    prefix: str = wire(fc.string)
    function: bytes = wire(fc.blob)
    indices: list = wire(fc.list_of(fc.count))
    args: list = wire(fc.list_of(fc.blob))


@message("release-range", S2W)
class ReleaseRange(Stimulus):
    """Give up at most ``count`` elements of the ranges given (``compute-range``) that have
    not started, the last given first (work stealing of a range's tail; a paused or
    retiring worker gives up all); answered by ``range-released``."""

    count: int = wire(fc.count)


@message("free-keys", S2W)
class FreeKeys(Stimulus):
    """Forget ``keys``: drop their data, cancel them if not done."""

    keys: list = wire(fc.keys)


@message("steal-request", S2W)
class StealRequest(Stimulus):
    """Give ``key`` up unless it runs already (work stealing); answered by
    ``steal-response``."""

    key: Key = wire(fc.key)


@message("acquire-replicas", S2W)
class AcquireReplicas(Stimulus):
    """Fetch a copy of these keys from the workers holding them (replicate, retire)."""

    who_has: dict = wire(fc.dict_of(fc.list_of(fc.string)))
    nbytes: dict = wire(fc.dict_of(fc.count), factory=dict)


@message("refresh-who-has", S2W)
class RefreshWhoHas(Stimulus):
    """Where these keys are now (a fetch found a worker without them)."""

    who_has: dict = wire(fc.dict_of(fc.list_of(fc.string)))


@message("update-data", S2W)
class UpdateData(Stimulus):
    """Store this scattered data; answered by ``add-keys``."""

    data: dict = wire(fc.mapping, doc="key -> value (serialized on the wire; the worker "
                                   "deserializes it before its state machine sees it)")
    scatter_id: str | None = wire(fc.optional(fc.string), None)


@message("get-data", S2W, W2W)
class GetData(Record):
    """Send me the values of ``keys`` you hold; answered by ``data-reply``."""

    keys: list = wire(fc.keys)
    request_id: str = wire(fc.string)
    serialized: bool = wire(fc.boolean, False, sparse=True,
                            doc="as one serialized blob (the scheduler relays it unopened)")
    optional: list = wire(fc.keys, factory=list,
                          doc="those of ``keys`` a client did not ask for (fetched ahead): "
                              "one that cannot be serialized is left out, not reported")


@message("close", S2W)
class Close(Record):
    """Close the worker (retired, or the scheduler closes or drops it)."""

    reason: str = wire(fc.string, "closed")
    exit_code: int = wire(fc.count, 0, sparse=True,
                          doc="the worker process's exit code (the CLI, under MPI)")


@message("run", S2W)
class RunOnWorker(Record):
    """Run a function now, for ``Client.run``; answered by ``run-reply``."""

    request_id: str = wire(fc.string)
    function: bytes = wire(fc.blob)
    args: bytes | None = wire(fc.optional(fc.blob), None)
    kwargs: bytes | None = wire(fc.optional(fc.blob), None)
    wait: bool = wire(fc.boolean, True, doc="send the result back (else None)")


@message("plugin-add", S2W)
class PluginAdd(Record):
    """Set a worker plugin up (one of the same name is torn down first); answered by
    ``run-reply``."""

    name: str = wire(fc.string)
    plugin: bytes = wire(fc.blob, doc="the plugin, cloudpickled")
    request_id: str = wire(fc.string, "", doc="`replay` when the worker just joined")


@message("plugin-remove", S2W)
class PluginRemove(Record):
    """Tear a worker plugin down; answered by ``run-reply``."""

    name: str = wire(fc.string)
    request_id: str = wire(fc.string, "")


@message("plugins-reset", S2W)
class PluginsReset(Record):
    """Tear every worker plugin down and set it up again (``Client.restart``); answered by
    ``run-reply``."""

    request_id: str = wire(fc.string, "")
