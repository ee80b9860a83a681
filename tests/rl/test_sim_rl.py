"""The simulated RL job: the idle analysis recovers its ground truth, and the modes have the
published shape (async beats colocated 1.5-2.8x in tokens per second; idle falls as the
staleness bound rises)."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.agents.sim.rl import RLSimConfig, simulate
from moeplane.controlplane.rl import idle


@pytest.mark.parametrize("mode,k", [("colocated", 0), ("one-step-off", 1), ("async", 0), ("async", 2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_idle_analysis_matches_the_simulated_truth_within_2_percent_of_wall(mode, k, seed):
    sim = simulate(RLSimConfig(mode=mode, staleness=k, seed=seed))
    rep = idle.analyze(sim.spans)
    np.testing.assert_allclose(rep.wall, sim.wall, rtol=1e-9)
    error = np.abs(rep.idle_cause - sim.truth_idle).sum(axis=2)  # [S, D] seconds, over every cause
    assert (error <= 0.02 * sim.wall[:, None]).all(), error.max()
    assert sim.truth_idle.sum() > 0  # there is idle time to find


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_async_beats_colocated_like_the_published_systems(seed):
    colocated = simulate(RLSimConfig(mode="colocated", seed=seed)).tokens_per_s
    async_ = simulate(RLSimConfig(mode="async", staleness=1, seed=seed)).tokens_per_s
    assert 1.5 <= async_ / colocated <= 2.8, async_ / colocated


def test_idle_falls_as_the_staleness_bound_rises():
    fractions = []
    for k in (0, 1, 2, 4):
        sim = simulate(RLSimConfig(mode="async", staleness=k, steps=16))
        fractions.append(idle.analyze(sim.spans).summary()["black_hole_fraction"])
        assert sim.lag.max() <= k
    assert fractions[1] < fractions[0] and bool(np.all(np.diff(fractions) <= 1e-12))


def test_colocated_generation_tail_is_where_the_idle_goes():
    rep = idle.analyze(simulate(RLSimConfig(mode="colocated")).spans)
    s = rep.summary()
    assert s["bottleneck"] == "rollout" and s["idle_by_cause_s"]["generation_tail"] == pytest.approx(
        rep.idle.sum()) and s["switch_share"] > 0


def test_bad_configuration_names_the_field():
    with pytest.raises(ValueError, match="mode"):
        simulate(RLSimConfig(mode="sync"))
    with pytest.raises(ValueError, match="rollout_devices"):
        simulate(RLSimConfig(mode="async", rollout_devices=8))
