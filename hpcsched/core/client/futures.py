"""Futures: handles on remote results, and the ways to wait for many of them.

A :class:`Future` only knows its key and its client; the client's reader
thread moves its :class:`FutureState` along (pending -> finished | error |
cancelled, or back to pending when the data was lost and is recomputed).
``wait``, ``as_completed`` and ``progress`` work on any mix of futures.

A Future is also a ``concurrent.futures.Future``, so that code written for any
executor's futures accepts ours: the standard library's ``wait`` and
``as_completed`` lock each future's ``_condition``, read its ``_state`` and put a
waiter in its ``_waiters``, which the future's state calls when it is done
(CPython's ``Lib/concurrent/futures/_base.py``). None of that is made per future:
``_condition`` is the one lock every state changes under, ``_state`` is read off
the :class:`FutureState`, and the waiters live in the state only while someone
waits. The methods keep dask's behaviour (``cancel()`` returns None,
``result()`` is a gather).

Results come back at a gather's speed in every idiom, not one round trip per
``result()``: a ``result()`` that must ask the scheduler asks, besides its own key,
for the small finished results this client is about to ask for -- the rest of the
map the future came from, the futures an :class:`as_completed` holds done, those of
the latest :func:`wait`, those whose done callbacks are queued -- and the
:class:`~hpcsched.core.client.future_state.FutureTable` holds them until their own
``result()`` takes them (bounded in bytes, each result at most once; large ones stay
on the workers; a client that never asks for a result receives none).
"""

from __future__ import annotations

import concurrent.futures as cf
import concurrent.futures._base as _cf_base
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from hpcsched._lazy import when_imported
from hpcsched.core.protocol.messages import ClientDesiresKeys
from hpcsched.core.protocol.serialize import deserialize

logger = logging.getLogger("hpcsched.client")


class CancelledError(cf.CancelledError):
    """The future's task was cancelled (``result()``, ``gather``)."""


class RemoteTraceback(Exception):
    """The traceback of a task's exception on its worker.

    It is the ``__cause__`` of the exception rebuilt here."""

    def __init__(self, tb: str):
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


# Guards every future's lazily made event, callback list and waiters. Reentrant: it is
# each future's ``_condition`` too, which concurrent.futures' wait acquires once per future.
_lock = threading.RLock()

# dask's graphs recognize a ``TaskRef`` as a pointer to another task's result: a future
# that is one can be put into ``dask.delayed`` calls and collections, as in distributed.
# Importing dask costs more than the rest of the client, and most programs never use it,
# so a Future starts on a base of TaskRef's layout (one slot, ``key``) and TaskRef becomes
# its base as dask's module for it is loaded (``when_imported``): before dask can see a
# future, and for futures that exist already.
if TYPE_CHECKING:
    from dask._task_spec import TaskRef as _FutureBase
else:

    class _FutureBase:
        """A future's key, laid out as dask's ``TaskRef`` lays it out."""

        __slots__ = ("key",)


def _become_task_refs() -> None:
    """Make dask's ``TaskRef`` the base of :class:`Future` (dask is loaded)."""
    from dask._task_spec import TaskRef

    if not issubclass(Future, TaskRef):
        Future.__bases__ = (TaskRef, cf.Future)


