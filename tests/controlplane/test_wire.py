"""The wire contract: generated code is fresh; arrays round-trip and reject bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moeplane.controlplane.wire import generate
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError, decode_array, encode_array
from moeplane.controlplane.wire.plan_codec import PlanReceiver, UnknownBase, delta_plan, full_plan


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


# ---------------------------------------------------------------- PlacementPlan: narrow dtypes, deltas


def _placement(layers: int, experts: int, slots: int, seed: int = 0) -> np.ndarray:
    """A valid [L, slots] placement: every expert once per layer, the rest random replicas."""
    rng = np.random.default_rng(seed)
    rows = [rng.permutation(np.concatenate([np.arange(experts), rng.integers(0, experts, slots - experts)]))
            for _ in range(layers)]
    return np.stack(rows).astype(np.int64)


@pytest.mark.parametrize("experts,slots,dtype", [(256, 1024, "uint8"), (257, 512, "uint16"),
                                                 (300, 600, "uint16"), (70_000, 70_000, "int32")])
def test_full_plan_phy2log_travels_in_the_smallest_dtype_holding_e_minus_1(experts, slots, dtype):
    from moeplane.controlplane.wire.plan_codec import plan_message

    phy2log = _placement(2, experts, slots)
    plan = pb.PlacementPlan.FromString(plan_message(
        {"job_id": "j", "epoch": 3, "phy2log": phy2log, "slots_per_rank": slots // 2}, 7))
    assert plan.phy2log.dtype == dtype and plan.base_epoch == 0
    assert len(plan.phy2log.data) == phy2log.size * np.dtype(dtype).itemsize
    got = PlanReceiver().receive(plan)
    assert got.dtype == dtype and got.flags.writeable
    np.testing.assert_array_equal(got, phy2log)


def test_delta_costs_the_changed_slots_and_rebuilds_the_full_placement():
    base = _placement(58, 256, 1024, seed=1)
    new = base.copy()
    rng = np.random.default_rng(2)
    flat = rng.choice(base.size, size=base.size // 20, replace=False)  # 5% of the slots
    new.reshape(-1)[flat] = (new.reshape(-1)[flat] + 1) % 256
    full1 = full_plan("j", 4, base, 4, 0)
    full2 = full_plan("j", 5, new, 4, 9)
    delta = delta_plan(full2, new, 4, base)
    assert delta.base_epoch == 4 and not delta.HasField("phy2log")
    assert delta.changed_slots.dtype == "uint16" and delta.changed_experts.dtype == "uint8"
    assert delta.ByteSize() < full2.ByteSize() // 3  # 5% of slots at 3 bytes vs 1 byte each
    rx = PlanReceiver()
    np.testing.assert_array_equal(rx.receive(pb.PlacementPlan.FromString(full1.SerializeToString())), base)
    got = rx.receive(pb.PlacementPlan.FromString(delta.SerializeToString()))
    np.testing.assert_array_equal(got, new)
    assert (rx.epoch, rx.job_id) == (5, "j")
    # the next delta builds on the rebuilt plan
    again = delta_plan(full_plan("j", 6, base, 4, 0), base, 5, new)
    np.testing.assert_array_equal(rx.receive(again), base)


def test_delta_against_a_base_the_receiver_lacks_names_base_epoch_and_keeps_the_base():
    a, b = _placement(2, 8, 16, seed=3), _placement(2, 8, 16, seed=4)
    delta = delta_plan(full_plan("j", 9, b, 4, 0), b, 7, a)
    with pytest.raises(UnknownBase, match="base_epoch 7.*holds no plan"):
        PlanReceiver().receive(delta)
    rx = PlanReceiver()
    rx.receive(full_plan("j", 6, a, 4, 0))
    with pytest.raises(UnknownBase, match="base_epoch 7.*holds epoch 6"):
        rx.receive(delta)
    assert rx.epoch == 6
    np.testing.assert_array_equal(rx.phy2log, a)


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.changed_slots.CopyFrom(encode_array(np.array([5, 3], np.int32))), "strictly increasing"),
    (lambda d: d.changed_slots.CopyFrom(encode_array(np.array([3, 32], np.int32))), "outside [0, 32)"),
    (lambda d: d.changed_slots.CopyFrom(encode_array(np.array([-1, 3], np.int32))), "outside [0, 32)"),
    (lambda d: d.changed_experts.CopyFrom(encode_array(np.array([1], np.int32))), "changed_experts.shape"),
    (lambda d: d.changed_slots.CopyFrom(encode_array(np.array([1.0, 2.0]))), "changed_slots.dtype"),
    (lambda d: setattr(d, "slots_per_rank", 2), "slots per rank"),
])
def test_malformed_delta_is_refused_naming_the_field(mutate, needle):
    a = _placement(2, 8, 16, seed=5)
    b = a.copy()
    b[0, 3], b[1, 0] = (b[0, 3] + 1) % 8, (b[1, 0] + 1) % 8
    rx = PlanReceiver()
    rx.receive(full_plan("j", 1, a, 4, 0))
    delta = delta_plan(full_plan("j", 2, b, 4, 0), b, 1, a)
    mutate(delta)
    with pytest.raises(WireError, match=needle.replace("[", r"\[").replace(")", r"\)")):
        rx.receive(delta)
    assert rx.epoch == 1
