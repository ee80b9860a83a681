from __future__ import annotations

import numpy as np
import pytest

from moeplane.agents.sim.workload import (
    ExpertLoadModel,
    WorkloadSpec,
    balancedness,
    gpu_loads,
    identity_phy2log,
    step_time_s,
)

SPEC = WorkloadSpec(layers=12, experts=64, top_k=8, world_size=16, tokens_per_rank=2048)


def test_counts_shape_sum_and_determinism():
    a, b = ExpertLoadModel(SPEC, seed=5), ExpertLoadModel(SPEC, seed=5)
    ca, cb = a.step(), b.step()
    assert ca.shape == (16, 12, 64) and ca.dtype == np.int64
    assert (ca.sum(axis=2) == 2048 * 8).all()
    assert np.array_equal(ca, cb)
    assert not np.array_equal(ca, ExpertLoadModel(SPEC, seed=6).step())


def test_popularity_is_skewed_with_a_few_hot_experts():
    p = ExpertLoadModel(SPEC, seed=1).popularity()
    ratio = p.max(axis=1) * SPEC.experts           # hottest expert / mean, per layer
    assert np.median(ratio) >= 3.0                   # several times the mean
    hot = (p * SPEC.experts > 2.0).sum(axis=1)
    assert (hot <= SPEC.experts // 4).all()          # ... and only a few of them
    assert (p.min(axis=1) > 0).all()


def test_adjacent_layers_are_correlated_and_distant_ones_less():
    p = ExpertLoadModel(SPEC, seed=2).popularity()
    z = np.log(p)

    def corr(gap):
        return np.mean([np.corrcoef(z[i], z[i + gap])[0, 1] for i in range(12 - gap)])

    assert corr(1) > 0.4
    assert corr(1) > corr(6) + 0.2


def test_drift_is_fast_early_and_slow_later():
    model = ExpertLoadModel(WorkloadSpec(layers=12, experts=64, top_k=8, world_size=1,
                                         tokens_per_rank=16), seed=3)

    def drift_over(steps):
        before = model.popularity()
        for _ in range(steps):
            model.step()
        return np.abs(model.popularity() - before).sum(axis=1).mean()

    early = drift_over(50)
    for _ in range(1500):
        model.step()
    late = drift_over(50)
    assert early > 3 * late > 0


def test_multinomial_noise_varies_between_ranks():
    counts = ExpertLoadModel(SPEC, seed=4).step()
    assert not np.array_equal(counts[0], counts[1])


def test_placement_arithmetic():
    phy2log, slots = identity_phy2log(2, 6, 4)
    assert slots == 2 and phy2log.shape == (2, 8)
    assert phy2log[0].tolist() == [0, 1, 2, 3, 4, 5, 0, 1]
    loads = np.array([[10, 10, 10, 10, 10, 10], [60, 0, 0, 0, 0, 0]], dtype=np.int64)
    per_gpu = gpu_loads(loads, phy2log, 4)
    # experts 0 and 1 have two replicas: their load splits evenly
    assert per_gpu.tolist() == [[10, 20, 20, 10], [30, 0, 0, 30]]
    assert balancedness(per_gpu) == pytest.approx((20 / 15 + 30 / 15) / 2)
    assert step_time_s(1.0, 1.0) == 1.0 and step_time_s(1.0, 2.0) == 1.5


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="top_k"):
        WorkloadSpec(layers=1, experts=4, top_k=5, world_size=1)
    with pytest.raises(ValueError, match="layers"):
        WorkloadSpec(layers=0, experts=4, top_k=1, world_size=1)
    with pytest.raises(ValueError, match="without a slot"):
        gpu_loads(np.ones((1, 3)), np.zeros((1, 4), np.int64), 2)
