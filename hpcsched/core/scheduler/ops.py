"""The requests the scheduler server answers itself, by op: one handler per op.

Each handler is called as ``handler(scheduler, sender, record)`` with the
message already decoded (every field checked) by the sender's direction of
:mod:`hpcsched.core.protocol.messages`; what it answers goes out through
``scheduler.send``. Together with the state machine's ops, they make
:data:`hpcsched.core.scheduler.server.Scheduler.OPS`, the server's one table of
inbound ops. A handler that raises gets its peer one error message and a
disconnect; nobody else is affected.

Runs on the scheduler's loop thread.
"""

from __future__ import annotations

import time
from typing import Any

from hpcsched.core.protocol import messages as pr
from hpcsched.core.scheduler.control import ClusterControl
from hpcsched.core.scheduler.extensions import extension_reply
from hpcsched.core.state import events as ev

INTERNAL = "internal"  # requester id for calls made by this process (clusters, adaptive)


def gather(s: Any, source: str, msg: pr.Gather) -> None:
    """Relay the values of ``msg.keys`` from their holders (:mod:`.scheduler_gather`)."""
    s.gathers.start(msg.request_id, source, list(msg.keys))


def data_reply(s: Any, source: str, msg: pr.DataReply) -> None:
    """A worker's answer to one of the gathers' ``get-data`` requests."""
    s.gathers.data_reply(msg)


def scheduler_info(s: Any, source: str, msg: pr.SchedulerInfo) -> None:
    """Describe the cluster."""
    s.send(source, pr.SchedulerInfoReply(msg.request_id, s.identity()))


def retire_workers(s: Any, source: str, msg: pr.RetireWorkersRequest) -> None:
    """Retire the workers named, gracefully (a state-machine event)."""
    workers = s.state.registry.resolve(msg.workers, msg.names, msg.n)
    s.handle_event(ev.RetireWorkers(msg.request_id, source, workers, msg.close, now=time.time(),
                                    stimulus_id=s.stimulus("retire-workers")))


def retire_me(s: Any, source: str, msg: pr.RetireMe) -> None:
    """A worker's walltime (lifetime) is up: retire it gracefully."""
    if source not in s.state.workers:
        return
    rid = s.stimulus("lifetime")  # nobody waits for it: the reply is dropped
    s.handle_event(ev.RetireWorkers(rid, INTERNAL, [source], True, now=time.time(),
                                    stimulus_id=s.stimulus("retire-me")))


def extension(s: Any, source: str, msg: pr.Extension) -> None:
    """A request to a scheduler extension (:mod:`.scheduler_extensions`)."""
    s.send(source, extension_reply(s.extensions, source, msg))


def control(s: Any, source: str, msg: Any) -> None:
    """Cluster control: ``Client.run``, ``who_has``, plugins, ... (:mod:`.cluster_control`)."""
    s.control.handle(source, msg)


def primitive(s: Any, source: str, msg: pr.Primitive) -> None:
    """A coordination primitive or a dataset (:mod:`.primitives`)."""
    s.primitives.handle(source, msg)


#: op -> handler(scheduler, sender, record) of the requests the server answers itself
OPS: dict[str, Any] = {
    "gather": gather,
    "data-reply": data_reply,
    "scheduler-info": scheduler_info,
    "retire-workers": retire_workers,
    "retire-me": retire_me,
    "extension": extension,
    **dict.fromkeys(ClusterControl.OPS, control),
    "primitive": primitive,
}
