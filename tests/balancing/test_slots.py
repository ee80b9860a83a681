"""Plans that keep what stays: staying experts keep their slots; copies within a GPU counted."""

from __future__ import annotations

import numpy as np

from moeplane.controlplane.balancing import gpu_expert_counts, plan_placement
from moeplane.controlplane.balancing.slots import keep_slots, slot_changes

G, S, E, L = 4, 3, 8, 3


def _placement(rng):
    return np.stack([
        rng.permutation(np.r_[np.arange(E), rng.integers(0, E, G * S - E)]) for _ in range(L)
    ])


def test_keep_slots_keeps_the_most_slots_and_the_same_experts_per_gpu():
    rng = np.random.default_rng(0)
    for _ in range(100):
        ref, new = _placement(rng), _placement(rng)
        out = keep_slots(ref, new, G)
        np.testing.assert_array_equal(gpu_expert_counts(out, G, E), gpu_expert_counts(new, G, E))
        for lay in range(L):
            for g in range(G):
                a, b, o = (x[lay, g * S:(g + 1) * S] for x in (ref, new, out))
                most = sum(min((a == e).sum(), (b == e).sum()) for e in set(a.tolist()))
                assert (a == o).sum() == most
        assert (slot_changes(ref, out, G) <= slot_changes(ref, new, G)).all()


def test_slot_changes_count_copies_within_a_gpu_only():
    ref = np.array([[0, 1, 2, 3]])  # 2 GPUs x 2 slots
    assert slot_changes(ref, np.array([[1, 0, 2, 3]]), 2).tolist() == [2]  # swapped in GPU 0
    assert slot_changes(ref, np.array([[0, 0, 2, 1]]), 2).tolist() == [1]  # 0 again; 1 moved
    assert slot_changes(ref, keep_slots(ref, np.array([[1, 0, 3, 2]]), 2), 2).tolist() == [0]


def test_an_incremental_plan_moves_no_staying_expert_within_its_gpu():
    rng = np.random.default_rng(3)
    loads = rng.gamma(0.7, 100.0, size=(6, 32))
    current = plan_placement(loads, gpus=8, slots_per_gpu=5).phy2log
    plan = plan_placement(loads * rng.uniform(0.3, 3.0, size=loads.shape), gpus=8,
                          slots_per_gpu=5, current=current)
    assert plan.moves > 0
    np.testing.assert_array_equal(plan.slot_changes_per_layer, slot_changes(current, plan.phy2log, 8))
    for lay in range(6):
        for g in range(8):
            a, b = current[lay, 5 * g:5 * g + 5], plan.phy2log[lay, 5 * g:5 * g + 5]
            kept = sum(min((a == e).sum(), (b == e).sum()) for e in set(a.tolist()))
            assert (a == b).sum() == kept
