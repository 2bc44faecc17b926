"""serialize: frames with out-of-band buffers, cloudpickle fallback, Serialized relays."""

from __future__ import annotations

import functools
import pickle
import threading

import numpy as np
import pytest

from hpcsched.core.protocol import serialize
from hpcsched.core.protocol.serialize import (
    INLINE_LIMIT,
    SerializationError,
    Serialized,
    dumps,
    dumps_function,
    loads,
    loads_function,
)


def _owner(arr: np.ndarray):
    x = arr
    while isinstance(x, np.ndarray) and x.base is not None:
        x = x.base
    return x.obj if isinstance(x, memoryview) else x


@pytest.mark.parametrize("obj", [
    None, 1, 2.5, "text", b"bytes", [1, "a", None], {"op": "compute-task", "key": ("x", 0)},
    (1, (2, (3,))), {1, 2, 3}, frozenset({"a"}), 10**40, float("inf"),
])
def test_plain_objects_round_trip_in_one_frame(obj):
    frames = dumps(obj)
    assert len(frames) == 1
    assert loads(frames) == obj


def test_large_array_travels_out_of_band_without_copy():
    arr = np.arange(100_000, dtype="f8")
    frames = dumps({"x": arr})
    assert len(frames) == 2
    assert memoryview(frames[1]).nbytes == arr.nbytes
    # the frame is the array's own memory, not a copy
    assert np.shares_memory(np.frombuffer(frames[1], dtype="f8"), arr)
    assert len(frames[0]) < 1000  # the pickle stream holds only the metadata
    back = loads(frames)["x"]
    np.testing.assert_array_equal(back, arr)
    assert np.shares_memory(back, arr)  # loads put the array on top of the given frame


def test_received_frames_back_the_arrays():
    arr = np.random.default_rng(1).random((300, 40))
    frames = dumps(arr)
    received = [bytes(frames[0]), bytearray(frames[1])]  # what a transport hands to loads
    back = loads(received)
    np.testing.assert_array_equal(back, arr)
    assert _owner(back) is received[1]
    assert back.flags.writeable and not back.flags.owndata


@pytest.mark.parametrize("arr", [
    np.asfortranarray(np.arange(20_000, dtype="i4").reshape(100, 200)),
    np.arange(10_000, dtype="u2")[::2],  # not contiguous: pickled in band (numpy copies)
    np.zeros((0, 5)),
    np.array(["a", "bc"] * 2000),
])
def test_array_layouts_round_trip(arr):
    back = loads(dumps(arr))
    np.testing.assert_array_equal(back, arr)
    assert back.dtype == arr.dtype and back.shape == arr.shape
    if arr.flags.f_contiguous and not arr.flags.c_contiguous:
        assert back.flags.f_contiguous  # Fortran order survives the out-of-band trip