class FutureOwner(Protocol):
    """What a :class:`Future` and the code below the Client use of a future's client.

    The :class:`~hpcsched.core.client.client.Client` is the one implementation; the
    modules it is made of (and the primitives it uses) see it through this, so that none
    of them imports it back."""

    id: str
    #: the connection to the scheduler (``send``, ``post``, ``request``)
    scheduler_comm: Any
    #: the client's :class:`~hpcsched.core.client.future_state.FutureTable`
    future_table: Any

    def submit(self, func: Callable, *args: Any, **kwargs: Any) -> Future:
        """A future of ``func(*args, **kwargs)`` run on a worker."""

    def map(self, func: Callable, *iterables: Any, **kwargs: Any) -> list[Future]:
        """Futures of ``func`` over the items of ``iterables``."""

    def gather(self, futures: Any, errors: str = "raise",
               timeout: float | None = None) -> Any:
        """The results of ``futures``, in their structure."""

    def result_of(self, future: Future, timeout: float | None = None) -> Any:
        """The result of ``future`` (``Future.result``)."""

    def cancel(self, futures: Any) -> None:
        """Cancel ``futures``."""

    def retry(self, futures: Any) -> None:
        """Run erred ``futures`` again."""

    def request(self, msg: Any, timeout: float | None = None) -> Any:
        """The scheduler's reply record to the request record ``msg``."""


#: a state's ``value`` when its result was never fetched here ...
UNFETCHED: Any = type("Unfetched", (), {"__repr__": lambda self: "UNFETCHED"})()
#: ... and once the value fetched ahead was taken by ``result()`` (asked anew after)
TAKEN: Any = type("Taken", (), {"__repr__": lambda self: "TAKEN"})()


class FutureState:
    """Where a key stands for this client.

    Events and callback lists are made only when someone waits or registers a callback:
    a ``map`` of 10,000 items creates none. ``value`` is the result when it was fetched
    ahead (module docstring), else :data:`UNFETCHED` or :data:`TAKEN`."""

    __slots__ = ("status", "_event", "exception", "traceback", "typename", "callbacks",
                 "exception_text", "_is_done", "refs", "waiters", "value")

    def __init__(self, refs: int = 0) -> None:
        self.refs = refs  # the client's Future objects of it (its FutureTable counts them)
        self.status = "pending"
        self._event: threading.Event | None = None
        self.exception: Any = None
        self.traceback = ""
        self.exception_text = ""
        self.typename = ""
        self.callbacks: list | None = None
        self._is_done = False
        #: ``(future, waiter)`` of the concurrent.futures waits on it, while they wait
        self.waiters: list | None = None
        self.value: Any = UNFETCHED

    def _done(self) -> list:
        with _lock:
            self._is_done = True
            event, cbs, self.callbacks = self._event, self.callbacks, None
            if self.waiters is not None:
                notify_waiters(self.waiters, self.status)
                self.waiters = None
        if event is not None:
            event.set()
        return cbs or []

    def finish(self, typename: str = "") -> list:
        """The result is in memory; returns the callbacks to run."""
        self.status = "finished"
        self.typename = typename
        return self._done()

    def error(self, exception: Any, traceback: str, text: str) -> list:
        """The task erred (``exception`` serialized); returns the callbacks to run."""
        self.status = "error"
        self.value = UNFETCHED
        self.exception = exception
        self.traceback = traceback
        self.exception_text = text
        return self._done()

    def cancel(self) -> list:
        """The key was cancelled; returns the callbacks to run."""
        self.status = "cancelled"
        self.value = UNFETCHED  # its data is dropped
        return self._done()

    def lose(self, status: str = "lost") -> None:
        """Not done any more: the result was lost and is being recomputed.

        (Or the key was submitted again after a cancellation.)"""
        with _lock:
            self._is_done = False
            self.status = status
            self.value = UNFETCHED
            if self._event is not None:
                self._event.clear()

    def done(self) -> bool:
        """Finished, erred or cancelled."""
        return self._is_done

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; False if ``timeout`` seconds passed first."""
        if self._is_done:
            return True
        with _lock:
            if self._is_done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def add_callback(self, entry: Any) -> bool:
        """Queue ``entry`` for when the future is done; False if it already is."""
        with _lock:
            if self._is_done:
                return False
            if self.callbacks is None:
                self.callbacks = []
            self.callbacks.append(entry)
            return True


def fetchable(st: FutureState) -> bool:
    """Whether the result of ``st`` may be fetched ahead: finished, never fetched, held."""
    return st.value is UNFETCHED and st.status == "finished" and st.refs > 0


class FutureGroup:
    """Futures whose results are asked for in order (a map's, a :func:`wait`'s).

    Their keys and states, and how far from the start every one is done and fetched."""

    __slots__ = ("keys", "states", "cursor")

    def __init__(self, futures: list[Future]):
        self.keys = [f.key for f in futures]
        self.states = [f.state for f in futures]
        self.cursor = 0  # states before it are done, and fetched or not to be fetched

    def ready(self, out: dict, limit: int) -> None:
        """Add the :func:`fetchable` states of the next ``limit`` to ``out``.

        ``out`` maps key -> state and is filled up to ``limit`` entries; the cursor moves
        past the states done and fetched."""
        states = self.states
        n = len(states)
        i = self.cursor
        while i < n:  # fetchable(), inline: a look at each state of a map
            st = states[i]
            if not st._is_done or (st.value is UNFETCHED and st.status == "finished"
                                   and st.refs > 0):
                break
            i += 1
        self.cursor = i
        keys = self.keys
        for j in range(i, min(n, i + limit)):
            st = states[j]
            if st._is_done and st.value is UNFETCHED and st.status == "finished" \
                    and st.refs > 0:
                out[keys[j]] = st
                if len(out) >= limit:
                    return


def finish_all(states: list[FutureState | None], types: list[str]) -> list:
    """:meth:`FutureState.finish` of each of ``states`` not finished yet; the callbacks.

    A state None (no future of it is held) is passed over. ``types`` are the type names
    of their results. One lock for all: a bulk map's elements are reported many at once."""
    cbs: list = []
    events: list = []
    with _lock:
        for st, typename in zip(states, types, strict=True):
            if st is None or st.status == "finished":
                continue
            st.status = "finished"
            st.typename = typename
            st._is_done = True
            if st._event is not None:
                events.append(st._event)
            if st.callbacks is not None:
                cbs += st.callbacks
                st.callbacks = None
            if st.waiters is not None:
                notify_waiters(st.waiters, "finished")
                st.waiters = None
    for event in events:
        event.set()
    return cbs


