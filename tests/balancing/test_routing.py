"""Per-step replica routing: exact token counts, close to the LP optimum, clear errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from harness.routing_lp import lp_optimum
from harness.traces import drifting_trace
from moeplane.controlplane.balancing import (
    gpu_loads,
    layer_balancedness,
    plan_placement,
    route_replicas,
    route_with,
    routed_balancedness,
    routing_table,
)
from moeplane.controlplane.balancing.routing import RoutingTable, tile_table


def _per_expert(slot_tokens: np.ndarray, phy2log: np.ndarray, experts: int) -> np.ndarray:
    layers = phy2log.shape[0]
    key = np.arange(layers)[:, None] * experts + phy2log
    out = np.bincount(key.ravel(), weights=slot_tokens.ravel(), minlength=layers * experts)
    return out.reshape(layers, experts).astype(np.int64)


def _random_placement(rng, layers, experts, gpus, spg):
    rows = []
    for _ in range(layers):
        extra = rng.integers(0, experts, size=gpus * spg - experts)
        rows.append(rng.permutation(np.concatenate([np.arange(experts), extra])))
    return np.array(rows, dtype=np.int64)


def _hall_bound(loads, row, gpus):
    """max over GPU sets R of (tokens of experts held only inside R) / |R|: by max-flow
    min-cut, the LP optimum of the max GPU load (brute force, small ``gpus`` only)."""
    spg = row.size // gpus
    holders = [frozenset(int(q) // spg for q in np.flatnonzero(row == e)) for e in range(loads.size)]
    best = 0.0
    for size in range(1, gpus + 1):
        for subset in itertools.combinations(range(gpus), size):
            inside = set(subset)
            total = sum(float(loads[e]) for e in range(loads.size) if holders[e] <= inside)
            best = max(best, total / size)
    return best


def test_lp_reference_matches_the_cut_bound_on_small_cases():
    rng = np.random.default_rng(3)
    for _ in range(12):
        p = _random_placement(rng, 1, 8, 4, 3)
        loads = rng.integers(0, 1000, size=8)
        assert lp_optimum(loads, p[0], 4) == pytest.approx(_hall_bound(loads, p[0], 4), rel=1e-8)


@pytest.mark.parametrize("gpus,spg,experts", [(4, 3, 8), (8, 5, 32), (6, 4, 6), (8, 2, 16)])
def test_slot_tokens_sum_exactly_to_each_experts_load(gpus, spg, experts):
    rng = np.random.default_rng(gpus * 100 + spg)
    p = _random_placement(rng, 5, experts, gpus, spg)
    loads = rng.integers(0, 5000, size=(5, experts))
    loads[0, :3] = 0
    st = route_replicas(loads, p, gpus=gpus)
    assert st.dtype == np.int64 and st.shape == p.shape
    assert (st >= 0).all()
    np.testing.assert_array_equal(_per_expert(st, p, experts), loads)


def test_an_expert_with_one_holder_keeps_all_its_tokens_on_its_gpu():
    p = np.array([[0, 1, 2, 2, 3, 0]])  # 3 GPUs x 2 slots; expert 2 twice on GPU 1
    loads = np.array([[100, 7, 11, 5]])
    st = route_replicas(loads, p, gpus=3)
    assert st[0, 1] == 7 and st[0, 4] == 5
    assert sorted(st[0, 2:4].tolist()) == [5, 6]  # one GPU's slots share its tokens evenly
    # expert 0 on GPUs 0 and 2: GPU 0 also has 7, GPU 2 has 5 -> 49 + 7 == 51 + 5
    assert st[0, 0] + 7 == st[0, 5] + 5


def test_within_one_percent_of_the_lp_optimum_on_planned_placements():
    experts, gpus, spg, layers = 64, 8, 10, 3
    trace = drifting_trace(30, layers, experts, tokens_per_layer=40_000, seed=5)
    p = plan_placement(trace[:20].mean(axis=0), gpus=gpus, slots_per_gpu=spg).phy2log
    for t in (22, 29):
        step = np.round(trace[t]).astype(np.int64)
        st = route_replicas(step, p, gpus=gpus)
        routed = st.reshape(layers, gpus, spg).sum(axis=2).max(axis=1)
        even = gpu_loads(step, p, gpus).max(axis=1)
        opt = np.array([lp_optimum(step[lay], p[lay], gpus) for lay in range(layers)])
        assert (routed <= opt * 1.01).all(), routed / opt
        assert routed.sum() < even.sum()  # the even split is what routing improves on


def test_within_one_percent_on_random_placements_and_never_worse_than_even():
    rng = np.random.default_rng(11)
    for _ in range(4):
        p = _random_placement(rng, 2, 24, 6, 6)
        loads = rng.integers(500, 20_000, size=(2, 24))
        st = route_replicas(loads, p, gpus=6)
        routed = st.reshape(2, 6, 6).sum(axis=2).max(axis=1)
        opt = np.array([lp_optimum(loads[lay], p[lay], 6) for lay in range(2)])
        even = gpu_loads(loads, p, 6).max(axis=1)
        assert (routed <= opt * 1.01 + 6).all(), routed / opt  # + rounding, a token a slot
        assert (routed <= even + 6).all()


def test_the_table_is_reusable_and_the_result_deterministic():
    rng = np.random.default_rng(2)
    p = _random_placement(rng, 3, 16, 4, 6)
    table = routing_table(p, gpus=4, num_experts=16)
    for _ in range(3):
        loads = rng.integers(0, 900, size=(3, 16))
        np.testing.assert_array_equal(route_with(table, loads), route_replicas(loads, p, gpus=4))


def test_the_cached_table_follows_the_placement_not_the_array():
    """``route_replicas`` keeps tables by the placement's contents: the same array changed in
    place, or another GPU count, gets its own table; a changed-back one its cached one."""
    rng = np.random.default_rng(4)
    p = _random_placement(rng, 3, 16, 4, 6)
    loads = rng.integers(0, 900, size=(3, 16))
    first = route_replicas(loads, p, gpus=4)
    np.testing.assert_array_equal(first, route_with(routing_table(p, gpus=4, num_experts=16), loads))
    p[:, [0, -1]] = p[:, [-1, 0]]  # the same array, another placement (a slot of GPU 0 and 3)
    moved = route_replicas(loads, p, gpus=4)
    assert (moved != first).any()
    np.testing.assert_array_equal(moved, route_with(routing_table(p, gpus=4, num_experts=16), loads))
    np.testing.assert_array_equal(route_replicas(loads, p, gpus=2),
                                  route_with(routing_table(p, gpus=2, num_experts=16), loads))
    p[:, [0, -1]] = p[:, [-1, 0]]
    np.testing.assert_array_equal(route_replicas(loads, p, gpus=4), first)


def test_a_tiled_table_is_the_table_of_the_tiled_placement():
    """``tile_table`` (``routed_balancedness``'s steps as layers) builds, without a sort, the
    arrays ``routing_table`` builds from the tiled placement: replicas of width 2 and 4."""
    rng = np.random.default_rng(5)
    for layers, experts, gpus, spg in ((3, 16, 4, 6), (2, 8, 8, 1), (2, 6, 3, 3)):
        p = _random_placement(rng, layers, experts, gpus, spg)
        table = routing_table(p, gpus=gpus, num_experts=experts)
        for copies in (1, 2, 5):
            tiled = tile_table(table, copies)
            want = routing_table(np.tile(p, (copies, 1)), gpus=gpus, num_experts=experts)
            for name in RoutingTable.__dataclass_fields__:
                got, exp = getattr(tiled, name), getattr(want, name)
                if isinstance(exp, np.ndarray):
                    assert got.dtype == exp.dtype, name
                    np.testing.assert_array_equal(got, exp, err_msg=name)
                else:
                    assert got == exp, name


@pytest.mark.parametrize(
    "loads,phy2log,gpus,match",
    [
        (np.ones((2, 4, 1), np.int64), np.zeros((2, 4), np.int64), 2, "loads must have shape"),
        (np.ones((2, 4)), np.tile(np.arange(4), (2, 1)), 2, "loads must be an integer"),
        (-np.ones((2, 4), np.int64), np.tile(np.arange(4), (2, 1)), 2, "loads must be non-neg"),
        (np.ones((2, 4), np.int64), np.tile(np.arange(4), (3, 1)), 2, "phy2log must have shape"),
        (np.ones((2, 4), np.int64), np.tile(np.arange(6), (2, 1)) % 4 + 1, 2, "phy2log holds"),
        (np.ones((2, 4), np.int64), np.tile([0, 1, 2, 2], (2, 1)), 2, "phy2log leaves"),
        (np.ones((2, 4), np.int64), np.tile(np.arange(6) % 4, (2, 1)), 4, "multiple of gpus"),
        (np.ones((2, 4), np.int64), np.tile(np.arange(4), (2, 1)), 0, "gpus must be"),
        (np.ones((2, 4), np.int64), np.tile(np.arange(4.0), (2, 1)), 2, "phy2log must be an int"),
    ],
)
def test_bad_input_raises_naming_the_argument(loads, phy2log, gpus, match):
    with pytest.raises(ValueError, match=match):
        route_replicas(loads, phy2log, gpus=gpus)


def test_routed_balancedness_is_the_per_step_balancedness_of_routed_tokens():
    experts, gpus, spg = 32, 8, 5
    trace = np.round(drifting_trace(12, 2, experts, tokens_per_layer=4000, seed=8))
    p = plan_placement(trace[:8].mean(axis=0), gpus=gpus, slots_per_gpu=spg).phy2log
    got = routed_balancedness(trace, p, gpus=gpus)
    assert got.shape == (12, 2)
    for t in (0, 7, 11):
        per_gpu = route_replicas(trace[t].astype(np.int64), p, gpus=gpus).reshape(2, gpus, -1)
        np.testing.assert_allclose(got[t], layer_balancedness(per_gpu.sum(axis=2)))
    # the balancedness of the window's mean promises more than the steps deliver
    of_mean = routed_balancedness(trace.mean(axis=0)[None], p, gpus=gpus).mean()
    assert got.mean() > of_mean + 0.01


def test_routed_balancedness_refuses_a_placement_of_other_layers():
    with pytest.raises(ValueError, match="phy2log must have shape"):
        routed_balancedness(np.ones((3, 2, 4)), np.tile(np.arange(4), (3, 1)), gpus=2)
