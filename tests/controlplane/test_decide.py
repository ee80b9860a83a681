"""The rebalancing decision, pure: injected clock, recorded-style inputs."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.controlplane.balancing import expected_balancedness, routed_balancedness
from moeplane.controlplane.balancing.placement import identity_placement
from moeplane.controlplane.balancing.prediction import measured_steps
from moeplane.controlplane.controller.decide import Action, decide, ema, migration_stall_s
from moeplane.controlplane.domain.rebalance_policy import RebalancePolicy

L, E, G, S = 4, 16, 4, 4


def skewed(seed=0, hot=3.0):
    rng = np.random.default_rng(seed)
    loads = rng.uniform(50, 150, size=(L, E))
    loads[:, :4] *= hot  # experts 0..3 all sit on rank 0 under the identity placement
    return loads


def args(**over):
    loads = skewed()
    cur = identity_placement(L, E, G * (S))
    base = dict(
        recent_balancedness=np.array([1.8, 1.8, 1.8]), predicted=loads, current=cur, world_size=G,
        slots_per_rank=S, nodes=2, step_time_s=1.0, now=1000.0, last_plan_at=None,
        policy=RebalancePolicy(sustain_steps=3, min_interval_s=60, horizon_steps=100, expert_bytes=10**6),
    )
    return base | over


def test_rebalances_a_sustained_imbalance_and_improves_it():
    d = decide(**args())
    assert d.action == Action.REBALANCE, d.reason
    assert d.predicted_after < d.predicted_before
    assert d.phy2log.shape == (L, G * S) and d.moves > 0
    assert d.gain_s > d.cost_s


def test_the_policy_chooses_the_planner_search():
    seen = []

    def planner(*a, search, **kw):
        seen.append(search)
        from moeplane.controlplane.balancing import plan_placement

        return plan_placement(*a, search=search, **kw)

    pol = RebalancePolicy(sustain_steps=3, min_interval_s=60, horizon_steps=100,
                          expert_bytes=10**6, search="repair")
    d = decide(**args(policy=pol), planner=planner)
    assert seen == ["repair"]
    assert d.action == Action.REBALANCE, d.reason
    assert RebalancePolicy.from_json(pol.to_json()).search == "repair"


def test_holds_within_the_min_interval_then_acts():
    assert decide(**args(last_plan_at=990.0)).action == Action.HOLD
    assert decide(**args(last_plan_at=900.0)).action == Action.REBALANCE


def test_holds_when_imbalance_is_not_sustained():
    d = decide(**args(recent_balancedness=np.array([1.8, 1.05, 1.8])))
    assert d.action == Action.HOLD and "not above" in d.reason
    assert decide(**args(recent_balancedness=np.array([1.8]))).action == Action.HOLD


def test_holds_when_migration_costs_more_than_it_saves():
    slow = RebalancePolicy(sustain_steps=3, horizon_steps=1, expert_bytes=10**12, cross_node_bytes_per_s=1e9)
    d = decide(**args(policy=slow))
    assert d.action == Action.HOLD and "stall" in d.reason and d.cost_s > d.gain_s


def test_layers_with_too_little_gain_keep_their_placement():
    loads = skewed()
    loads[2] = 100.0  # layer 2 is already perfectly balanced
    d = decide(**args(predicted=loads))
    assert d.action == Action.REBALANCE
    assert 2 not in d.layers
    np.testing.assert_array_equal(d.phy2log[2], identity_placement(L, E, G * (S))[2])


def test_stall_is_the_busiest_destination_rank():
    pol = RebalancePolicy(expert_bytes=100, intra_node_bytes_per_s=100, cross_node_bytes_per_s=10)
    transfers = np.array([[0, 0, 5, 1], [0, 1, 6, 2], [1, 4, 7, 0]])  # two copies to rank 0 (S=4)
    cross = np.array([False, True, False])
    assert migration_stall_s(transfers, cross, 4, 2, pol) == pytest.approx(1 + 10)


def test_ema_weights_recent_steps():
    w = np.stack([np.zeros((1, 2)), np.ones((1, 2))])
    np.testing.assert_allclose(ema(w, alpha=0.3), 0.3)


@pytest.mark.parametrize(
    "bad,field",
    [({"mode": "sometimes"}, "mode"), ({"imbalance_threshold": 0.5}, "imbalance_threshold"),
     ({"min_interval_s": -1}, "min_interval_s"), ({"colour": 1}, "colour"),
     ({"search": "fast"}, "search")],
)
def test_policy_validation_names_the_setting(bad, field):
    with pytest.raises(ValueError, match=field):
        RebalancePolicy.from_dict(bad)


def test_predictions_and_the_gain_are_out_of_sample_on_a_drifting_window():
    rng = np.random.default_rng(5)
    walk = np.exp(np.cumsum(rng.normal(0, 0.08, size=(12, L, E)), axis=0))  # fast drift
    window = skewed() * walk
    policy = args()["policy"]
    d = decide(**args(predicted=ema(window), window=window))
    assert d.action == Action.REBALANCE, d.reason
    # the pushed placement's figure is the out-of-sample estimate over the steps it will be
    # measured on, above what it scores on the steps it was fitted to
    ahead = measured_steps(policy.min_interval_s, 1.0)
    (pushed,) = expected_balancedness(window, [d.phy2log], gpus=G, ahead=ahead)
    assert d.predicted_after == pytest.approx(pushed.mean())
    assert d.predicted_after > routed_balancedness(window, d.phy2log, gpus=G).mean()
    # and the gain-versus-stall rule uses the same figures
    assert d.gain_s == pytest.approx(policy.horizon_steps * 1.0 * policy.moe_time_fraction
                                     * (1 - d.predicted_after / d.predicted_before))
