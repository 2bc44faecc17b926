"""The requests the scheduler server answers itself: one handler per record type.

:data:`handlers` is the scheduler server's one table
(:class:`hpcsched.core.scheduler.server.Scheduler` completes it with the state
machine's events and ``close-client``). Each handler is called as
``handler(scheduler, sender, record)``, the scheduler seen as an :class:`OpsHost`, with the message already decoded (every
field checked) by the sender's direction of
:mod:`hpcsched.core.protocol.messages`; what it answers goes out through
``scheduler.send``. A handler that raises gets its peer one error message and
a disconnect; nobody else is affected.

Runs on the scheduler's loop thread.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from hpcsched.core.protocol import messages as pr
from hpcsched.core.protocol.dispatch import Handlers
from hpcsched.core.scheduler.control import ClusterControl
from hpcsched.core.scheduler.extensions import extension_reply
from hpcsched.core.scheduler.gather import Gathers
from hpcsched.core.scheduler.interfaces import ServerOps
from hpcsched.core.scheduler.outbox import INTERNAL
from hpcsched.core.scheduler.primitives import Primitives
from hpcsched.core.state import events as ev


class OpsHost(ServerOps, Protocol):
    """What these handlers reach of the server: the parts serving requests, and the
    cluster's summary."""

    gathers: Gathers
    control: ClusterControl
    primitives: Primitives
    extensions: dict[str, Any]

    def identity(self) -> dict:
        """The cluster's summary."""


#: record type -> handler(scheduler, sender, record): the scheduler server's table
handlers = Handlers("scheduler")


@handlers.on(pr.Gather)
def gather(s: OpsHost, source: str, msg: pr.Gather) -> None:
    """Relay the values of ``msg.keys`` from their holders (:mod:`.gather`), with those
    of ``msg.extra`` that are small enough to come along."""
    keys = list(msg.keys)
    extra = s.state.small_results(msg.extra, msg.extra_bytes, msg.extra_each) \
        if msg.extra else []
    s.gathers.start(msg.request_id, source, keys + extra, extra)


@handlers.on(pr.DataReply)
def data_reply(s: OpsHost, source: str, msg: pr.DataReply) -> None:
    """A worker's answer to one of the gathers' ``get-data`` requests."""
    s.gathers.data_reply(msg)


@handlers.on(pr.SchedulerInfo)
def scheduler_info(s: OpsHost, source: str, msg: pr.SchedulerInfo) -> None:
    """Describe the cluster."""
    s.send(source, pr.SchedulerInfoReply(msg.request_id, s.identity()))


@handlers.on(pr.RetireWorkersRequest)
def retire_workers(s: OpsHost, source: str, msg: pr.RetireWorkersRequest) -> None:
    """Retire the workers named, gracefully (a state-machine event)."""
    workers = s.state.workers_to_retire(msg.workers, msg.names, msg.n)
    s.handle_event(ev.RetireWorkers(msg.request_id, source, workers, msg.close, now=time.time(),
                                    stimulus_id=s.stimulus("retire-workers")))


@handlers.on(pr.RetireMe)
def retire_me(s: OpsHost, source: str, msg: pr.RetireMe) -> None:
    """A worker's walltime (lifetime) is up: retire it gracefully."""
    if source not in s.state.workers:
        return
    rid = s.stimulus("lifetime")  # nobody waits for it: the reply is dropped
    s.handle_event(ev.RetireWorkers(rid, INTERNAL, [source], True, now=time.time(),
                                    stimulus_id=s.stimulus("retire-me")))


@handlers.on(pr.Extension)
def extension(s: OpsHost, source: str, msg: pr.Extension) -> None:
    """A request to a scheduler extension (:mod:`.extensions`)."""
    s.send(source, extension_reply(s.extensions, source, msg))


@handlers.on(*ClusterControl.handlers.table)
def control(s: OpsHost, source: str, msg: Any) -> None:
    """Cluster control: ``Client.run``, ``who_has``, plugins, ... (:mod:`.control`)."""
    s.control.handle(source, msg)


@handlers.on(*Primitives.handlers.table)
def primitive(s: OpsHost, source: str, msg: Any) -> None:
    """A coordination primitive or a dataset (:mod:`.primitives`)."""
    s.primitives.handle(source, msg)
