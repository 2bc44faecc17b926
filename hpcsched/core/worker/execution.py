"""Running a task, and what travels when it fails.

* :func:`run_spec_call` runs a task's :class:`~hpcsched.core.protocol.run_spec.RunSpec`
  against the worker's data (keeping its result in a checkpoint
  file, or reading it from one, when the spec says so: :mod:`.checkpoint`);
  :func:`load_call` is its first half, the function and arguments unpickled, so that
  a task's measured run leaves out what unpickling costs (the first task of a function
  imports its module: seconds on a loaded machine, which the mean duration of its group,
  and thus how many of them a worker is given at once, would remember for thousands of
  tasks), as dask.distributed times only the call
  (https://distributed.dask.org/en/stable/worker-state.html);
* :func:`pack_exception` turns an exception into (serialized exception,
  traceback text, one-line description): what ``task-erred`` carries, and what
  a client's ``result()`` raises again, with the worker's traceback and the last
  lines the task printed (:mod:`.tasks.output`);
* :func:`serialization_errors` finds which results cannot be serialized to
  leave their worker, packed the same way: the exception pickling raised
  (e.g. by a ``__reduce__``), not a wrapper, so that the client sees the
  real one.
"""

from __future__ import annotations

import traceback as tb_mod
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from hpcsched.core.graph.dsk import evaluate
from hpcsched.core.protocol.run_spec import RunSpec
from hpcsched.core.protocol.serialize import (
    SerializationError,
    dumps,
    loads_function,
    loads_object,
    serialize,
)
from hpcsched.core.worker import checkpoint
from hpcsched.core.worker.context import current, hook_dask
from hpcsched.core.worker.tasks import output


class RemoteError(Exception):
    """Stands in for an exception that could not be pickled on the worker."""

    def __init__(self, typename: str, message: str):
        super().__init__(f"{typename}: {message}")
        self.typename = typename


def run_spec_call(run_spec: RunSpec, data: Mapping) -> Any:
    """Run a task's spec; with a checkpoint (:mod:`.checkpoint`) the result is kept in its
    file, or, with ``load``, read from there instead of running."""
    return load_call(run_spec, data)()


def load_call(run_spec: RunSpec, data: Mapping) -> Callable[[], Any]:
    """The task's run, its function and arguments unpickled: call it to run the task
    (:func:`run_spec_call`)."""
    kept = run_spec.checkpoint
    if kept is None:
        return _load(run_spec, data)
    if kept.load:
        return partial(checkpoint.load, kept.path, kept.key)
    call = _load(run_spec, data)

    def run_and_keep() -> Any:
        value = call()
        checkpoint.save(kept.path, kept.key, value)
        return value

    return run_and_keep


def _load(run_spec: RunSpec, data: Mapping) -> Callable[[], Any]:
    func_blob, args_blob = run_spec.function, run_spec.args
    args: Any
    kwargs: Any
    if args_blob is None:
        args, kwargs = (), {}
    else:
        args, kwargs = loads_object(args_blob)
    if run_spec.evaluate:
        args = evaluate(args, data)
        kwargs = evaluate(kwargs, data) if kwargs else kwargs
    if func_blob is None:  # a literal value or an alias
        return partial(_identity, args[0])
    func = loads_function(func_blob)
    hook_dask()  # the function may have brought dask in: its .compute() goes to the cluster
    return partial(func, *args, **kwargs)


def _identity(value: Any) -> Any:
    return value


def pack_exception(exc: BaseException, tb: Any) -> tuple[Any, str, str]:
    """(Serialized exception, traceback text, one-line description); raised by a task
    this thread runs, the exception carries the last lines the task printed as a note."""
    running = current()
    if running is not None:
        output.annotate(exc, running.key)
    text = f"{type(exc).__name__}: {exc}"
    tb_text = "".join(tb_mod.format_exception(type(exc), exc, tb))
    try:
        packed = serialize(exc)
    except SerializationError:
        packed = serialize(RemoteError(type(exc).__name__, str(exc)))
    return packed, tb_text, text


def serialization_errors(values: dict, where: str) -> dict:
    """Per key of ``values`` whose value cannot be serialized: its packed exception (see
    :func:`pack_exception`), with a note naming the key and ``where`` it was."""
    errors: dict = {}
    for key, value in values.items():
        try:
            dumps(value, main_by_value=True)
        except SerializationError as e:
            cause = e.__cause__ if e.__cause__ is not None else e
            add_note = getattr(cause, "add_note", None)  # Python >= 3.11 (PEP 678)
            if add_note is not None:
                add_note(f"(raised while serializing the result of {key!r} to send it "
                         f"from worker {where})")
            errors[key] = pack_exception(cause, cause.__traceback__)
    return errors
