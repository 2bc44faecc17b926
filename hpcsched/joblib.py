"""joblib on an hpcsched cluster: ``Parallel`` and scikit-learn's ``n_jobs`` run on its workers.

::

    import joblib
    from hpcsched import Client
    from sklearn.model_selection import GridSearchCV

    with Client(cluster), joblib.parallel_backend("hpcsched"):
        GridSearchCV(estimator, grid).fit(X, y)      # every fit is a task on a worker

``import hpcsched`` registers the backend with joblib once joblib is imported, without
importing it itself (:func:`hpcsched._lazy.when_imported`): joblib knows ``"hpcsched"``
whichever of the two a program imports first. The backend follows joblib's own for
dask.distributed (``joblib/_dask.py``), so code written for that one behaves the same:

- **The client.** ``client=`` if given; inside a task, the worker's own client (so a
  ``Parallel`` inside a task fans out over the cluster too); else the default client.
  With none, entering ``parallel_backend`` raises a ``ValueError`` saying what to create.
- **Batches are tasks.** joblib batches calls (growing the batch while calls are quick);
  each batch is one task, run under this backend so nested ``Parallel`` calls use it.
- **Large arguments travel once.** In one ``Parallel`` call, each argument larger than
  ``scatter_threshold`` bytes (the training data of every fit of a grid search) is scattered
  once and its future passed to every batch using the same object; ``scatter=[...]``
  broadcasts objects to every worker for the backend's lifetime.
- **Nested parallelism does not deadlock.** A task waiting for the batches of its inner
  ``Parallel`` leaves its worker's thread pool meanwhile (``secede``/``rejoin``), so the
  inner batches find threads even when every thread holds an outer batch.
- **Errors and aborts.** A call's exception is raised by ``Parallel`` as joblib raises it
  (its own type and message); joblib then aborts and the batches still pending are
  cancelled on the cluster.
- **n_jobs.** ``-1`` (the default) is every worker thread of the cluster, ``-2`` all but
  one, a positive number at most that many at a time; never fewer than two unless
  ``n_jobs=1``, for which joblib runs the calls in the calling process.

``parallel_backend("dask")`` names joblib's backend for dask.distributed, which calls
``distributed.get_client()`` and drives distributed's own ``Client`` on its event loop; an
hpcsched ``Client`` is not one. So while an hpcsched client is the current one (in one of
its tasks, or a default client exists) and dask.distributed has no client of its own,
``"dask"`` is served by this backend; otherwise by joblib's, unchanged. A program written
for dask.distributed then runs on hpcsched by changing only the ``Client`` it creates.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from joblib import parallel_config, register_parallel_backend
from joblib.parallel import AutoBatchingMixin, ParallelBackendBase

from hpcsched.core.client.futures import Future
from hpcsched.core.client.submission import funcname
from hpcsched.core.client.worker_client import current, get_client, in_task, rejoin, secede
from hpcsched.core.protocol.serialize import sizeof

__all__ = ["HpcschedBackend", "register"]

#: arguments larger than this (bytes) are scattered once per ``Parallel`` call rather than
#: sent with every batch using them (joblib's dask backend scatters from the same size)
SCATTER_THRESHOLD = 1_000


class HpcschedBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's ``ParallelBackendBase`` over an hpcsched :class:`~hpcsched.Client`.

    Made by joblib from ``parallel_backend("hpcsched", **kwargs)``: ``client`` (default:
    the current one, module docstring), ``scatter`` (objects to broadcast to every
    worker once), ``scatter_threshold`` (bytes above which an argument is scattered once
    per call), ``wait_for_workers_timeout`` (seconds to wait for a first worker when the
    cluster has none), and options of :meth:`Client.submit` for every batch (``workers``,
    ``resources``, ``retries``, ``priority``, ``allow_other_workers``).
    """

    # the batch durations joblib aims at: longer than the dispatch round trip to a worker
    # and back, short enough to spread the calls over every worker (joblib's dask values)
    MIN_IDEAL_BATCH_DURATION = 0.2
    MAX_IDEAL_BATCH_DURATION = 1.0
    supports_retrieve_callback = True
    default_n_jobs = -1

    def __init__(self, client: Any = None, scatter: list | tuple | None = None,
                 scatter_threshold: int = SCATTER_THRESHOLD,
                 wait_for_workers_timeout: float = 10.0, nesting_level: int | None = None,
                 inner_max_num_threads: int | None = None, **submit_kwargs: Any):
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads)
        if scatter is not None and not isinstance(scatter, (list, tuple)):
            raise TypeError(f"scatter must be a list or tuple, not {type(scatter).__name__}")
        self._client = client
        self.scatter_threshold = scatter_threshold
        self.wait_for_workers_timeout = wait_for_workers_timeout
        self.submit_kwargs = submit_kwargs
        self._lock = threading.Lock()
        self._pending: set[Future] = set()  # submitted, not done: what an abort cancels
        self._call_data = _ByIdentity()  # per Parallel call: argument -> its future
        # inside a task the client is the worker's, made when a batch first needs it: most
        # batches run no Parallel of their own
        if client is None and not in_task():
            self._client = _current_client()
        self._broadcast: list = list(scatter or ())  # kept alive: futures are found by id
        self._broadcast_futures: dict[int, Future] = {}
        if self._broadcast:
            futures = self.client.scatter(self._broadcast, broadcast=True)
            self._broadcast_futures = {id(x): f for x, f in
                                       zip(self._broadcast, futures, strict=True)}

    @property
    def client(self) -> Any:
        """The client batches are submitted with (resolved on first use inside a task)."""
        if self._client is None:
            self._client = _current_client()
        return self._client

    def __reduce__(self) -> Any:
        # a client cannot travel; where the backend lands it takes that process's current one
        return (HpcschedBackend, ())

    # ------------------------------------------------------------ joblib's interface
    def effective_n_jobs(self, n_jobs: int | None) -> int:
        threads = sum(self.client.nthreads().values())
        if threads == 0:
            try:
                self.client.wait_for_workers(1, timeout=self.wait_for_workers_timeout)
            except TimeoutError as e:
                raise TimeoutError(
                    f"joblib's hpcsched backend: the cluster has no worker after "
                    f"{self.wait_for_workers_timeout}s; start workers or pass a longer "
                    "parallel_backend('hpcsched', wait_for_workers_timeout=...)") from e
            threads = sum(self.client.nthreads().values())
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs == 1:
            return 1  # asked for: joblib then runs the calls in this process
        if n_jobs is None or n_jobs < 0:
            wanted = threads + 1 + (n_jobs or -1)
        else:
            wanted = min(n_jobs, threads)
        # never 1 otherwise: joblib would run the calls here, in the client's process (a
        # login node's), rather than on a cluster that has a single thread
        return max(2, wanted)

    def configure(self, n_jobs: int = 1, parallel: Any = None, **backend_args: Any) -> int:
        self.parallel = parallel
        return self.effective_n_jobs(n_jobs)

    def get_nested_backend(self) -> tuple[ParallelBackendBase, int]:
        level = (self.nesting_level or 0) + 1
        return HpcschedBackend(client=self._client, nesting_level=level), -1

    def start_call(self) -> None:
        self._call_data = _ByIdentity()

    def stop_call(self) -> None:
        # releasing the futures drops the scattered arguments from the workers
        with self._lock:
            self._call_data = _ByIdentity()

    def submit(self, func: Any, callback: Callable[[Any], Any] | None = None) -> Future:
        """Run joblib's batch ``func`` (a ``BatchedCalls``) as one task; ``callback`` gets
        the outcome once it is done, in the client's callback thread."""
        calls = [(f, self._arguments(args), dict(zip(kwargs, self._arguments(kwargs.values()),
                                                      strict=True)))
                 for f, args, kwargs in func.items]
        batch = _Batch(len(calls), self.nesting_level or 0)
        key = f"joblib-{_batch_name(calls)}-{uuid.uuid4().hex}"
        fut = self.client.submit(batch, calls, key=key, pure=False, **self.submit_kwargs)
        with self._lock:
            self._pending.add(fut)

        def done(f: Future) -> None:
            with self._lock:
                self._pending.discard(f)
            try:
                outcome = _Outcome(f.result(), None)
            except BaseException as e:  # noqa: BLE001 - handed to joblib, which raises it
                outcome = _Outcome(None, e)
            f.release()
            if callback is not None:
                callback(outcome)

        fut.add_done_callback(done)
        return fut

    def retrieve_result_callback(self, out: Any) -> Any:
        if out.error is not None:
            raise out.error
        return out.value

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """joblib stops after an error: cancel the batches not finished (no one reads them)."""
        with self._lock:
            pending, self._pending = list(self._pending), set()
        if pending:
            self.client.cancel(pending)

    @contextlib.contextmanager
    def retrieval_context(self) -> Iterator[None]:
        # a task waiting for its inner batches gives its thread back meanwhile, or inner
        # batches could wait for threads that outer batches hold while waiting for them
        running = current()
        if running is None or running.on_loop:
            yield
            return
        secede()
        try:
            yield
        finally:
            rejoin()

    # ------------------------------------------------------------ arguments
    def _arguments(self, args: Any) -> list:
        """``args`` with each large object replaced by the future of its one scattered copy."""
        out = []
        for arg in args:
            fut = self._broadcast_futures.get(id(arg))
            if fut is None and sizeof(arg) > self.scatter_threshold and _weakrefable(arg):
                # under the lock: batches dispatched from joblib's callback thread and the
                # caller's thread scatter an argument they share once between them
                with self._lock:
                    fut = self._call_data.get(arg)
                    if fut is None:
                        fut = self.client.scatter(arg)
                        self._call_data.put(arg, fut)
            out.append(arg if fut is None else fut)
        return out


