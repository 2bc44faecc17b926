"""What the scheduler server's parts may ask of it: the interfaces they are given.

The server (:class:`hpcsched.core.scheduler.server.Scheduler`) is a shell over
parts that own their data -- the peers' connections (:mod:`.connections`), the
batches of outgoing messages (:mod:`.outbox`), recovery after a restart
(:mod:`.recovery`), and the requests it answers itself (:mod:`.gather`,
:mod:`.control`, :mod:`.primitives`, and :mod:`.ops`, whose handlers see
:class:`.ops.OpsHost`). A part that needs the server
back is handed it typed as one of these protocols, never the whole server: what
it may do is written here, once.

All of them run on the scheduler's loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hpcsched.core.state.scheduler_state import SchedulerState


class ServerOps(Protocol):
    """The state, and the three ways to act on it: feed it an event, name a stimulus,
    send a peer a message."""

    state: SchedulerState

    def handle_event(self, event: Any, op: str = "") -> None:
        """Feed ``event`` to the state and queue the messages it makes."""

    def stimulus(self, op: str) -> str:
        """A new stimulus id, ``"<op>-<n>"``."""

    def send(self, to: str, msg: Any, before_tasks: bool = False) -> None:
        """Queue ``msg`` for peer ``to`` (sent at the end of the loop turn)."""


class ControlHost(ServerOps, Protocol):
    """What cluster control needs beyond :class:`ServerOps`: news of workers joining and
    leaving, and the stimulus that removed the worker being announced."""

    removal_stimulus: str

    def add_worker_callback(self, fn: Any) -> None:
        """Call ``fn("add" | "remove", address, info)`` as workers join and leave."""