def notify_waiters(waiters: list, status: str) -> None:
    """Tell concurrent.futures' waiters (``(future, waiter)`` pairs) their future is done.

    ``status`` says how, and they are told as a ``concurrent.futures.Future`` tells
    them (under ``_lock``)."""
    for fut, waiter in waiters:
        if status == "error":
            waiter.add_exception(fut)
        elif status == "cancelled":
            waiter.add_cancelled(fut)
        else:
            waiter.add_result(fut)


class _Waiters:
    """A future's ``_waiters``, as concurrent.futures' ``wait`` and ``as_completed`` use it.

    They ``append`` and ``remove`` holding ``_condition``; the waiters are kept in the
    key's state beside the future, and the state calls them once, when done, and drops
    them."""

    __slots__ = ("future",)

    def __init__(self, future: Future):
        self.future = future

    def append(self, waiter: Any) -> None:
        st = self.future.state
        if st._is_done:  # done before the wait: the standard library expects no call
            return
        if st.waiters is None:
            st.waiters = []
        st.waiters.append((self.future, waiter))

    def remove(self, waiter: Any) -> None:
        st = self.future.state
        if st.waiters is not None:  # None once done: the state dropped its waiters
            st.waiters = [p for p in st.waiters if p[1] is not waiter] or None


def exception_of(st: FutureState) -> BaseException:
    """The exception of an erred future, rebuilt here, the remote traceback as its cause.

    A class that does not exist in this process becomes a ``RuntimeError``."""
    exc = st.exception
    try:
        exc = deserialize(exc)
    except Exception as e:  # e.g. the exception's class does not exist here
        exc = RuntimeError(f"{st.exception_text} (could not rebuild the exception: {e})")
    if not isinstance(exc, BaseException):
        exc = RuntimeError(st.exception_text or repr(exc))
    if st.traceback and exc.__cause__ is None:
        exc.__cause__ = RemoteTraceback(f'\n"""\n{st.traceback}"""')
    return exc