class _Batch:
    """The task of one joblib batch: its calls in order, under the hpcsched backend (so a
    ``Parallel`` inside a call fans out over the cluster from the worker)."""

    def __init__(self, size: int, nesting_level: int):
        self.size = size
        self.nesting_level = nesting_level

    def __call__(self, calls: list) -> list:
        with parallel_config(backend=HpcschedBackend(nesting_level=self.nesting_level + 1)):
            return [f(*args, **kwargs) for f, args, kwargs in calls]

    def __repr__(self) -> str:
        return f"<joblib batch of {self.size} calls>"


class _Outcome:
    """What a batch's task ended with: its results, or the exception joblib is to raise."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any, error: BaseException | None):
        self.value = value
        self.error = error


class _ByIdentity:
    """``object -> future`` by identity, for objects that need not be hashable (arrays); an
    entry goes when its object is collected, so a new object at a reused ``id`` misses."""

    def __init__(self) -> None:
        self._data: dict[int, tuple[weakref.ref, Future]] = {}

    def get(self, obj: Any) -> Future | None:
        entry = self._data.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None

    def put(self, obj: Any, fut: Future) -> None:
        key = id(obj)
        # the callback holds this table weakly: a table dropped (a call over) then frees its
        # futures at once, which a cycle through the callback would leave to the collector
        table = weakref.ref(self)

        def forget(ref: weakref.ref) -> None:
            owner = table()
            if owner is not None and key in owner._data and owner._data[key][0] is ref:
                del owner._data[key]

        self._data[key] = (weakref.ref(obj, forget), fut)


def _weakrefable(obj: Any) -> bool:
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True


def _batch_name(calls: list) -> str:
    names = {funcname(getattr(f, "function", f)) for f, _, _ in calls}
    return names.pop() if len(names) == 1 else "mixed"


def _current_client() -> Any:
    try:
        return get_client()
    except ValueError:
        raise ValueError(
            "joblib's hpcsched backend needs a Client: create one first "
            "(hpcsched.Client(...) or Client(cluster)), or pass it: "
            "parallel_backend('hpcsched', client=client)") from None


def _hpcsched_is_current() -> bool:
    """Whether an hpcsched client is the one a task or the program would use now."""
    if in_task():
        return True
    try:
        get_client()
    except ValueError:
        return False
    return True


def _distributed_has_client() -> bool:
    """Whether dask.distributed has a client of its own (without importing it if not)."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return False
    try:
        distributed.default_client()
    except ValueError:
        try:  # a task of a dask.distributed worker
            distributed.get_worker()
        except ValueError:
            return False
    return True


def _dask_backend(client: Any = None, **kwargs: Any) -> ParallelBackendBase:
    """joblib's ``"dask"``: this backend for an hpcsched client, joblib's own otherwise
    (module docstring)."""
    ours = isinstance(client, _client_class()) if client is not None else (
        not kwargs.get("scheduler_host") and not _distributed_has_client()
        and _hpcsched_is_current())
    if ours:
        kwargs.pop("scheduler_host", None)
        kwargs.pop("loop", None)
        return HpcschedBackend(client=client, **kwargs)
    from joblib._dask import DaskDistributedBackend

    if client is not None:
        kwargs["client"] = client
    return DaskDistributedBackend(**kwargs)


def _client_class() -> type:
    from hpcsched.core.client.client import Client

    return Client


def register() -> None:
    """Make ``"hpcsched"`` (and ``"dask"`` for an hpcsched client) joblib backends.

    ``import hpcsched`` calls it when joblib is imported; calling it again does no harm."""
    register_parallel_backend("hpcsched", HpcschedBackend)
    register_parallel_backend("dask", _dask_backend)


register()
