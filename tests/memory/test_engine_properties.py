"""Properties of decide_offload on random profiles (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from moeplane.controlplane.memory import (
    ActionKind,
    AppliedAction,
    DeviceMemory,
    InputError,
    LayerMemory,
    NodeMemory,
    Verdict,
    WatermarkPolicy,
    decide_offload,
)
from moeplane.controlplane.memory.model import build_profile, plan_from_applied
from moeplane.controlplane.memory.search import recompute_everything, swap_everything

MB = 10**6


@st.composite
def layers(draw, n):
    out = []
    for i in range(n):
        act = draw(st.integers(0, 4000)) * MB
        out.append(LayerMemory(
            name=f"l{i}",
            parameter_bytes=draw(st.integers(0, 1000)) * MB,
            gradient_bytes=draw(st.integers(0, 1000)) * MB,
            optimizer_bytes=draw(st.integers(0, 3000)) * MB,
            activation_bytes=act,
            forward_s=draw(st.floats(0, 0.05)),
            backward_s=draw(st.floats(0, 0.1)),
            input_bytes=draw(st.integers(0, act // MB)) * MB,
        ))
    return tuple(out)


@st.composite
def devices(draw, device_id, node_id):
    ls = draw(layers(draw(st.integers(1, 7))))
    demand = sum(x.parameter_bytes + x.gradient_bytes + x.optimizer_bytes + x.activation_bytes
                 for x in ls)
    fill = draw(st.floats(0.3, 1.0))
    capacity = max(1, int(demand / fill))
    applied = []
    for x in ls:
        pick = draw(st.sampled_from(["", "swap", "recompute"]))
        if pick == "swap":
            applied.append(AppliedAction(ActionKind.SWAP_ACTIVATIONS, x.name))
        elif pick == "recompute":
            applied.append(AppliedAction(ActionKind.RECOMPUTE, x.name))
        if draw(st.booleans()):
            applied.append(AppliedAction(ActionKind.OFFLOAD_OPTIMIZER, x.name))
    used = draw(st.integers(0, capacity))
    return DeviceMemory(device_id=device_id, node_id=node_id, capacity_bytes=capacity,
                        used_bytes=used, layers=ls,
                        host_bandwidth_bytes_per_s=draw(st.floats(1e9, 1e11)),
                        applied=tuple(applied),
                        micro_batch_size=draw(st.none() | st.integers(1, 8)))


@st.composite
def clusters(draw):
    nodes, devs = [], []
    for n in range(draw(st.integers(1, 2))):
        nodes.append(NodeMemory(f"n{n}", draw(st.integers(0, 20_000)) * MB))
        for i in range(draw(st.integers(1, 3))):
            devs.append(draw(devices(f"n{n}/d{i}", f"n{n}")))
    high = draw(st.floats(0.3, 1.0))
    low = draw(st.floats(0.05, 0.95)) * high
    return devs, nodes, WatermarkPolicy(high, low)


def _held(dev):
    return plan_from_applied(build_profile(dev, 0), dev.applied).host


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_every_decision_meets_the_watermark_or_says_why_and_host_is_never_exceeded(cluster):
    devs, nodes, policy = cluster
    try:
        decisions = decide_offload(devs, nodes, policy)
    except InputError as exc:
        # the only rejection these inputs can earn: applied actions that do not fit capacity
        assert exc.argument.endswith(".layers") and "more than capacity_bytes" in str(exc)
        return
    assert [d.device_id for d in decisions] == [d.device_id for d in devs]
    for d in decisions:
        event(d.verdict.value)
        if d.verdict is Verdict.CANNOT_MEET:
            assert d.reason and d.actions == ()
            assert d.peak_now_bytes > d.high_watermark_bytes
        else:
            assert d.peak_after_bytes <= d.high_watermark_bytes
            assert d.overhead_s >= 0
    for node in nodes:
        mine = [(d, x) for d, x in zip(decisions, devs, strict=True) if x.node_id == node.node_id]
        budget = node.free_host_bytes + sum(_held(x) for _, x in mine)
        assert sum(d.host_bytes for d, _ in mine) <= budget


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(devices("d0", "n0"), st.integers(0, 30_000), st.floats(0.3, 1.0))
def test_never_worse_than_a_feasible_everything_baseline(dev, free_mb, high):
    dev = DeviceMemory(**{**dev.__dict__, "applied": ()})
    node = NodeMemory("n0", free_mb * MB)
    [d] = decide_offload([dev], [node], WatermarkPolicy(high, high / 2))
    event(d.verdict.value)
    if d.verdict is not Verdict.APPLY:
        return
    bare = build_profile(dev, 0)
    profile = build_profile(dev, max(0, dev.used_bytes - plan_from_applied(bare, ()).peak()))
    for baseline in (recompute_everything(profile), swap_everything(profile)):
        if baseline.peak() <= d.high_watermark_bytes and baseline.host <= node.free_host_bytes:
            assert d.overhead_s <= baseline.overhead() + 1e-9
