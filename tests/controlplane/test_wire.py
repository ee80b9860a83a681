"""The wire contract: generated code is fresh; arrays round-trip and reject bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from controlplane.wire import generate
from controlplane.wire import moeplane_pb2 as pb
from controlplane.wire.arrays import WireError, decode_array, encode_array


def test_generated_code_matches_the_proto(tmp_path):
    for path in generate.generate(tmp_path):
        committed = generate.WIRE_DIR / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed.name} is stale: run `make proto`"
        )


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64"])
def test_arrays_round_trip_little_endian(dtype):
    arr = (np.arange(58 * 256).reshape(58, 256) % 97).astype(dtype)
    msg = encode_array(arr.astype(np.dtype(dtype).newbyteorder(">")))  # big-endian in, LE on wire
    assert msg.data == arr.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    out = decode_array(pb.NDArray.FromString(msg.SerializeToString()), "x")
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize(
    "msg,kwargs,needle",
    [
        (pb.NDArray(dtype="complex64", shape=[1], data=b"\0" * 8), {}, "x.dtype"),
        (pb.NDArray(dtype="int64", shape=[2, 2], data=b"\0" * 8), {}, "x.data"),
        (pb.NDArray(dtype="int64", shape=[-1], data=b""), {}, "x.shape"),
        (pb.NDArray(dtype="int64", shape=[2], data=b"\0" * 16), {"ndim": 2}, "x.shape"),
        (encode_array(np.array([1.0, np.nan])), {}, "NaN"),
        (encode_array(np.array([-1])), {"nonnegative": True}, "negative"),
        (encode_array(np.array([1.0])), {"kinds": "i"}, "x.dtype"),
    ],
)
def test_decode_rejects_with_field_name(msg, kwargs, needle):
    with pytest.raises(WireError) as info:
        decode_array(msg, "x", **kwargs)
    assert needle in str(info.value)


def test_proto_lives_beside_generated_code():
    assert Path(generate.PROTO).exists()