class Future(_FutureBase, cf.Future):
    """A remote result. ``result()`` blocks; passing it to ``submit`` makes it a dependency.

    ``key`` names the task, ``client`` holds it, ``state`` is the key's
    :class:`FutureState` (shared by the client's futures of that key), which the
    client's handling of scheduler messages moves along.

    It is a ``concurrent.futures.Future``: ``concurrent.futures.wait`` and
    ``as_completed`` accept it (its ``__init__`` is not called: nothing of it is made
    per future).

    >>> import concurrent.futures
    >>> issubclass(Future, concurrent.futures.Future)
    True
    """

    __slots__ = ("client", "state", "_released", "group")

    def __init__(self, key: Any, client: FutureOwner, state: FutureState | None = None):
        self.key = key
        self.client = client
        self.state = client.future_table.acquire(key, state)
        self._released = False
        #: the :class:`FutureGroup` (a map's) whose results are fetched with this one's
        self.group: FutureGroup | None = None

    @classmethod
    def of_keys(cls, keys: list, client: FutureOwner) -> list[Future]:
        """One future of each of ``keys`` (a bulk map's), counted under one lock."""
        out = []
        new = cls.__new__
        for key, state in zip(keys, client.future_table.acquire_many(keys), strict=True):
            f = new(cls)
            f.key = key
            f.client = client
            f.state = state
            f._released = False
            f.group = None
            out.append(f)
        return out

    @property
    def status(self) -> str:
        """``pending``, ``finished``, ``error``, ``cancelled`` or ``lost`` (recomputing)."""
        return self.state.status

    def done(self) -> bool:
        """Whether the task finished, erred or was cancelled (without waiting)."""
        return self.state.done()

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the result and return it.

        Raises the task's exception if it erred, :class:`CancelledError` if it was
        cancelled, ``TimeoutError`` after ``timeout``. The small finished results the
        client is about to ask for come along (module docstring)."""
        st = self.state
        value = st.value
        # fetched ahead: taken with no call and no lock (FutureTable.take, inline)
        if value is not UNFETCHED and value is not TAKEN and st.status == "finished":
            st.value = TAKEN
            return value
        return self.client.result_of(self, timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception of an erred task (None if it succeeded); waits until done."""
        if not self.state.wait(timeout):
            raise TimeoutError(f"future {self.key!r} not done within {timeout}s")
        if self.state.status != "error":
            return None
        return exception_of(self.state)

    def traceback(self) -> str:
        """The remote traceback of an erred task, as text ("" otherwise)."""
        return self.state.traceback

    def cancel(self) -> None:  # type: ignore[override]  # dask's: None, not a bool
        """Cancel the task (see :meth:`Client.cancel`)."""
        self.client.cancel([self])

    def cancelled(self) -> bool:
        """Whether the future was cancelled."""
        return self.state.status == "cancelled"

    def add_done_callback(self, fn: Callable[[Future], Any]) -> None:
        """Call ``fn(future)`` when done (at once if already done), in a client thread."""
        if not self.state.add_callback((weakref.ref(self), fn, self)):
            run_callback(fn, self)

    def release(self) -> None:
        """Drop this future's claim on its result now, rather than when it is collected."""
        if not self._released:
            self._released = True
            self.client.future_table.release(self.key, self.state)

    def retry(self) -> None:
        """Run an erred task (and its erred dependencies) again."""
        self.client.retry([self])

    # concurrent.futures' wait and as_completed read these (see the module docstring); read
    # only, as nothing of them is stored per future
    @property
    def _condition(self) -> Any:  # type: ignore[override]
        return _lock

    @property
    def _state(self) -> str:  # type: ignore[override]
        st = self.state
        if not st._is_done:
            return _cf_base.PENDING
        return _cf_base.CANCELLED_AND_NOTIFIED if st.status == "cancelled" else \
            _cf_base.FINISHED

    @property
    def _waiters(self) -> _Waiters:  # type: ignore[override]
        return _Waiters(self)

    # one object per key and client for hashing, as futures were before dask's TaskRef
    # (whose equality is by key) became their base
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __reduce__(self) -> Any:
        # inside a dask task this is a reference to the result (dask resolves TaskRefs)
        try:
            from dask._task_spec import TaskRef
        except ImportError:  # dask is optional
            raise TypeError(f"{self!r} cannot be pickled: pass it as an argument of "
                            "submit/map or inside a task graph instead") from None
        return (TaskRef, (self.key,))

    def __del__(self) -> None:
        try:  # release(), inline: a map's futures are dropped by the hundred thousand
            if not self._released:
                self._released = True
                self.client.future_table.release(self.key, self.state)
        except Exception:
            pass

    def _repr_html_(self) -> str:
        from hpcsched.core import seams  # presentation lives in the diagnostics layer

        return seams.resolve("future-html")(self)

    def __repr__(self) -> str:
        st = self.state
        kind = f", type: {st.typename}" if st.status == "finished" and st.typename else ""
        return f"<Future: status: {st.status}{kind}, key: {self.key}>"

    __str__ = __repr__

    def __await__(self):  # pragma: no cover - convenience for notebooks with asyncio
        import asyncio

        return asyncio.get_event_loop().run_in_executor(None, self.result).__await__()


