"""The planner on a drifted, skewed layer set: balance reached and moves spent."""

import numpy as np

from moeplane.controlplane.balancing import balancedness, eplb_greedy, plan_placement


def drifted(layers=8, experts=64, gpus=8, slots=10, seed=3):
    rng = np.random.default_rng(seed)
    theta = rng.normal(0, 1.0, size=(layers, experts))
    old = np.exp(theta) * 1e4
    new = np.exp(theta + rng.normal(0, 0.1, size=theta.shape)) * 1e4
    return old, new, gpus, slots


def test_incremental_plan_gets_near_fresh_balance_with_few_moves():
    old, new, gpus, slots = drifted()
    current = eplb_greedy(old, gpus, slots)
    fresh_eplb = balancedness(new, eplb_greedy(new, gpus, slots), gpus)
    plan = plan_placement(new, gpus=gpus, slots_per_gpu=slots, current=current)
    assert plan.balancedness_before > fresh_eplb + 0.02  # the drift did unbalance it
    assert plan.balancedness_after <= fresh_eplb + 0.01
    assert plan.moves <= 0.10 * current.size


def test_budget_buys_balance_where_it_is_cheapest():
    old, new, gpus, slots = drifted()
    current = eplb_greedy(old, gpus, slots)
    budget = int(0.03 * current.size)
    plan = plan_placement(new, gpus=gpus, slots_per_gpu=slots, current=current, max_moves=budget)
    assert 0 < plan.moves <= budget
    assert plan.balancedness_after < plan.balancedness_before


def test_prefers_sources_on_the_same_node():
    old, new, gpus, slots = drifted(gpus=8)
    current = eplb_greedy(old, gpus, slots)
    one = plan_placement(new, gpus=gpus, slots_per_gpu=slots, nodes=4, current=current,
                         cross_node_weight=0.0)
    aware = plan_placement(new, gpus=gpus, slots_per_gpu=slots, nodes=4, current=current)
    assert aware.cross_node_moves <= one.cross_node_moves
    assert aware.balancedness_after <= balancedness(new, eplb_greedy(new, gpus, slots), gpus) + 0.01
