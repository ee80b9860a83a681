"""The SDK's device routing computes route_replicas' division and splits it local-first."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moeplane.agents.sdk.routing import DeviceRouting
from moeplane.controlplane.balancing import route_replicas

pytestmark = pytest.mark.torch

CASES = [(4, 3, 8, 2), (8, 5, 32, 4), (6, 4, 6, 3), (8, 2, 16, 8), (4, 6, 16, 1)]


def _case(rng, gpus, spg, experts):
    row = rng.permutation(
        np.concatenate([np.arange(experts), rng.integers(0, experts, size=gpus * spg - experts)])
    )
    return row, rng.integers(0, 400, size=(gpus, experts))


@pytest.mark.parametrize("gpus,spg,experts,per_node", CASES)
def test_quotas_equal_route_replicas_and_every_sender_split_is_exact(gpus, spg, experts, per_node):
    rng = np.random.default_rng(gpus * 7 + spg)
    for _ in range(6):
        row, gathered = _case(rng, gpus, spg, experts)
        loads = gathered.sum(axis=0)
        routing = DeviceRouting(row, gpus=gpus, num_experts=experts, ranks_per_node=per_node)
        quotas = routing.quotas(torch.as_tensor(loads)).numpy()
        np.testing.assert_array_equal(quotas, route_replicas(loads[None], row[None], gpus=gpus)[0])
        splits = np.stack([
            routing.sender_split(torch.as_tensor(gathered), torch.as_tensor(quotas), r).numpy()
            for r in range(gpus)
        ])
        assert (splits >= 0).all()
        np.testing.assert_array_equal(splits.sum(axis=0), quotas)  # every slot gets its quota
        per_sender = np.zeros((gpus, experts), dtype=np.int64)
        for r in range(gpus):
            np.add.at(per_sender[r], row, splits[r])
        np.testing.assert_array_equal(per_sender, gathered)  # every token sent once


def test_senders_fill_their_own_rank_then_their_node_first():
    # 4 ranks x 2 slots, 2 ranks a node; expert 0 on ranks 0, 1 and 3
    row = np.array([0, 1, 0, 2, 3, 4, 0, 5])
    gathered = np.zeros((4, 6), dtype=np.int64)
    gathered[:, 0] = [30, 0, 0, 30]
    gathered[:, 1:] = 10
    routing = DeviceRouting(row, gpus=4, num_experts=6, ranks_per_node=2)
    quotas = torch.as_tensor([20, 40, 20, 40, 40, 40, 20, 40])
    split = [routing.sender_split(torch.as_tensor(gathered), quotas, r).numpy() for r in range(4)]
    assert split[0][0] == 20 and split[0][2] == 10  # own slot full, rest on its node (rank 1)
    assert split[3][6] == 20 and split[3][2] == 10  # other node only after its own rank
    assert split[1][[0, 2, 6]].sum() == 0


def test_assign_sends_each_assignment_to_a_slot_of_its_expert_per_the_split():
    rng = np.random.default_rng(4)
    row, gathered = _case(rng, 4, 3, 8)
    routing = DeviceRouting(row, gpus=4, num_experts=8, ranks_per_node=4)
    quotas = routing.quotas(torch.as_tensor(gathered.sum(axis=0)))
    for rank in range(4):
        split = routing.sender_split(torch.as_tensor(gathered), quotas, rank)
        expert = torch.as_tensor(rng.permutation(np.repeat(np.arange(8), gathered[rank])))
        slot = routing.assign(expert, torch.bincount(expert, minlength=8), split).numpy()
        np.testing.assert_array_equal(row[slot], expert.numpy())
        np.testing.assert_array_equal(np.bincount(slot, minlength=12), split.numpy())


def test_ranks_per_node_must_divide_the_ranks():
    with pytest.raises(ValueError, match="ranks_per_node"):
        DeviceRouting(np.arange(8) % 4, gpus=4, num_experts=4, ranks_per_node=3)