when_imported("dask._task_spec", _become_task_refs)


def run_callback(fn: Callable, fut: Any) -> None:
    """Call a done callback (of a future, or of a run of them); its exception is logged."""
    try:
        fn(fut)
    except Exception:
        logger.exception("done callback %r of %r failed", fn, fut)


class DoneAndNotDoneFutures(NamedTuple):
    """What ``wait`` returns: the futures done and those not done."""

    done: set
    not_done: set


def wait_futures(fs: Any, timeout: float | None = None,
                 return_when: str = "ALL_COMPLETED") -> DoneAndNotDoneFutures:
    """Wait for futures, as ``distributed.wait``.

    ``return_when``: ``ALL_COMPLETED``, ``FIRST_COMPLETED`` or ``FIRST_EXCEPTION``;
    ``TimeoutError`` after ``timeout`` seconds for all of them."""
    flat: list[Future] = []
    collect_futures(fs, flat)
    deadline = None if timeout is None else time.monotonic() + timeout
    clients = {id(f.client): f.client for f in flat}
    for client in clients.values():  # their results are likely asked for next
        mine = flat if len(clients) == 1 else [f for f in flat if f.client is client]
        group = mine[0].group
        # a map's futures, waited for as a whole: its own group (whose place is kept),
        # not a copy of it to walk again
        if group is None or len(group.keys) != len(mine) or \
                set(map(_group, mine)) != {group}:  # a look at each, in C
            group = FutureGroup(mine)
        client.future_table.waited(group)
    if return_when == "ALL_COMPLETED":
        for client in clients.values():  # woken once, as a gather is
            mine = flat if len(clients) == 1 else [f for f in flat if f.client is client]
            client.future_table.wait([f.state for f in mine], deadline, timeout)
    elif return_when in ("FIRST_COMPLETED", "FIRST_EXCEPTION"):
        done_event = threading.Event()
        for f in flat:
            f.add_done_callback(lambda _f: done_event.set())
        if not any(f.done() for f in flat):
            done_event.wait(timeout)
    else:
        raise ValueError(f"unknown return_when {return_when!r}")
    if all(map(_is_done, flat)):  # the common case, with no call per future
        return DoneAndNotDoneFutures(set(flat), set())
    done = {f for f in flat if f.done()}
    return DoneAndNotDoneFutures(done, set(flat) - done)


