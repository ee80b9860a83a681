"""Group-limited placement: each group's replicas on one node, at least as balanced as EPLB's
hierarchical policy."""

from __future__ import annotations

import numpy as np
import pytest

from harness.traces import drifting_trace
from moeplane.controlplane.balancing import balancedness, count_moves, plan_placement
from moeplane.controlplane.balancing.groups import eplb_hierarchical, node_of_group


def _nodes_of_groups(phy2log, gpus, spg, nodes, groups, experts):
    """For each layer and group, the set of nodes holding any of its replicas."""
    node = (np.arange(phy2log.shape[1]) // spg) // (gpus // nodes)
    group = phy2log // (experts // groups)
    return [[set(node[group[lay] == g].tolist()) for g in range(groups)]
            for lay in range(phy2log.shape[0])]


@pytest.mark.parametrize("gpus,spg,nodes,groups,experts", [
    (16, 5, 4, 8, 64), (8, 9, 2, 4, 64), (32, 9, 4, 8, 256),
])
def test_each_group_on_one_node_and_no_less_balanced_than_eplb_hierarchical(
        gpus, spg, nodes, groups, experts):
    layers = 6
    loads = drifting_trace(1, layers, experts, tokens_per_layer=gpus * 4096 * 8, seed=gpus)[0]
    plan = plan_placement(loads, gpus=gpus, slots_per_gpu=spg, nodes=nodes, groups=groups)
    where = _nodes_of_groups(plan.phy2log, gpus, spg, nodes, groups, experts)
    assert all(len(s) == 1 for row in where for s in row)
    per_node = [[next(iter(s)) for s in row] for row in where]
    assert all(np.bincount(r, minlength=nodes).tolist() == [groups // nodes] * nodes
               for r in per_node)
    ref = eplb_hierarchical(loads, gpus, spg, nodes, groups)
    assert all(len(s) == 1 for row in _nodes_of_groups(ref, gpus, spg, nodes, groups, experts)
               for s in row)
    assert plan.balancedness_after <= balancedness(loads, ref, gpus) + 1e-12
    # without groups the planner may do better still, never the other way round by much
    free = plan_placement(loads, gpus=gpus, slots_per_gpu=spg, nodes=nodes)
    assert free.balancedness_after <= plan.balancedness_after + 1e-9


def test_an_incremental_plan_keeps_the_groups_on_their_nodes_and_moves_little():
    gpus, spg, nodes, groups, experts, layers = 16, 5, 4, 8, 64, 4
    trace = drifting_trace(60, layers, experts, tokens_per_layer=gpus * 4096 * 8, seed=3,
                           drift=0.05)
    first = plan_placement(trace[:10].mean(axis=0), gpus=gpus, slots_per_gpu=spg, nodes=nodes,
                           groups=groups).phy2log
    later = trace[50:].mean(axis=0)
    plan = plan_placement(later, gpus=gpus, slots_per_gpu=spg, nodes=nodes, groups=groups,
                          current=first)
    assert plan.incremental and plan.balancedness_after < plan.balancedness_before
    assert _nodes_of_groups(plan.phy2log, gpus, spg, nodes, groups, experts) == \
        _nodes_of_groups(first, gpus, spg, nodes, groups, experts)  # every group stays put
    fresh = plan_placement(later, gpus=gpus, slots_per_gpu=spg, nodes=nodes, groups=groups)
    assert plan.moves < count_moves(first, fresh.phy2log, gpus, experts).sum()


def test_groups_go_heaviest_first_to_the_lightest_node():
    loads = np.array([[9.0, 9.0, 1.0, 1.0, 5.0, 5.0, 4.0, 4.0]])  # 4 groups of 2: 18, 2, 10, 8
    assert node_of_group(loads, 4, 2).tolist() == [[0, 0, 1, 1]]


@pytest.mark.parametrize("kw,match", [
    (dict(groups=3), "groups = 3 does not divide the 16 experts"),
    (dict(groups=2, nodes=4), "groups = 2 is not a multiple of nodes = 4"),
    (dict(groups=4, nodes=2, current=np.tile(np.arange(16), (2, 1)), max_moves=3),
     "groups: max_moves is not supported"),
    (dict(groups=0), "groups must be >= 1"),
])
def test_bad_groups_raise_naming_groups(kw, match):
    with pytest.raises(ValueError, match=match):
        plan_placement(np.ones((2, 16)), gpus=4, slots_per_gpu=4, **kw)
