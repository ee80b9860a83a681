import numpy as np
import pytest

from moeplane.controlplane.balancing import (
    balancedness,
    count_moves,
    eplb_greedy,
    gpu_loads,
    replica_counts,
)


def test_gpu_loads_split_tokens_evenly_across_replicas():
    loads = np.array([[60.0, 30.0, 10.0]])
    # GPU 0 holds expert 0 twice; GPU 1 holds 0, 1; GPU 2 holds 2 and 1
    phy2log = np.array([[0, 0, 0, 1, 2, 1]])
    np.testing.assert_array_equal(replica_counts(phy2log, 3), [[3, 2, 1]])
    np.testing.assert_allclose(gpu_loads(loads, phy2log, 3), [[40.0, 35.0, 25.0]])
    assert balancedness(loads, phy2log, 3) == pytest.approx(40.0 / (100.0 / 3))


def test_layer_without_load_counts_as_balanced():
    loads = np.zeros((2, 4))
    loads[1] = [4, 0, 0, 0]
    phy2log = np.tile(np.arange(4), (2, 1))
    assert balancedness(loads, phy2log, 2) == pytest.approx((1.0 + 2.0) / 2)


def test_count_moves_counts_new_gpu_expert_pairs_only():
    before = np.array([[0, 1, 2, 3]])
    assert count_moves(before, np.array([[1, 0, 3, 2]]), 2, 4).tolist() == [0]
    assert count_moves(before, np.array([[2, 1, 0, 3]]), 2, 4).tolist() == [2]
    # re-pointing a slot to an expert the GPU lacks is one move
    assert count_moves(before, np.array([[0, 1, 2, 0]]), 2, 4).tolist() == [1]


def test_eplb_greedy_follows_the_published_rule():
    loads = np.array([[90.0, 40.0, 30.0, 20.0]])
    phy2log = eplb_greedy(loads, gpus=2, slots_per_gpu=3)
    # two redundant slots: 90 -> 45 (2 replicas), then 45 > 40 -> 30 (3 replicas)
    np.testing.assert_array_equal(replica_counts(phy2log, 4), [[3, 1, 1, 1]])
    # replicas 40, 30, 30, 30, 30, 20 packed heaviest first into the lightest GPU
    # 40->g0, 30->g1, 30->g1, 30->g0, 30->g1 (g1 full), 20->g0
    np.testing.assert_allclose(gpu_loads(loads, phy2log, 2)[0], [90.0, 90.0])
