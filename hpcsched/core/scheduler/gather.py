"""The scheduler's ``gather``: results relayed from the workers that hold them.

The client asks the scheduler only (as in distributed); each key is read from
one of its holders (chosen by the key's hash so that repeated gathers spread
over replicas), one ``get-data`` per worker. The values travel as
:class:`~hpcsched.core.protocol.serialize.Serialized` frames that are never unpickled
here. A value that cannot be serialized errs its task (``result-erred``)
before the reply lists the key as missing; a key a worker no longer holds is
reported (``missing-data``) so the state machine can recompute it.

Runs on the scheduler's loop thread, like every server op.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from hpcsched.core.protocol.messages import DataReply, GatherReply, GetData
from hpcsched.core.scheduler.interfaces import ServerOps
from hpcsched.core.state import events as ev


@dataclass(slots=True)
class Gather:
    """One ``gather`` in flight: what came back, what is missing, what is awaited."""

    requester: str
    blobs: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    subs: set = field(default_factory=set)  # sub-request ids still unanswered


class Gathers:
    """Gathers in flight; ``scheduler`` provides ``state``, ``send`` and ``handle_event``."""

    def __init__(self, scheduler: ServerOps):
        self.scheduler = scheduler
        self.pending: dict[str, Gather] = {}  # request_id -> gather
        self.subs: dict[str, tuple[str, str, list]] = {}  # sub id -> (request, worker, keys)
        self._ids = itertools.count()

    def start(self, request_id: str, requester: str, keys: list,
              extra: list | tuple = ()) -> None:
        """Ask the holders of ``keys`` for their values; ``requester`` hears one reply.

        ``extra``: those of ``keys`` fetched ahead, not asked for: one whose value cannot
        be serialized is left out of the reply, and its task is not erred for it (the
        client hears of it if it asks)."""
        per_worker, missing = self.scheduler.state.holders_of(keys)
        g = self.pending[request_id] = Gather(requester, missing=missing)
        ahead = set(extra)
        for worker, wkeys in per_worker.items():
            sub = f"{request_id}/{next(self._ids)}"
            g.subs.add(sub)
            self.subs[sub] = (request_id, worker, wkeys)
            optional = [k for k in wkeys if k in ahead] if ahead else []
            self.scheduler.send(worker, GetData(wkeys, sub, serialized=True, optional=optional))
        self._maybe_finish(request_id)

    def data_reply(self, msg: DataReply) -> None:
        """A worker's answer to one of our ``get-data`` requests."""
        entry = self.subs.pop(msg.request_id, None)
        if entry is None:
            return
        request_id, worker, _ = entry
        g = self.pending.get(request_id)
        if g is None:
            return
        g.subs.discard(msg.request_id)
        if msg.blob is not None:
            g.blobs.append(msg.blob)  # relayed as is: never unpickled here
        for key, error in (msg.errors or {}).items():
            # the value could not be serialized: err the task now, so that the requester
            # hears task-erred before this gather's reply (which lists the key as missing)
            g.missing.append(key)
            try:
                exception, traceback, text = error
                event = ev.ResultErred(worker, key, exception, str(traceback), str(text),
                                       now=time.time(), stimulus_id=self.scheduler.stimulus("result-erred"))
            except (TypeError, ValueError) as e:
                raise ev.MalformedMessage(f"DataReply: bad error for {key!r}: {e}") from None
            self.scheduler.handle_event(event)
        for key in msg.missing or ():
            g.missing.append(key)
            self.scheduler.handle_event(ev.MissingData("", key, worker, now=time.time(),
                                                       stimulus_id=self.scheduler.stimulus("missing-data")))
        self._maybe_finish(request_id)

    def worker_left(self, worker: str) -> None:
        """The keys asked of ``worker`` are missing: it left before it answered."""
        for sub, (request_id, w, keys) in list(self.subs.items()):
            if w == worker:
                del self.subs[sub]
                g = self.pending.get(request_id)
                if g is not None:
                    g.subs.discard(sub)
                    g.missing.extend(keys)
                    self._maybe_finish(request_id)

    def _maybe_finish(self, request_id: str) -> None:
        g = self.pending.get(request_id)
        if g is None or g.subs:
            return
        del self.pending[request_id]
        self.scheduler.send(g.requester, GatherReply(request_id, g.blobs, g.missing))
