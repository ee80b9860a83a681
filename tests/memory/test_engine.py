"""decide_offload: verdicts, host sharing, determinism and errors that name the argument."""

from __future__ import annotations

import dataclasses

import pytest

from moeplane.controlplane.memory import (
    ActionKind,
    AppliedAction,
    InputError,
    NodeMemory,
    Verdict,
    WatermarkPolicy,
    decide_offload,
)
from moeplane.controlplane.memory.model import build_profile
from moeplane.controlplane.memory.search import recompute_everything, swap_everything
from tests.memory.helpers import GB, device, layer, uniform

POLICY = WatermarkPolicy(high_watermark=0.8, low_watermark=0.5)


def one(dev, free_host=100 * GB, policy=POLICY):
    [decision] = decide_offload([dev], [NodeMemory(dev.node_id, free_host)], policy)
    return decision


def test_over_the_high_watermark_applies_actions_that_bring_the_peak_under_it():
    dev = device(uniform(8), capacity=16 * GB)  # demand 8*(1+0.5+0.5) = 16 GB
    d = one(dev)
    assert d.verdict is Verdict.APPLY
    assert d.peak_now_bytes == 16 * GB
    assert d.peak_after_bytes <= d.high_watermark_bytes == int(0.8 * 16 * GB)
    assert d.actions and d.undo == ()
    assert d.overhead_s == pytest.approx(sum(a.overhead_s for a in d.actions))
    assert d.host_bytes == sum(a.host_bytes for a in d.actions)


def test_free_hidden_swaps_are_preferred_over_recomputation():
    # 1 GB at 100 GB/s = 10 ms, hidden under the next layer's 10 ms forward / 20 ms backward
    dev = device(uniform(8), capacity=16 * GB, bandwidth=100 * GB)
    d = one(dev)
    assert d.verdict is Verdict.APPLY
    assert d.overhead_s == 0.0
    assert {a.kind for a in d.actions} <= {ActionKind.SWAP_ACTIVATIONS,
                                           ActionKind.OFFLOAD_OPTIMIZER}


def test_slow_link_makes_recomputation_the_cheaper_choice():
    dev = device(uniform(8, opt=0), capacity=12 * GB, bandwidth=GB)  # 1 s per swap
    d = one(dev)
    assert d.verdict is Verdict.APPLY
    assert [a.kind for a in d.actions] == [ActionKind.RECOMPUTE]


def test_never_worse_than_the_everything_baselines_when_they_fit():
    for bandwidth in (GB, 10 * GB, 100 * GB):
        dev = device(uniform(10), capacity=20 * GB, bandwidth=bandwidth)
        d = one(dev)
        profile = build_profile(dev, 0)
        for baseline in (recompute_everything(profile), swap_everything(profile)):
            if baseline.peak() <= d.high_watermark_bytes:
                assert d.overhead_s <= baseline.overhead() + 1e-12


def test_between_the_watermarks_keeps_what_is_applied():
    applied = (AppliedAction(ActionKind.RECOMPUTE, "l0"),)
    dev = device(uniform(4, opt=0), capacity=7 * GB, used=int(4.6 * GB), applied=applied)
    d = one(dev)
    assert d.verdict is Verdict.KEEP
    assert d.undo == ()
    assert [(a.kind, a.layers) for a in d.actions] == [(ActionKind.RECOMPUTE, ("l0",))]


def test_under_the_low_watermark_undoes_actions_no_longer_needed():
    applied = (AppliedAction(ActionKind.RECOMPUTE, "l0"), AppliedAction(ActionKind.RECOMPUTE, "l1"))
    dev = device(uniform(4, opt=0), capacity=20 * GB, used=4 * GB, applied=applied)
    d = one(dev)
    assert d.verdict is Verdict.RELAX
    assert set(d.undo) == set(applied)
    assert d.actions == ()
    assert d.peak_after_bytes <= d.high_watermark_bytes


