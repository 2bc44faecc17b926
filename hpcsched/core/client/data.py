"""Data between a client and the cluster: ``gather`` results, ``scatter`` local values.

``Client.gather`` and ``Client.scatter`` are thin methods over a
:class:`Transfers`, with distributed's signatures and results
(https://distributed.dask.org/en/stable/api.html#distributed.Client.gather),
which needs the client's connection, its future table, and a way to make the
client's futures (scatter returns new ones).
A gather waits for the futures to be done (woken once, by the batch of
scheduler messages that finishes the last of them), then asks the scheduler for the
data of those still wanted; a key the scheduler lost after reporting it done
is waited for again while it is recomputed.

``Future.result()`` is :meth:`Transfers.result`: a value fetched ahead is taken at
once; else one request asks for the future's value and, if small, for those of the
futures the table names as asked for next (``Gather.extra``), which the table holds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from hpcsched.core.client.futures import (
    TAKEN,
    UNFETCHED,
    CancelledError,
    Future,
    collect_futures,
    exception_of,
)
from hpcsched.core.client.submission import as_list
from hpcsched.core.protocol.messages import ClientDesiresKeys, Gather, ScatterData
from hpcsched.core.protocol.serialize import deserialize, serialize, sizeof
from hpcsched.core.units import parse_interval

if TYPE_CHECKING:
    from hpcsched.core.client.connection import PendingReply, SchedulerConnection
    from hpcsched.core.client.future_state import FutureTable


GATHER_PART = 10_000  # futures a gather waits for and asks for at once
PREFETCH_COUNT = 4096  # results a result() brings along at most
_key, _state, _status = attrgetter("key"), attrgetter("state"), attrgetter("state.status")
_done = attrgetter("state._is_done")


def pack_futures(x: Any, values: dict, errors: str) -> Any:
    """``x`` with its futures replaced by ``values[key]``.

    With ``errors="skip"``, futures without a value are left out of lists."""
    if isinstance(x, Future):
        return values.get(x.key)
    if isinstance(x, list):
        if type(x) is list and set(map(type, x)) == {Future}:  # a map's: no call per item
            keys = map(attrgetter("key"), x)
            return list(map(values.get, keys)) if errors == "raise" else \
                [values[k] for k in keys if k in values]
        return [pack_futures(i, values, errors) for i in x
                if errors == "raise" or not isinstance(i, Future) or i.key in values]
    if isinstance(x, tuple):
        return tuple(pack_futures(i, values, errors) for i in x)
    if isinstance(x, (set, frozenset)):
        return type(x)(pack_futures(i, values, errors) for i in x)
    if isinstance(x, dict):
        return {k: pack_futures(v, values, errors) for k, v in x.items()}
    return x


class Transfers:
    """Results from the cluster and local data to it, for one client (module docstring)."""

    def __init__(self, conn: SchedulerConnection, table: FutureTable,
                 new_future: Callable[[Any], Future], prefetch_bytes: int = 16 * 2**20,
                 prefetch_result_bytes: int = 2**20):
        self.conn = conn
        self.table = table
        self.new_future = new_future
        self.prefetch_bytes = prefetch_bytes
        self.prefetch_result_bytes = prefetch_result_bytes

    def result(self, future: Future, timeout: float | None = None) -> Any:
        """The result of ``future``, with those the client asks for next (module
        docstring): the task's exception if it erred, ``CancelledError`` if cancelled."""
        table = self.table
        st = future.state
        value = table.take(st)
        if value is not UNFETCHED:
            return value
        if timeout is not None:  # seconds, or as dask writes it ("30s", "2m")
            timeout = parse_interval(timeout, "timeout", zero=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        table.wait([st], deadline, timeout)
        value = table.take(st)  # fetched by another thread meanwhile
        if value is not UNFETCHED:
            return value
        if table.on_its_way():  # its reply may bring it; else taken before asking anew
            self._take_ahead(deadline, timeout)
            value = table.take(st)
            if value is not UNFETCHED:
                self._send_ahead(future)  # the next: one request stays on its way
                return value
        budget = table.reserve(self.prefetch_bytes)  # counted until the reply is held
        extra = table.candidates(future, PREFETCH_COUNT) if budget else {}
        if budget and not extra:
            table.unreserve(budget)
            budget = 0
        pending = {future.key: future}
        values: dict = {}
        sizes: dict = {}
        request = None
        try:
            request = self._ask(pending, "raise", deadline, timeout, list(extra), budget)
            while request is not None:
                self._take(pending, request, values, deadline, timeout, sizes)
                request.forget()
                request = self._ask(pending, "raise", deadline, timeout) if pending else None
        finally:
            if request is not None:
                request.forget()
            table.hold(extra, values, sizes, budget)  # what came; the reservation ends
        if st.value is UNFETCHED:
            st.value = TAKEN  # asked for: not to be fetched ahead again
        if extra:
            self._send_ahead(future)
        return values[future.key]

    def _send_ahead(self, future: Future) -> None:
        """Ask now, without waiting, for the results that finished while the last request
        travelled, which the client asks for next: the ``result()`` that needs one of
        them finds it on its way rather than starting a round trip then (a result loop
        over a map still computing would otherwise pay one per batch, one after
        another)."""
        table = self.table
        if table.on_its_way():
            return
        budget = table.reserve(self.prefetch_bytes)  # counted until the reply is held
        extra = table.candidates(future, PREFETCH_COUNT) if budget else {}
        if not extra:
            table.unreserve(budget)
            return
        request = self.conn.send_request(Gather("", [], list(extra), budget,
                                                self.prefetch_result_bytes))
        if not table.send_ahead(extra, request, budget):
            request.forget()  # another thread's is in flight
            table.unreserve(budget)

    def _take_ahead(self, deadline: float | None, timeout: float | None) -> None:
        """Await the request for results fetched ahead (if still in flight) and hold
        its values."""
        ahead = self.table.ahead_in_flight()
        if ahead is None:
            return
        extra, request, reserved = ahead
        values: dict = {}
        sizes: dict = {}
        try:
            self._take({}, request, values, deadline, timeout, sizes)
        finally:
            request.forget()
            self.table.hold(extra, values, sizes, reserved)  # the reservation ends

    def gather(self, futures: Any, errors: str = "raise", timeout: float | None = None) -> Any:
        """Results of ``futures`` (a future, or lists/dicts/tuples of them), same structure;
        ``errors="skip"`` leaves out erred and cancelled ones."""
        if errors not in ("raise", "skip"):
            raise ValueError("errors must be 'raise' or 'skip'")
        flat: list[Future] = []
        collect_futures(futures, flat)
        if timeout is not None:  # seconds, or as dask writes it ("30s", "2m")
            timeout = parse_interval(timeout, "timeout", zero=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        values: dict = {}
        # a large gather asks for its results part by part, in order, as each part is done:
        # the first parts travel while the cluster computes the rest (a map's elements are
        # done roughly in order), and while the next part is awaited. The parts done already
        # when one is asked for go with it: each request is a round trip through the
        # scheduler to every holder
        asked: list[tuple[dict, PendingReply]] = []
        try:
            start, n = 0, len(flat)
            while start < n:
                stop = start + GATHER_PART
                if stop < n:
                    self.table.wait(list(map(_state, flat[start:stop])), deadline, timeout)
                    while stop < n and all(map(_done, flat[stop:stop + GATHER_PART])):
                        stop += GATHER_PART
                part = flat[start:stop]
                pending = dict(zip(map(_key, part), part, strict=True))
                request = self._ask(pending, errors, deadline, timeout)
                if request is not None:
                    asked.append((pending, request))
                start = stop
            for pending, request in asked:
                self._take(pending, request, values, deadline, timeout)
                while pending:  # lost and recomputed since: asked for again
                    request = self._ask(pending, errors, deadline, timeout)
                    if request is None:
                        break
                    self._take(pending, request, values, deadline, timeout)
        finally:
            for _, request in asked:
                request.forget()  # answered, or given up on (a reply still to come is dropped)
        return pack_futures(futures, values, errors)

    def _ask(self, pending: dict, errors: str, deadline: float | None,
             timeout: float | None, extra: list | None = None,
             extra_bytes: int = 0) -> PendingReply | None:
        """Once ``pending`` (key -> future) are done: ask for the values of those that
        finished (the erred and cancelled raise, or are left out with ``errors="skip"``),
        and for those of ``extra`` that are small enough (``Gather.extra``); None if none
        is left."""
        self.table.wait(list(map(_state, pending.values())), deadline, timeout)
        if set(map(_status, pending.values())) == {"finished"}:  # a look at each, in C
            flagged = []
        else:
            flagged = list(pending.values())
        for f in flagged:
            st = f.state
            if st.status == "error":
                if errors == "raise":
                    raise exception_of(st)
                del pending[f.key]
            elif st.status == "cancelled":
                if errors == "raise":
                    raise CancelledError(f"{f.key!r} was cancelled")
                del pending[f.key]
        if not pending:
            return None
        if extra:
            return self.conn.send_request(Gather("", list(pending), extra, extra_bytes,
                                                 self.prefetch_result_bytes))
        return self.conn.send_request(Gather("", list(pending)))

    def _take(self, pending: dict, request: PendingReply, values: dict,
              deadline: float | None, timeout: float | None,
              sizes: dict | None = None) -> None:
        """The reply to ``request``: its values go to ``values`` and leave ``pending``; a
        key the scheduler lost after reporting it done is waited for again. ``sizes``
        gets each value's share of the bytes that brought it."""
        conn = self.conn
        left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        reply = request.reply(left)
        for blob in reply.blobs:
            part = deserialize(blob)
            values.update(part)
            if sizes is not None and part:
                sizes.update(dict.fromkeys(part, getattr(blob, "nbytes", 0) // len(part)))
        if pending.keys() <= values.keys():  # the common case: every value came
            pending.clear()
        else:
            for k in list(pending):
                if k in values:
                    del pending[k]
        for k in reply.missing:
            lost = pending.get(k)
            if lost is not None and lost.state.status == "finished":
                # the scheduler lost it after telling us: wait for the recomputation
                lost.state.lose()
                conn.send(ClientDesiresKeys(conn.client_id, [k]))
        if pending and deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"could not gather {list(pending)[:5]} within {timeout}s")

    def scatter(self, data: Any, workers: Any = None, broadcast: bool = False,
                timeout: float | None = 60.0) -> Any:
        """Move local data to workers; futures in the structure of ``data`` (a dict: by its
        keys; a list, tuple or set: one per item, random keys; anything else: one future)."""
        if isinstance(data, dict):
            items = dict(data)
        elif isinstance(data, (list, tuple, set)):
            items = {f"{type(v).__name__}-{uuid.uuid4().hex}": v for v in data}
        else:
            items = {f"{type(data).__name__}-{uuid.uuid4().hex}": data}
        conn = self.conn
        sid = conn.new_id("scatter")
        payload = {k: serialize(v) for k, v in items.items()}
        futures = {k: self.new_future(k) for k in items}
        reply = conn.request(ScatterData(conn.client_id, sid, payload,
                                         {k: sizeof(v) for k, v in items.items()},
                                         as_list(workers), broadcast), timeout)
        if reply.error:
            raise RuntimeError(f"scatter failed: {reply.error}")
        for f in futures.values():
            if not f.done():
                self.table.run_callbacks(f.state.finish())
        if isinstance(data, dict):
            return futures
        if isinstance(data, (list, tuple, set)):
            out = list(futures.values())
            return type(data)(out) if isinstance(data, tuple) else out
        return next(iter(futures.values()))
