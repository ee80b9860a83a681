"""The cost model against an independent step simulation and hand-computed costs."""

from __future__ import annotations

import itertools

import pytest

from moeplane.controlplane.memory.model import NONE, RECOMPUTE, SWAP, Plan, build_profile
from tests.memory.helpers import GB, device, layer


def simulate_peak(plan: Plan) -> int:
    """Walk a step event by event and track bytes on the device (independent of Plan.peak)."""
    p = plan.p
    n = p.size
    on_device = p.fixed_bytes + sum(p.opt[j] for j in range(n) if not plan.offload[j])
    peak = on_device
    kept = [0] * n
    # forward: layer i produces act[i]; a swapped layer's copy is in flight during i+1
    for i in range(n):
        on_device += p.act[i]
        peak = max(peak, on_device)
        if i > 0 and plan.choice[i - 1] == SWAP:
            on_device -= p.act[i - 1]  # copy of i-1 finished while i ran
            kept[i - 1] = 0
        if plan.choice[i] == RECOMPUTE:
            on_device -= p.act[i] - p.inp[i]
            kept[i] = p.inp[i]
        elif plan.choice[i] == SWAP:
            kept[i] = p.act[i]  # still on device until the copy finishes
        else:
            kept[i] = p.act[i]
    if n and plan.choice[n - 1] == SWAP:
        on_device -= p.act[n - 1]
        kept[n - 1] = 0
    # backward from the top
    for k in range(n - 1, -1, -1):
        if plan.choice[k] == SWAP:
            if k == n - 1:
                on_device += p.act[k]  # fetched back at once (no window)
        elif plan.choice[k] == RECOMPUTE:
            on_device += p.act[k] - p.inp[k]
        if k > 0 and plan.choice[k - 1] == SWAP:
            on_device += p.act[k - 1]  # prefetch of the layer below during k's backward
        peak = max(peak, on_device)
        on_device -= p.act[k]  # layer k's activations are freed after its backward
        if plan.offload[k]:
            on_device += p.opt[k]  # its optimizer state comes back once its grads are ready
    return max(peak, on_device)


def all_plans(profile):
    n = profile.size
    for choices in itertools.product((NONE, SWAP, RECOMPUTE), repeat=n):
        for offload in itertools.product((False, True), repeat=n):
            plan = Plan(profile)
            for i in range(n):
                plan.set_choice(i, choices[i])
                plan.set_offload(i, offload[i])
            yield plan


def test_peak_matches_an_event_by_event_simulation_for_every_plan():
    layers = [layer("a", 7 * GB, 3 * GB, inp=GB), layer("b", 5 * GB, 11 * GB, inp=2 * GB),
              layer("c", 2 * GB, 1 * GB), layer("d", 9 * GB, 4 * GB, inp=GB)]
    profile = build_profile(device(layers, 100 * GB), other_bytes=3 * GB)
    for plan in all_plans(profile):
        assert plan.peak() == simulate_peak(plan), (plan.choice, plan.offload)


def test_no_action_peak_is_everything_at_once():
    layers = [layer("a", 7 * GB, 3 * GB, params=GB), layer("b", 5 * GB, 2 * GB, params=GB)]
    profile = build_profile(device(layers, 100 * GB), other_bytes=GB)
    assert Plan(profile).peak() == GB + 4 * GB + 5 * GB + 12 * GB
    assert Plan(profile).overhead() == 0.0


def test_swap_hidden_under_the_next_layers_compute_costs_nothing():
    # 1 GB at 10 GB/s = 0.1 s; the layer above runs 0.1 s forward and 0.2 s backward
    layers = [layer("a", GB, fwd=0.1, bwd=0.2), layer("b", GB, fwd=0.1, bwd=0.2)]
    plan = Plan(build_profile(device(layers, 100 * GB, bandwidth=10 * GB), 0))
    plan.set_choice(0, SWAP)
    assert plan.overhead() == 0.0
    assert plan.host == GB


def test_swap_pays_only_the_transfer_time_beyond_the_window():
    layers = [layer("a", 3 * GB, fwd=0.1, bwd=0.2), layer("b", GB, fwd=0.1, bwd=0.2)]
    plan = Plan(build_profile(device(layers, 100 * GB, bandwidth=10 * GB), 0))
    plan.set_choice(0, SWAP)  # 0.3 s each way: 0.2 s exposed forward, 0.1 s backward
    assert plan.overhead() == pytest.approx(0.3)


def test_top_layer_swap_is_fully_exposed_and_saves_no_peak():
    layers = [layer("a", GB), layer("b", 2 * GB)]
    plan = Plan(build_profile(device(layers, 100 * GB, bandwidth=10 * GB), 0))
    before = plan.peak()
    plan.set_choice(1, SWAP)
    assert plan.overhead() == pytest.approx(0.4)
    assert plan.peak() == before


def test_recompute_costs_its_forward_time_and_keeps_its_input():
    layers = [layer("a", 4 * GB, fwd=0.25, inp=GB), layer("b", GB), layer("c", 4 * GB)]
    plan = Plan(build_profile(device(layers, 100 * GB), 0))
    assert plan.peak() == 9 * GB
    plan.set_choice(0, RECOMPUTE)
    assert plan.overhead() == pytest.approx(0.25)
    assert plan.peak() == GB + GB + 4 * GB  # input of a, b, c in full at c's backward
    assert plan.host == 0


def test_optimizer_offload_is_free_until_the_link_is_busy():
    # 1 GB each way at 10 GB/s = 0.1 s; forward total 0.2 s, backward 0.4 s: hidden
    layers = [layer("a", GB, opt=GB, fwd=0.1, bwd=0.2), layer("b", GB, fwd=0.1, bwd=0.2)]
    plan = Plan(build_profile(device(layers, 100 * GB, bandwidth=10 * GB), 0))
    plan.set_offload(0, True)
    assert plan.overhead() == 0.0
    # 5 GB: 0.5 s each way, 0.3 s exposed in forward, 0.1 s in backward
    layers = [layer("a", GB, opt=5 * GB, fwd=0.1, bwd=0.2), layer("b", GB, fwd=0.1, bwd=0.2)]
    plan = Plan(build_profile(device(layers, 100 * GB, bandwidth=10 * GB), 0))
    plan.set_offload(0, True)
    assert plan.overhead() == pytest.approx(0.4)