wait = wait_futures
_group, _is_done = attrgetter("group"), attrgetter("state._is_done")
_table = attrgetter("client.future_table")


class Arrivals:
    """The done callback of an :class:`as_completed`'s futures, called with a run at once."""

    __slots__ = ("done", "cond", "unsettled")

    def __init__(self) -> None:
        self.done: deque[Future] = deque()  # done, not yet taken by the iterator
        self.cond = threading.Condition(threading.Lock())
        #: the latest done, in the same order (:meth:`as_completed.ready`)
        self.unsettled: deque[Future] = deque()

    def __call__(self, future: Future) -> None:
        """``future`` is done."""
        self.many((future,))

    def many(self, futures: Sequence[Future]) -> None:
        """``futures`` are done, in this order."""
        with self.cond:
            self.done.extend(futures)
            self.unsettled.extend(futures)
            self.cond.notify()


class as_completed(Iterator):  # noqa: N801 - dask's name
    """Iterate over futures in the order they finish; ``add`` more while iterating.

    The futures done and not yet yielded are the next whose results are fetched along
    with one that is asked for (module docstring). All those done so far are taken at
    once (one lock, not one per future), with ``with_results`` their results too."""

    def __init__(self, futures: Iterable[Future] = (), with_results: bool = False,
                 raise_errors: bool = True):
        self._arrivals = Arrivals()
        self._done, self._cond = self._arrivals.done, self._arrivals.cond
        self._count = 0  # added, not yet moved to _out (under _cond)
        self._out: deque[Future] = deque()  # taken from _done, to be yielded in order
        self._tables: set[int] = set()  # ids of the future tables told of this iterator
        self.with_results = with_results
        self.raise_errors = raise_errors
        self.update(futures)

    def add(self, future: Future) -> None:
        """Yield ``future`` too when it is done."""
        self.update([future])

    def update(self, futures: Iterable[Future]) -> None:
        """``add`` each of ``futures``."""
        futures = list(futures)
        tables = set(map(_table, futures))  # a look at each, in C
        with self._cond:
            self._count += len(futures)
            for table in tables:
                if id(table) not in self._tables:
                    self._tables.add(id(table))
                    table.sources.add(self)
        # add_done_callback of each, under one lock: a map's futures come by the thousand.
        # No weak reference: the entry holds its future until done, as the iterator does
        done = []
        put = self._arrivals
        with _lock:
            for f in futures:
                st = f.state
                if st._is_done:
                    done.append(f)
                elif st.callbacks is None:  # st.callbacks: a list made on first use
                    st.callbacks = [(None, put, f)]
                else:
                    st.callbacks.append((None, put, f))
        if done:
            put.many(done)

    def count(self) -> int:
        """How many futures are still to be yielded."""
        with self._cond:
            return self._count + len(self._out)

    def is_empty(self) -> bool:
        """Whether every future was yielded."""
        return self.count() == 0

    def ready(self, out: dict, limit: int) -> None:
        """Add the done futures not yet yielded to ``out`` (key -> state, ``limit`` at most).

        Those whose results may be fetched ahead only; each is looked at until settled
        (fetched, taken, nothing to fetch), not once per request."""
        unsettled = self._arrivals.unsettled
        with self._cond:
            self._settle()
            while unsettled:
                st = unsettled[0].state  # fetchable(st), inline, as below
                if st.value is UNFETCHED and st.status == "finished" and st.refs > 0:
                    break
                unsettled.popleft()
            waiting = list(itertools.islice(unsettled, limit))
        for f in waiting:
            st = f.state
            if st.value is UNFETCHED and st.status == "finished" and st.refs > 0:
                out[f.key] = st
                if len(out) >= limit:
                    return

    def _settle(self) -> None:
        """Drop the futures yielded from ``unsettled``: its first ones (under ``_cond``)."""
        unsettled = self._arrivals.unsettled  # those not yielded (_out, _done) came last
        for _ in range(len(unsettled) - len(self._out) - len(self._done)):
            unsettled.popleft()

    def __iter__(self) -> as_completed:
        return self

    def _refill(self, block: bool) -> bool:
        """Move the futures done so far to ``_out`` (waiting for one if ``block``): any?"""
        with self._cond:
            self._settle()
            while not self._done:
                if not block or self._count == 0:
                    return False
                self._cond.wait()
            self._count -= len(self._done)
            self._out.extend(self._done)
            self._done.clear()
            if self._count == 0:  # another thread's wait is over too
                self._cond.notify_all()
        return True

    def _with_result(self, f: Future) -> tuple[Future, Any]:
        """``(f, its result)`` (or its exception, if errors are not raised)."""
        st = f.state
        value = st.value
        # fetched ahead: taken with no call and no lock (FutureTable.take, inline)
        if value is not UNFETCHED and value is not TAKEN and st.status == "finished":
            st.value = TAKEN
            return f, value
        try:
            return f, f.result()
        except Exception as e:
            if self.raise_errors:
                raise
            return f, e

    def __next__(self) -> Any:
        while True:  # another thread iterating may take the last one first
            try:
                f = self._out.popleft()
            except IndexError:
                if self._refill(block=True):
                    continue
                raise StopIteration from None
            return self._with_result(f) if self.with_results else f

    def batches(self) -> Iterator[list]:
        """Lists of what finished since the last one (one item at least), until all done."""
        while self.count():
            yield self.next_batch(block=True)

    def next_batch(self, block: bool = True) -> list:
        """What is done now (waiting for at least one if ``block``)."""
        self._refill(block=block and not self._out)
        out, got = self._out, []  # one by one: an error raised leaves the rest to yield
        while out:
            try:
                f = out.popleft()
            except IndexError:  # another thread took it
                break
            got.append(self._with_result(f) if self.with_results else f)
        return got