def test_small_buffers_stay_inline():
    small = np.arange(INLINE_LIMIT // 8 - 1, dtype="f8")  # just under the limit
    assert len(dumps(small)) == 1
    big = np.arange(INLINE_LIMIT // 8, dtype="f8")  # exactly the limit: out of band
    assert len(dumps(big)) == 2
    many = [np.arange(10) for _ in range(100)]
    frames = dumps(many)
    assert len(frames) == 1
    assert all((a == b).all() for a, b in zip(loads(frames), many, strict=True))


def test_pickle_buffers_go_out_of_band_plain_bytes_in_band():
    raw = b"z" * 100_000
    frames = dumps({"blob": pickle.PickleBuffer(raw)})
    assert len(frames) == 2 and memoryview(frames[1]).obj is raw  # the caller's bytes, uncopied
    assert bytes(loads(frames)["blob"]) == raw
    # pickle writes bytes and bytearray into the stream itself (documented in serialize)
    assert len(dumps(raw)) == 1
    assert loads(dumps(bytearray(raw))) == bytearray(raw)


def test_lambdas_and_closures_fall_back_to_cloudpickle():
    k = 7
    add_k = lambda x: x + k  # noqa: E731

    def outer(n):
        def inner(x):
            return x * n + k
        return inner

    assert loads(dumps(add_k))(1) == 8
    assert loads(dumps({"f": outer(3), "data": np.arange(10_000)}))["f"](2) == 13
    with pytest.raises(Exception):  # noqa: B017 - plain pickle really refuses it
        pickle.dumps(add_k)


def test_unpicklable_object_raises_naming_the_type():
    with pytest.raises(SerializationError, match="lock") as info:
        dumps({"op": "bad", "guard": threading.Lock()})
    assert "builtins.dict" in str(info.value)  # names what was being serialized
    with pytest.raises(SerializationError, match="lock"):
        serialize.dumps_object([threading.Lock()])


def test_garbage_frames_raise_serialization_error():
    with pytest.raises(SerializationError, match="cannot deserialize a message of 1 frames"):
        loads([b"this is not a pickle"])
    frames = dumps(np.arange(10_000))
    with pytest.raises(SerializationError):
        loads(frames[:1])  # the out-of-band frame is missing


def test_serialized_keeps_frames_out_of_band_inside_a_message():
    arr = np.arange(50_000, dtype="f8")
    data = serialize.serialize(arr)
    assert len(data.frames) == 2 and data.nbytes > arr.nbytes
    msg = {"op": "task-finished", "key": "x", "data": data}
    frames = dumps(msg)
    assert len(frames) == 2  # the relayed pickle stream inline, the array out of band
    assert np.shares_memory(np.frombuffer(frames[1], dtype="f8"), arr)
    back = loads([frames[0], bytearray(frames[1])])
    assert isinstance(back["data"], Serialized)
    np.testing.assert_array_equal(serialize.deserialize(back["data"]), arr)
    assert serialize.deserialize(5) == 5  # plain objects pass through
    assert "2 frames" in repr(data)


def test_serialized_with_a_large_head_and_in_band_pickling():
    obj = {"words": [f"w{i}" for i in range(5000)], "arr": np.ones(10_000)}
    data = serialize.serialize(obj)
    assert len(data.frames[0]) > INLINE_LIMIT
    frames = dumps([data])
    assert len(frames) == 3  # both of its frames stay out of band
    again = loads(frames)[0]
    assert serialize.deserialize(again)["words"][-1] == "w4999"
    # dumps_object pickles everything in band: still a faithful copy
    inband = serialize.loads_object(serialize.dumps_object(data))
    np.testing.assert_array_equal(serialize.deserialize(inband)["arr"], obj["arr"])


def test_dumps_function_caches_per_function():
    def square(x):
        return x * x

    blob = dumps_function(square)
    assert dumps_function(square) is blob  # the cached bytes, not a second pickling
    assert loads_function(blob)(4) == 16
    assert loads_function(blob) is loads_function(blob)
    other = dumps_function(lambda x: x + 1)
    assert other != blob and loads_function(other)(1) == 2
    part = functools.partial(pow, 2)  # not weak-referenceable: works, just uncached
    assert loads_function(dumps_function(part))(5) == 32
    with pytest.raises(SerializationError, match="lock"):
        dumps_function(threading.Lock())
    with pytest.raises(SerializationError, match="task's function"):
        loads_function(b"garbage")


def test_sizeof_estimates():
    assert serialize.sizeof(np.zeros(1000)) == 8000
    assert serialize.sizeof(b"x" * 100) == 100
    assert serialize.sizeof(memoryview(bytearray(64))) == 64
    assert serialize.sizeof([b"x" * 1000] * 100) >= 100_000
    assert serialize.sizeof({i: b"y" * 100 for i in range(50)}) >= 5000
    assert serialize.sizeof([]) > 0 and serialize.sizeof({}) > 0
    assert serialize.sizeof(object()) > 0
    assert serialize.frames_nbytes([b"ab", bytearray(3), memoryview(b"defg")]) == 9
