"""hpcsched's wire protocol: every message any peer sends, as a typed record.

Peers are the scheduler, its workers and its clients (a client talks to the
scheduler only, as in distributed; workers also talk to each other to fetch
data). Each message is a dict ``{"op": ..., **fields}``; each op is one record
(a frozen ``msgspec.Struct``), registered in the table of every direction it travels:
``CLIENT_TO_SCHEDULER``, ``SCHEDULER_TO_CLIENT``, ``WORKER_TO_SCHEDULER``,
``SCHEDULER_TO_WORKER``, ``WORKER_TO_WORKER`` (op -> record class). A peer's
first message introduces it (``register-worker`` / ``register-client``); the
scheduler answers ``registered`` or ``register-error``.

A sender sends ``encode(record)``; a receiver turns what arrives into a
record with ``decode(DIRECTION, msg, worker=..., now=...)``: the fields the
receiver knows (who sent it, when, a ``stimulus_id``) are *context* fields,
never on the wire. An unknown op, an unknown or missing field, or a field of
the wrong type raises ``MalformedMessage`` naming the op and the field. The
records the state machines consume (``TaskFinished``, ``ComputeTask``, ...)
are their events too, importable from ``hpcsched.core.state.events``.

The records are defined in :mod:`hpcsched.core.protocol.client`,
:mod:`hpcsched.core.protocol.primitives` and :mod:`hpcsched.core.protocol.worker`,
the directions in :mod:`hpcsched.core.protocol.directions`, the record type in
:mod:`hpcsched.core.protocol.records`, the codec in :mod:`hpcsched.core.protocol.wire`; this module gathers them (a worker imports the
worker's records alone). Its reference,
``docs/protocol.md``, is generated: ``python -m hpcsched.core.protocol.messages > docs/protocol.md``.
"""

from __future__ import annotations

from hpcsched.core.protocol.client import (
    CancelKeys,
    CancelledKeys,
    ClientDesiresKeys,
    ClientReleasesKeys,
    CloseClient,
    CloseClientReply,
    ControlReply,
    Error,
    Extension,
    ExtensionReply,
    Gather,
    GatherReply,
    HasWhat,
    KeyInMemory,
    LostData,
    MapInMemory,
    NThreads,
    Processing,
    Rebalance,
    RegisterClient,
    RegisterPlugin,
    Replicate,
    Restart,
    RetireWorkersReply,
    RetireWorkersRequest,
    RetryKeys,
    Run,
    RunOnScheduler,
    ScatterData,
    ScatterReply,
    SchedulerClosing,
    SchedulerInfo,
    SchedulerInfoReply,
    Shutdown,
    TaskErredReport,
    UnregisterPlugin,
    UpdateGraph,
    UpdateMap,
    WhoHas,
)
from hpcsched.core.protocol.directions import (
    CLIENT_TO_SCHEDULER,
    INTRODUCTION,
    SCHEDULER_TO_CLIENT,
    SCHEDULER_TO_WORKER,
    WORKER_TO_SCHEDULER,
    WORKER_TO_WORKER,
)
from hpcsched.core.protocol.primitives import (
    DatasetGet,
    DatasetList,
    DatasetPublish,
    DatasetUnpublish,
    EventClear,
    EventIsSet,
    EventSet,
    EventWait,
    LockAcquire,
    LockLocked,
    LockRelease,
    MultiLockAcquire,
    MultiLockRelease,
    PrimitiveRequest,
    QueueGet,
    QueuePut,
    QueueSize,
    SemaphoreAcquire,
    SemaphoreRelease,
    SemaphoreValue,
    VariableDelete,
    VariableGet,
    VariableSet,
)
from hpcsched.core.protocol.reference import markdown
from hpcsched.core.protocol.wire import (
    Direction,
    MalformedMessage,
    decode,
    encode,
    receive,
    spec,
)
from hpcsched.core.protocol.worker import (
    AcquireReplicas,
    AddKeys,
    Close,
    ComputeRange,
    ComputeTask,
    DataReply,
    FreeKeys,
    GetData,
    Heartbeat,
    HeartbeatInterval,
    LongRunning,
    MissingData,
    PluginAdd,
    PluginRemove,
    PluginsReset,
    RangeFinished,
    RangeReleased,
    RefreshWhoHas,
    Registered,
    RegisterError,
    RegisterWorker,
    ReleaseRange,
    ReleaseWorkerData,
    ResultErred,
    RetireMe,
    RunOnWorker,
    RunReply,
    StealRequest,
    StealResponse,
    TaskErred,
    TaskFinished,
    TaskStarted,
    UpdateData,
    UploadFile,
    WorkerStatusChange,
)