def progress(*futures: Any, **kwargs: Any) -> Any:
    """Show the progress of futures: see :func:`hpcsched.diagnostics.progress.progress`."""
    from hpcsched.core import seams

    return seams.resolve("progress")(*futures, **kwargs)


def fire_and_forget(obj: Any) -> None:
    """Run the tasks of ``obj`` (futures, or containers of them) to the end.

    Even when no future of theirs is held any more; their results are dropped once they
    finish."""
    flat: list[Future] = []
    collect_futures(obj, flat)
    by_client: dict[int, tuple[FutureOwner, list]] = {}
    for f in flat:
        by_client.setdefault(id(f.client), (f.client, []))[1].append(f.key)
    for client, keys in by_client.values():
        client.scheduler_comm.send(ClientDesiresKeys(client.id, keys, fire_and_forget=True))


def futures_of(obj: Any) -> list[Future]:
    """The futures inside ``obj``: containers, and dask collections persisted on the cluster."""
    out: list[Future] = []
    seen: set[int] = set()
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, Future):
            if id(x) not in seen:
                seen.add(id(x))
                out.append(x)
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif hasattr(x, "__dask_graph__") and not isinstance(x, type):
            stack.extend(dict(x.__dask_graph__()).values())
        elif hasattr(x, "args") and hasattr(x, "dependencies"):  # a dask task-spec Task
            stack.extend(x.args)
            stack.extend((getattr(x, "kwargs", None) or {}).values())
        elif type(x).__name__ == "DataNode" and hasattr(x, "value"):
            stack.append(x.value)
    return out[::-1]


def collect_futures(x: Any, out: list) -> None:
    """Append the futures inside ``x`` (containers walked) to ``out``."""
    if type(x) is list and set(map(type, x)) == {Future}:  # a map's: no call per item
        out += x
    elif isinstance(x, Future):
        out.append(x)
    elif isinstance(x, (list, tuple, set, frozenset)):
        for i in x:
            collect_futures(i, out)
    elif isinstance(x, dict):
        for v in x.values():
            collect_futures(v, out)