def test_under_the_low_watermark_with_nothing_applied_suggests_a_larger_micro_batch():
    dev = device(uniform(4, opt=0, params=0), capacity=20 * GB, micro_batch_size=4)
    d = one(dev)  # 4 GB of activations, high = 16 GB: activations may grow 4x
    assert d.verdict is Verdict.RELAX
    assert d.micro_batch_factor == pytest.approx(4.0)
    assert d.suggested_micro_batch_size == 16
    assert "micro-batch 4 -> 16" in d.reason


def test_device_that_cannot_get_under_the_watermark_says_why():
    big_params = [layer(f"l{i}", GB, params=4 * GB) for i in range(3)]  # 24 GB fixed
    d = one(device(big_params, capacity=30 * GB, used=28 * GB))
    assert d.verdict is Verdict.CANNOT_MEET
    assert d.actions == ()
    assert "device memory" in d.reason and str(d.high_watermark_bytes) in d.reason


def test_no_host_memory_left_falls_back_to_recomputation_when_that_is_enough():
    dev = device(uniform(8, opt=0), capacity=12 * GB, bandwidth=100 * GB)
    d = one(dev, free_host=0)
    assert d.verdict is Verdict.APPLY
    assert d.host_bytes == 0
    assert [a.kind for a in d.actions] == [ActionKind.RECOMPUTE]


