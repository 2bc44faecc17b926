"""The one place where objects become bytes and back.

* ``dumps(obj) -> frames``: ``frames[0]`` is a pickle (protocol 5) stream, the
  rest are out-of-band buffers (numpy arrays, bytes-like objects wrapped in
  :class:`pickle.PickleBuffer`) that travel as separate frames with no copy.
  Buffers smaller than :data:`INLINE_LIMIT` stay in band: many tiny frames cost
  more than a small copy. Objects plain pickle refuses (lambdas, closures,
  functions of ``__main__``) are retried with cloudpickle.
* ``loads(frames)``: the inverse; received buffers back the arrays (no copy).
* Functions of tasks are cloudpickled once and cached on both ends
  (``dumps_function`` / ``loads_function``): a ``map`` over 10,000 items
  pickles its function once.
* :class:`Serialized` holds user data as frames. A server that only relays data
  (the scheduler between a worker and a client) never unpickles it, and frames
  inside a message stay out of band when the message itself is pickled.
"""

from __future__ import annotations

import functools
import pickle
import sys
import weakref
from collections.abc import Sequence
from typing import Any

import cloudpickle

INLINE_LIMIT = 4096
Frame = bytes | bytearray | memoryview


class SerializationError(TypeError):
    """An object could not be pickled (names the object) or unpickled."""


def _describe(obj: Any) -> str:
    r = repr(obj)
    if len(r) > 80:
        r = r[:77] + "..."
    return f"{type(obj).__module__}.{type(obj).__qualname__} {r}"


def dumps(obj: Any, main_by_value: bool = False) -> list[Frame]:
    """``obj`` as ``[pickle stream, *out-of-band buffers]``.

    ``main_by_value``: user data from the client's process, where classes of the user's
    script are ``__main__.X`` and would pickle by reference: send those by value. Not for
    messages (their task blobs mention ``__main__`` without needing it).
    """
    buffers: list[Frame] = []

    def callback(buf: pickle.PickleBuffer) -> bool | None:
        raw = buf.raw()
        if raw.nbytes < INLINE_LIMIT:
            return True  # serialize in band
        buffers.append(raw)
        return None

    try:
        head = pickle.dumps(obj, protocol=5, buffer_callback=callback)
        if main_by_value and b"__main__" in head:
            # a class or function of the user's script, pickled by reference: the other
            # side has a different __main__, so send it by value
            raise pickle.PicklingError("refers to __main__")
    except Exception:
        buffers.clear()
        try:
            head = cloudpickle.dumps(obj, protocol=5, buffer_callback=callback)
        except Exception as e:
            raise SerializationError(f"cannot serialize {_describe(obj)}: {e}") from e
    return [head, *buffers]


def loads(frames: Sequence[Frame]) -> Any:
    try:
        return pickle.loads(frames[0], buffers=frames[1:])
    except Exception as e:
        raise SerializationError(f"cannot deserialize a message of {len(frames)} frames: {e!r}") from e


def frames_nbytes(frames: Sequence[Frame]) -> int:
    return sum(memoryview(f).nbytes for f in frames)


# ---------------------------------------------------------------- functions
_fn_cache: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()


def dumps_function(func: Any) -> bytes:
    """cloudpickle ``func`` (by value if it lives in ``__main__``), cached per function."""
    try:
        cached = _fn_cache.get(func)
    except TypeError:  # unhashable / not weak-referenceable callables
        cached = None
    if cached is not None:
        return cached
    try:
        out = cloudpickle.dumps(func, protocol=5)
    except Exception as e:
        raise SerializationError(f"cannot serialize function {_describe(func)}: {e}") from e
    try:
        _fn_cache[func] = out
    except TypeError:
        pass
    return out


@functools.lru_cache(maxsize=1024)
def loads_function(blob: bytes) -> Any:
    try:
        return pickle.loads(blob)
    except Exception as e:
        raise SerializationError(f"cannot deserialize a task's function: {e!r}") from e


def dumps_object(obj: Any) -> bytes:
    """cloudpickle ``obj`` in band (task arguments): names the culprit on failure."""
    try:
        out = pickle.dumps(obj, protocol=5)
        if b"__main__" not in out:  # else: the script's classes must travel by value
            return out
    except Exception:
        pass
    try:
        return cloudpickle.dumps(obj, protocol=5)
    except Exception as e:
        raise SerializationError(f"cannot serialize {_describe(obj)}: {e}") from e


def loads_object(blob: bytes) -> Any:
    try:
        return pickle.loads(blob)
    except Exception as e:
        raise SerializationError(f"cannot deserialize task arguments: {e!r}") from e


# ---------------------------------------------------------------- opaque data
class Serialized:
    """User data as frames, relayed without being unpickled."""

    __slots__ = ("frames",)

    def __init__(self, frames: list[Frame]):
        self.frames = frames

    @property
    def nbytes(self) -> int:
        return frames_nbytes(self.frames)

    def __reduce__(self):  # keep frames out of band inside an enclosing pickle
        return (_rebuild_serialized, tuple(pickle.PickleBuffer(f) for f in self.frames))

    def __repr__(self) -> str:
        return f"<Serialized {len(self.frames)} frames, {self.nbytes} bytes>"


def _rebuild_serialized(*frames: Frame) -> Serialized:
    return Serialized(list(frames))


def serialize(obj: Any) -> Serialized:
    return Serialized(dumps(obj, main_by_value=True))


def deserialize(obj: Any) -> Any:
    return loads(obj.frames) if isinstance(obj, Serialized) else obj


# ---------------------------------------------------------------- sizes
def sizeof(obj: Any) -> int:
    """Estimated bytes held by ``obj`` (numpy-aware, cheap, shallow for containers)."""
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, memoryview):
        return obj.nbytes
    if isinstance(obj, (list, tuple, set, frozenset)):
        n = len(obj)
        if n == 0:
            return sys.getsizeof(obj)
        sample = list(obj)[:10] if not isinstance(obj, (list, tuple)) else obj[:10]
        return sys.getsizeof(obj) + int(sum(sizeof(x) for x in sample) * n / len(sample))
    if isinstance(obj, dict):
        n = len(obj)
        if n == 0:
            return sys.getsizeof(obj)
        items = list(obj.items())[:10]
        return sys.getsizeof(obj) + int(
            sum(sizeof(k) + sizeof(v) for k, v in items) * n / len(items)
        )
    try:
        return sys.getsizeof(obj)
    except Exception:
        return 64
