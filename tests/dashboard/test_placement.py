import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeplane.dashboard.placement import (
    identity_phy2log,
    layer_balancedness,
    rank_loads,
    replica_counts,
    slot_loads,
)


def test_identity_placement_wraps_extra_slots_onto_first_experts():
    p = identity_phy2log(2, 5, 3)  # S = ceil(5/3) = 2, 6 slots
    assert p.shape == (2, 6)
    assert p[0].tolist() == [0, 1, 2, 3, 4, 0]
    assert (p[0] == p[1]).all()
    assert replica_counts(p, 5)[0].tolist() == [2, 1, 1, 1, 1]


def test_identity_placement_validates_arguments():
    with pytest.raises(ValueError, match="slots_per_rank"):
        identity_phy2log(1, 10, 2, slots_per_rank=4)
    for kwargs, name in (({"layers": 0}, "layers"), ({"experts": 0}, "experts"), ({"ranks": 0}, "ranks")):
        args = {"layers": 1, "experts": 4, "ranks": 2} | kwargs
        with pytest.raises(ValueError, match=name):
            identity_phy2log(**args)


def test_rank_loads_split_replicated_experts_evenly():
    loads = np.array([[10, 4, 6, 0, 2]])
    p = identity_phy2log(1, 5, 3)  # rank0: e0 e1, rank1: e2 e3, rank2: e4 e0
    assert slot_loads(loads, p).tolist() == [[5, 4, 6, 0, 2, 5]]
    assert rank_loads(loads, p, 3).tolist() == [[9, 6, 7]]


def test_balancedness_is_max_over_mean_per_layer_then_mean():
    per_rank = np.array([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert layer_balancedness(per_rank).tolist() == [1.0, 4.0, 1.0]
    assert layer_balancedness(per_rank).mean() == pytest.approx(2.0)


def test_bad_shapes_and_ids_name_the_argument():
    with pytest.raises(ValueError, match="loads"):
        rank_loads(np.zeros(4), np.zeros((1, 4), dtype=int), 2)
    with pytest.raises(ValueError, match="phy2log"):
        rank_loads(np.zeros((2, 4)), np.zeros((1, 4), dtype=int), 2)
    with pytest.raises(ValueError, match="ranks"):
        rank_loads(np.zeros((1, 4)), np.zeros((1, 4), dtype=int), 3)
    with pytest.raises(ValueError, match="phy2log"):
        rank_loads(np.zeros((1, 4)), np.full((1, 4), 4), 2)
    with pytest.raises(ValueError, match="per_rank"):
        layer_balancedness(np.zeros(3))


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 4),
    experts=st.integers(1, 40),
    ranks=st.integers(1, 12),
    extra=st.integers(0, 3),
    seed=st.integers(0, 2**31),
)
def test_placement_conserves_tokens(layers, experts, ranks, extra, seed):
    rng = np.random.default_rng(seed)
    loads = rng.integers(0, 1000, size=(layers, experts))
    slots = -(-experts // ranks) + extra
    p = identity_phy2log(layers, experts, ranks, slots)
    per_rank = rank_loads(loads, p, ranks)
    assert per_rank.shape == (layers, ranks)
    np.testing.assert_allclose(per_rank.sum(axis=1), loads.sum(axis=1))
    assert (layer_balancedness(per_rank) >= 1.0 - 1e-12).all()
    assert (layer_balancedness(per_rank) <= ranks + 1e-9).all()
