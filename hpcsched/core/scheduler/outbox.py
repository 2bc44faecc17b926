"""The scheduler's outgoing messages: batched per peer, sent once per loop turn.

Whatever the server's loop turn produces for a peer -- the state machine's
commands, the answers of the requests it serves -- is queued here and sent as
one batch when the turn ends (:meth:`Outbox.flush`): on a busy node every
message costs both ends a wake-up, a batch one. Each record is encoded once,
when its batch is sent.

A batch of only ``free-keys`` waits, up to the next tick, to ride along with the
next message to that worker: releasing memory is not urgent, and a tree
reduction frees a key per task. Consecutive ``free-keys`` in a batch are merged
into one.

Messages for :data:`~hpcsched.core.scheduler.ops.INTERNAL` are replies to calls
made in this process (``Scheduler.retire_workers``): they complete the future
:meth:`Outbox.expect` registered instead of going anywhere.

Runs on the scheduler's loop thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from hpcsched.core.comm.base import Comm, CommClosedError
from hpcsched.core.protocol import messages as pr

logger = logging.getLogger("hpcsched.scheduler")

ComputeTask, FreeKeys, encode = pr.ComputeTask, pr.FreeKeys, pr.encode
#: the requester id of calls made by this process (clusters, adaptive)
INTERNAL = "internal"


def wire(msgs: list) -> list:
    """``msgs`` encoded for the transport (a wire dict is already)."""
    return [m if m.__class__ is dict else encode(m) for m in msgs]


def merge_frees(msgs: list) -> list:
    """``msgs`` with each run of consecutive ``free-keys`` made one (a tree reduction frees
    a key per task, and the worker decodes and handles each message on its own). Only
    neighbours merge: a ``compute-task`` between two frees keeps its place between them."""
    out: list = []
    merged = None  # the copy made for the current run (the records themselves stay as sent)
    for m in msgs:
        if m.__class__ is FreeKeys and out and out[-1].__class__ is FreeKeys:
            head = out[-1]
            if head is not merged:
                head = out[-1] = merged = FreeKeys(list(head.keys))
            head.keys.extend(m.keys)
        else:
            out.append(m)
    return out


class Outbox:
    """Messages waiting for the end of the loop turn, by peer id."""

    __slots__ = ("_boxes", "_held", "_release_held", "_internal")

    def __init__(self) -> None:
        self._boxes: dict[str, list] = {}
        # per worker: messages that may wait for the next one to it or the tick (free-keys)
        self._held: dict[str, list] = {}
        self._release_held = False
        self._internal: dict[str, Future] = {}  # request id -> a call made in this process

    def queue(self, to: str, msg: Any) -> None:
        """Queue ``msg`` (a protocol record, or a wire dict) for peer ``to``."""
        if to == INTERNAL:
            rid = msg.get("request_id") if isinstance(msg, dict) else \
                getattr(msg, "request_id", None)
            fut = self._internal.pop(str(rid), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        box = self._boxes.get(to)
        if box is None:
            box = self._boxes[to] = []
        box.append(msg)

    def queue_first(self, to: str, msg: Any) -> None:
        """Queue ``msg`` first of all that waits for ``to`` (what it must read first)."""
        self._boxes.setdefault(to, []).insert(0, msg)

    def queue_before_tasks(self, to: str, msg: Any) -> None:
        """Queue ``msg`` ahead of the tasks already queued for ``to`` (what a worker that
        just joined must have first: uploaded files, plugins)."""
        box = self._boxes.get(to)
        if not box:
            self.queue(to, msg)
            return
        at = next((i for i, m in enumerate(box) if m.__class__ is ComputeTask), len(box))
        box.insert(at, msg)

    def expect(self, request_id: str, future: Future) -> None:
        """Complete ``future`` with the reply to :data:`INTERNAL` naming ``request_id``."""
        self._internal[request_id] = future

    def release_held(self) -> None:
        """The next :meth:`flush` sends what waited (the tick's)."""
        self._release_held = True

    def send_now(self, peer: str, comm: Comm | None, notice: Any) -> None:
        """Send ``peer`` what is queued for it and ``notice`` now, on ``comm`` (it is
        disconnected next: no error is raised if it is gone already)."""
        msgs = self._boxes.pop(peer, [])
        self._held.pop(peer, None)
        if comm is not None:
            try:
                comm.send(wire(msgs + [notice]))
            except (CommClosedError, OSError):
                pass

    def drop(self, peer: str) -> None:
        """``peer`` is gone: forget what waited for it."""
        self._boxes.pop(peer, None)
        self._held.pop(peer, None)

    def clear(self) -> None:
        """Forget every message (answers to peers that will never read them)."""
        self._boxes.clear()
        self._held.clear()

    def flush(self, comms: Mapping[str, Comm], failed: Callable[[str], None]) -> None:
        """Send each peer of ``comms`` its batch; ``failed(peer)`` for each send that
        failed (its connection is gone). Batches of only ``free-keys`` wait for the next
        message to their worker, or the next flush after :meth:`release_held`."""
        held = self._held
        release, self._release_held = self._release_held, False
        if release and held:
            for to, msgs in held.items():
                self._boxes[to] = msgs + self._boxes.get(to, [])
            held.clear()
        if not self._boxes:
            return
        boxes, self._boxes = self._boxes, {}
        for to, msgs in boxes.items():
            waiting = held.pop(to, None)
            if waiting is not None:
                msgs = waiting + msgs
            if not release and all(m.__class__ is FreeKeys for m in msgs):
                held[to] = msgs
                continue
            comm = comms.get(to)
            if comm is None:
                continue
            if len(msgs) > 1:
                msgs = merge_frees(msgs)
            try:
                comm.send(wire(msgs))
            except (CommClosedError, OSError) as e:
                failed(to)
                logger.info("send to %s failed: %s", to, e)