def test_no_host_memory_left_and_recomputation_not_enough_cannot_meet():
    # activations recompute down to their inputs only; optimizer state must go to the host
    layers = [layer(f"l{i}", GB, opt=3 * GB, inp=GB // 2) for i in range(4)]
    dev = device(layers, capacity=17 * GB)
    assert one(dev, free_host=100 * GB).verdict is Verdict.APPLY
    d = one(dev, free_host=0)
    assert d.verdict is Verdict.CANNOT_MEET
    assert "host memory" in d.reason and "'n0'" in d.reason


def test_devices_of_a_node_share_its_host_memory():
    devs = [device(uniform(8), capacity=16 * GB, device_id=f"d{i}", bandwidth=100 * GB)
            for i in range(4)]
    free = 6 * GB  # alone each would take more
    alone = one(devs[0])
    assert alone.host_bytes > free // 4
    decisions = decide_offload(devs, [NodeMemory("n0", free)], POLICY)
    assert sum(d.host_bytes for d in decisions) <= free
    for d in decisions:
        assert d.verdict is Verdict.APPLY
        assert d.peak_after_bytes <= d.high_watermark_bytes


def test_host_memory_held_by_applied_actions_counts_as_available():
    applied = tuple(AppliedAction(ActionKind.SWAP_ACTIVATIONS, f"l{i}") for i in range(4))
    dev = device(uniform(8, opt=0), capacity=10 * GB, used=4 * GB + 2 * GB, applied=applied,
                 bandwidth=100 * GB)
    profile = build_profile(dev, 0)
    held = sum(profile.act[:4])
    d = one(dev, free_host=0, policy=WatermarkPolicy(0.7, 0.1))
    assert d.verdict is Verdict.APPLY
    assert d.host_bytes <= held


def test_decisions_are_deterministic_and_in_input_order():
    devs = [device(uniform(6), capacity=12 * GB, device_id=f"d{i}") for i in (3, 1, 2)]
    nodes = [NodeMemory("n0", 5 * GB)]
    first = decide_offload(devs, nodes, POLICY)
    assert [d.device_id for d in first] == ["d3", "d1", "d2"]
    assert decide_offload(devs, nodes, POLICY) == first


@pytest.mark.parametrize(
    ("mutate", "argument"),
    [
        (lambda d: dataclasses.replace(d, capacity_bytes=-1), "devices[0].capacity_bytes"),
        (lambda d: dataclasses.replace(d, used_bytes=-5), "devices[0].used_bytes"),
        (lambda d: dataclasses.replace(d, used_bytes=d.capacity_bytes + 1), "devices[0].used_bytes"),
        (lambda d: dataclasses.replace(d, layers=(dataclasses.replace(d.layers[0], activation_bytes=-1),) + d.layers[1:]),
         "devices[0].layers[0].activation_bytes"),
        (lambda d: dataclasses.replace(d, layers=(dataclasses.replace(d.layers[0], forward_s=float("nan")),) + d.layers[1:]),
         "devices[0].layers[0].forward_s"),
        (lambda d: dataclasses.replace(d, capacity_bytes=GB, used_bytes=GB), "devices[0].layers"),
        (lambda d: dataclasses.replace(d, applied=(AppliedAction(ActionKind.RECOMPUTE, "nope"),)),
         "devices[0].applied[0]"),
        (lambda d: dataclasses.replace(d, applied=(AppliedAction(ActionKind.RECOMPUTE, "l0"),
                                                    AppliedAction(ActionKind.SWAP_ACTIVATIONS, "l0"))),
         "devices[0].applied[1]"),
        (lambda d: dataclasses.replace(d, node_id="elsewhere"), "devices[0].node_id"),
        (lambda d: dataclasses.replace(d, host_bandwidth_bytes_per_s=0), "devices[0].host_bandwidth_bytes_per_s"),
        (lambda d: dataclasses.replace(d, layers=()), "devices[0].layers"),
        (lambda d: dataclasses.replace(d, micro_batch_size=0), "devices[0].micro_batch_size"),
    ],
)
def test_bad_device_input_names_the_argument(mutate, argument):
    dev = mutate(device(uniform(4), capacity=16 * GB))
    with pytest.raises(InputError) as info:
        decide_offload([dev], [NodeMemory("n0", GB)], POLICY)
    assert info.value.argument == argument
    assert str(info.value).startswith(argument + ":")
    assert isinstance(info.value, ValueError)


def test_bad_node_and_policy_input_names_the_argument():
    dev = device(uniform(4), capacity=16 * GB)
    with pytest.raises(InputError, match=r"^nodes\[0\]\.free_host_bytes:"):
        decide_offload([dev], [NodeMemory("n0", -1)], POLICY)
    with pytest.raises(InputError, match=r"^nodes\[1\]\.node_id: duplicate"):
        decide_offload([dev], [NodeMemory("n0", 1), NodeMemory("n0", 2)], POLICY)
    with pytest.raises(InputError, match=r"^policy\.low_watermark:"):
        decide_offload([dev], [NodeMemory("n0", 1)], WatermarkPolicy(0.5, 0.6))
    with pytest.raises(InputError, match=r"^policy\.high_watermark:"):
        decide_offload([dev], [NodeMemory("n0", 1)], WatermarkPolicy(1.5, 0.6))
    with pytest.raises(InputError, match=r"^devices\[1\]\.device_id: duplicate"):
        decide_offload([dev, dev], [NodeMemory("n0", 1)], POLICY)


def test_a_breakdown_larger_than_capacity_is_rejected_even_when_used_fits():
    dev = device(uniform(4), capacity=7 * GB, used=7 * GB)  # layers need 8 GB
    with pytest.raises(InputError, match=r"^devices\[0\]\.layers: the breakdown needs 8000000000"):
        one(dev)


def test_memory_the_breakdown_does_not_explain_is_carried_into_the_prediction():
    applied = (AppliedAction(ActionKind.RECOMPUTE, "l0"),)
    dev = device(uniform(4, opt=0), capacity=7 * GB, used=int(5.5 * GB), applied=applied)
    d = one(dev)  # the layers explain 5.05 GB with l0 recomputed; 0.45 GB is unexplained
    assert d.verdict is Verdict.KEEP
    assert d.peak_now_bytes == d.peak_after_bytes == int(5.5 * GB)
    d = one(dataclasses.replace(dev, used_bytes=6 * GB), policy=WatermarkPolicy(0.8, 0.5))
    assert d.verdict is Verdict.APPLY  # 6 GB > 5.6 GB
    assert d.peak_after_bytes <= d.high_watermark_bytes