__all__ = [
    "AcquireReplicas", "AddKeys", "CLIENT_TO_SCHEDULER", "COMMON", "CancelKeys",
    "CancelledKeys", "ClientDesiresKeys", "ClientReleasesKeys", "Close", "CloseClient",
    "CloseClientReply", "ComputeRange", "ComputeTask", "ControlReply", "DIRECTIONS", "DataReply", "Direction",
    "Error", "Extension", "ExtensionReply", "FreeKeys", "Gather", "GatherReply", "GetData",
    "HasWhat", "Heartbeat", "HeartbeatInterval", "INTRODUCTION", "KeyInMemory", "MapInMemory", "RangeFinished", "RangeReleased", "LongRunning", "LostData", "MalformedMessage",
    "MissingData", "NThreads", "Processing", "PluginAdd", "PluginRemove", "PluginsReset",
    "Rebalance", "RefreshWhoHas", "RegisterClient", "RegisterError", "RegisterPlugin", "RegisterWorker",
    "Registered", "ReleaseRange", "ReleaseWorkerData", "Replicate", "Restart", "ResultErred", "RetireMe",
    "RetireWorkersReply", "RetireWorkersRequest", "RetryKeys", "Run", "RunOnScheduler",
    "RunOnWorker", "RunReply", "SCHEDULER_TO_CLIENT", "SCHEDULER_TO_WORKER", "ScatterData",
    "ScatterReply", "SchedulerClosing", "SchedulerInfo", "SchedulerInfoReply", "Shutdown", "StealRequest",
    "StealResponse", "TaskErred", "TaskErredReport", "TaskFinished", "TaskStarted",
    "UnregisterPlugin", "UpdateData", "UpdateGraph", "UpdateMap", "UploadFile", "WORKER_TO_SCHEDULER",
    "WORKER_TO_WORKER", "WhoHas", "WorkerStatusChange", "decode", "encode",
    "receive", "reference", "spec",
    # coordination primitives and datasets
    "DatasetGet", "DatasetList", "DatasetPublish", "DatasetUnpublish", "EventClear",
    "EventIsSet", "EventSet", "EventWait", "LockAcquire", "LockLocked", "LockRelease",
    "MultiLockAcquire", "MultiLockRelease", "PrimitiveRequest", "QueueGet", "QueuePut",
    "QueueSize", "SemaphoreAcquire", "SemaphoreRelease", "SemaphoreValue", "VariableDelete",
    "VariableGet", "VariableSet",
]

DIRECTIONS = (CLIENT_TO_SCHEDULER, SCHEDULER_TO_CLIENT, WORKER_TO_SCHEDULER,
              SCHEDULER_TO_WORKER, WORKER_TO_WORKER)

#: meanings of fields that recur (a field's own doc wins)
COMMON = {
    "key": "the task's key",
    "keys": "task keys",
    "request_id": "the requester's id for this request; its reply carries it back",
    "exception": "the exception, serialized",
    "traceback": "the traceback, as text",
    "exception_text": "the exception as text (readable without unpickling it)",
    "start": "when the task started running (seconds since the epoch, the worker's clock)",
    "stop": "when the task stopped running",
    "workers": "workers by address or name (None: all)",
    "function": "the function, cloudpickled",
    "args": "its positional arguments, cloudpickled",
    "kwargs": "its keyword arguments, cloudpickled",
    "status": "`OK` or `error`",
    "name": "the plugin's name",
    "scatter_id": "the scatter this belongs to",
    "who_has": "key -> addresses of the workers holding it",
    "nbytes": "key -> size in bytes",
}

CONTEXT = """Fields marked *filled in by the receiver* are context fields: the receiver
passes them to `decode` (`worker` / `client`: who sent it; `now`: when it arrived, in seconds
of the receiver's clock; `stimulus_id`: names the event so that a state change can be traced
to its cause, as in distributed's worker state machine)."""


def reference() -> str:
    """``docs/protocol.md``: the reference generated from the records."""
    intro = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
    return markdown("The hpcsched wire protocol",
                    "*Generated from the records of `hpcsched/core/protocol/client.py`, "
                    "`primitives.py` and `worker.py` by `python -m hpcsched.core.protocol.messages > "
                    "docs/protocol.md`; do not edit.*\n\n" + intro + "\n\n" + CONTEXT,
                    DIRECTIONS, COMMON)


if __name__ == "__main__":
    print(reference(), end="")
