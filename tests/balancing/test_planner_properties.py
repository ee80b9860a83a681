"""Invariants of plan_placement on random inputs (hypothesis)."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeplane.controlplane.balancing import (
    balancedness,
    count_moves,
    eplb_greedy,
    gpu_expert_counts,
    gpu_loads,
    plan_placement,
    replica_counts,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw):
    layers = draw(st.integers(1, 4))
    experts = draw(st.integers(1, 12))
    nodes = draw(st.sampled_from([1, 2]))
    gpus = nodes * draw(st.integers(1, 3))
    slots = draw(st.integers(-(-experts // gpus), -(-experts // gpus) + 2))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    skew = draw(st.sampled_from([0.0, 0.5, 2.0]))
    loads = rng.lognormal(0.0, skew, size=(layers, experts)) * 100
    if draw(st.booleans()):
        loads = np.round(loads).astype(np.int64)  # integer token counts, zeros possible
    n = gpus * slots
    current = np.stack([rng.permutation(np.arange(n) % experts) for _ in range(layers)])
    return loads, gpus, slots, nodes, current.astype(np.int64)


def check_plan(plan, loads, gpus, slots, reference):
    layers, experts = loads.shape
    assert plan.phy2log.shape == (layers, gpus * slots)
    assert plan.phy2log.dtype == np.int64
    counts = replica_counts(plan.phy2log, experts)
    assert (counts >= 1).all()  # every logical expert keeps a replica
    assert (counts.sum(axis=1) == gpus * slots).all()
    np.testing.assert_array_equal(plan.replica_counts, counts)
    # predicted loads conserve the tokens of each layer
    np.testing.assert_allclose(plan.gpu_loads.sum(axis=1), loads.sum(axis=1), rtol=1e-9)
    np.testing.assert_allclose(plan.gpu_loads, gpu_loads(loads, plan.phy2log, gpus))
    assert plan.balancedness_after == balancedness(loads, plan.phy2log, gpus)
    assert plan.balancedness_before == balancedness(loads, reference, gpus)
    moves = count_moves(reference, plan.phy2log, gpus, experts)
    np.testing.assert_array_equal(plan.moves_per_layer, moves)
    assert plan.moves == moves.sum() == len(plan.transfers)
    # each transfer: a new (gpu, expert) pair, from a GPU that held the expert
    had = gpu_expert_counts(reference, gpus, experts) > 0
    for layer, slot, expert, src in plan.transfers:
        assert plan.phy2log[layer, slot] == expert
        assert not had[layer, slot // slots, expert]
        assert had[layer, src, expert]
    per_node = gpus // plan.nodes
    same = plan.transfers[:, 3] // per_node == plan.transfers[:, 1] // slots // per_node
    np.testing.assert_array_equal(plan.cross_node, ~same)
    assert plan.cross_node_moves == int((~same).sum())
    for (layer, slot, expert, _), cross in zip(plan.transfers, plan.cross_node, strict=True):
        node = slot // slots // per_node
        on_node = had[layer, node * per_node : (node + 1) * per_node, expert].any()
        assert cross == (not on_node)  # a same-node source is taken whenever one exists


@SETTINGS
@given(problems())
def test_fresh_plan_invariants_and_no_worse_than_eplb(problem):
    loads, gpus, slots, nodes, _ = problem
    plan = plan_placement(loads, gpus=gpus, slots_per_gpu=slots, nodes=nodes)
    identity = np.tile(np.arange(gpus * slots) % loads.shape[1], (loads.shape[0], 1))
    check_plan(plan, loads, gpus, slots, identity)
    eplb = balancedness(loads, eplb_greedy(loads, gpus, slots), gpus)
    assert plan.balancedness_after <= eplb + 1e-12


@SETTINGS
@given(problems())
def test_incremental_plan_invariants_and_determinism(problem):
    loads, gpus, slots, nodes, current = problem
    kwargs = dict(gpus=gpus, slots_per_gpu=slots, nodes=nodes, current=current)
    plan = plan_placement(loads, **kwargs)
    check_plan(plan, loads, gpus, slots, current)
    again = plan_placement(loads.copy(), **kwargs)
    np.testing.assert_array_equal(plan.phy2log, again.phy2log)
    np.testing.assert_array_equal(plan.transfers, again.transfers)
    assert plan.balancedness_after <= plan.balancedness_before + 1e-12


@SETTINGS
@given(problems(), st.integers(0, 30), st.integers(0, 30))
def test_budget_is_respected_and_more_budget_is_never_worse(problem, k1, k2):
    loads, gpus, slots, nodes, current = problem
    small, large = sorted((k1, k2))
    kwargs = dict(gpus=gpus, slots_per_gpu=slots, nodes=nodes, current=current)
    p_small = plan_placement(loads, max_moves=small, **kwargs)
    p_large = plan_placement(loads, max_moves=large, **kwargs)
    check_plan(p_small, loads, gpus, slots, current)
    assert p_small.moves <= small
    assert p_large.moves <= large
    assert p_large.balancedness_after <= p_small.balancedness_after + 1e-12
    assert p_small.balancedness_after <= p_small.balancedness_before + 1e-12
    if small == 0:  # only free changes (replicas re-pointed within a GPU's own experts)
        assert p_small.moves == 0
