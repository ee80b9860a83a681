"""The repair search (``search="repair"``, the default): its recorded states are exact, its
plans keep the planner's invariants, and it needs fewer moves than the relieve search on a
drifted simulator workload."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeplane.agents.sim.workload import ExpertLoadModel, WorkloadSpec
from moeplane.controlplane.balancing import (
    count_moves,
    eplb_greedy,
    gpu_loads,
    layer_balancedness,
    plan_placement,
)
from moeplane.controlplane.balancing.repair import repair_search
from tests.balancing.test_planner_properties import check_plan, problems

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sim_trace(steps, layers, experts, gpus, top_k, seed):
    """The simulator's workload (what ``moeplane simulate`` runs), defaults otherwise:
    float64 ``[steps, layers, experts]`` tokens summed over the ``gpus`` ranks."""
    model = ExpertLoadModel(WorkloadSpec(layers, experts, top_k, gpus), seed=seed)
    return np.stack([model.step().sum(axis=0) for _ in range(steps)]).astype(np.float64)


def _drifted(layers=6, experts=64, gpus=16, slots=5, seed=0):
    rng = np.random.default_rng(seed)
    old = rng.lognormal(0.0, 1.0, size=(layers, experts)) * 1000
    new = old * rng.lognormal(0.0, 0.5, size=old.shape)
    return old, new, eplb_greedy(old, gpus, slots)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.sampled_from([(8, 5, 1), (16, 5, 2), (8, 9, 4)]))
def test_every_recorded_state_is_the_placement_it_names(seed, layout):
    gpus, slots, nodes = layout
    old, new, cur = _drifted(layers=3, experts=gpus * slots - 8, gpus=gpus, slots=slots,
                             seed=seed)
    fresh = layer_balancedness(gpu_loads(new, eplb_greedy(new, gpus, slots), gpus))
    traj = repair_search(
        new, cur, gpus, reference=cur, levels=fresh + 0.01,
        node_of_gpu=np.arange(gpus) // (gpus // nodes), cross_weight=0.5, max_rounds=200,
    )
    assert len(traj.steps) > 0
    for layer, steps, moves, bal in traj.points:
        take = np.zeros(new.shape[0], dtype=np.int64)
        take[int(layer)] = int(steps)
        phy = traj.placement(take)
        lay = int(layer)
        got_bal = layer_balancedness(gpu_loads(new, phy, gpus))[lay]
        got_moves = count_moves(cur, phy, gpus, new.shape[1])[lay]
        assert got_moves == moves
        assert got_bal == pytest.approx(bal, rel=1e-12)


@SETTINGS
@given(problems())
def test_repair_plans_keep_the_invariants(problem):
    loads, gpus, slots, nodes, current = problem
    plan = plan_placement(loads, gpus=gpus, slots_per_gpu=slots, nodes=nodes,
                          current=current, search="repair")
    check_plan(plan, loads, gpus, slots, current)
    again = plan_placement(loads, gpus=gpus, slots_per_gpu=slots, nodes=nodes,
                           current=current, search="repair")
    np.testing.assert_array_equal(plan.phy2log, again.phy2log)


def test_repair_is_the_default_and_needs_fewer_moves_than_relieve():
    gpus, slots = 32, 5
    trace = _sim_trace(70, 8, 128, gpus, 8, seed=1)
    old, new = trace[:20].mean(axis=0), trace[50:70].mean(axis=0)
    cur = eplb_greedy(old, gpus, slots)
    goal = layer_balancedness(gpu_loads(new, eplb_greedy(new, gpus, slots), gpus)).mean() + 0.01
    default = plan_placement(new, gpus=gpus, slots_per_gpu=slots, nodes=4, current=cur)
    repair = plan_placement(new, gpus=gpus, slots_per_gpu=slots, nodes=4, current=cur,
                            search="repair")
    relieve = plan_placement(new, gpus=gpus, slots_per_gpu=slots, nodes=4, current=cur,
                             search="relieve")
    np.testing.assert_array_equal(default.phy2log, repair.phy2log)
    assert repair.balancedness_after <= goal + 1e-12
    assert relieve.balancedness_after <= goal + 1e-12
    assert repair.moves < relieve.moves


def test_an_unknown_search_is_refused_by_name():
    loads = np.ones((1, 4))
    with pytest.raises(ValueError, match="search must be one of repair, relieve, got 'fast'"):
        plan_placement(loads, gpus=2, slots_per_gpu=2, current=np.zeros((1, 4), np.int64) +
                       np.arange(4) % 4, search="fast")


def test_counting_gpus_over_the_level_saves_moves(monkeypatch):
    """The potential's per-GPU count term (``_COUNT_WEIGHT``) buys fewer moves for the same
    goal than the excess alone, on a drifted simulator workload."""
    from moeplane.controlplane.balancing import repair

    gpus, slots = 32, 5
    trace = _sim_trace(70, 8, 128, gpus, 8, seed=1)
    old, new = trace[:20].mean(axis=0), trace[50:70].mean(axis=0)
    cur = eplb_greedy(old, gpus, slots)
    goal = layer_balancedness(gpu_loads(new, eplb_greedy(new, gpus, slots), gpus)).mean() + 0.01

    def plan():
        return plan_placement(new, gpus=gpus, slots_per_gpu=slots, nodes=4, current=cur,
                              search="repair")

    counted = plan()
    monkeypatch.setattr(repair, "_COUNT_WEIGHT", 0.0)
    excess_only = plan()
    assert counted.balancedness_after <= goal + 1e-12
    assert excess_only.balancedness_after <= goal + 1e-12
    assert counted.moves < excess_only.moves


@SETTINGS
@given(st.integers(0, 2**32 - 1))
def test_a_layer_stops_once_its_rounds_no_longer_lower_its_excess(seed):
    """Every round after a layer falls back to the excess alone lowers its excess, so no
    layer runs to ``max_rounds`` re-doing the same steps."""
    gpus, slots = 8, 5
    old, new, cur = _drifted(layers=3, experts=gpus * slots - 8, gpus=gpus, slots=slots,
                             seed=seed)
    fresh = layer_balancedness(gpu_loads(new, eplb_greedy(new, gpus, slots), gpus))
    traj = repair_search(new, cur, gpus, reference=cur, levels=fresh + 0.01,
                         max_rounds=10_000)
    steps_per_layer = np.bincount(traj.steps[:, 0].astype(np.int64), minlength=3)
    assert steps_per_layer.max() < 8 * gpus * slots  # far fewer than the rounds allowed
