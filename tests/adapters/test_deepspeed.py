"""DeepSpeed 0.19 MoE on the CPU accelerator, 2 gloo ranks, expert parallel: exact counts."""

from __future__ import annotations

import pytest
import torch

from tests.ranks import run_ranks

pytestmark = [pytest.mark.torch, pytest.mark.slow]
WORLD = 2


def test_each_expert_parallel_rank_counts_its_gates_decisions_exactly(tmp_path):
    ranks = run_ranks("tests.adapters.ds_worker", tmp_path, WORLD, timeout=240, env={"DS_ACCELERATOR": "cpu"})
    assert ranks[0]["layers"] == [f"layers.{i}.deepspeed_moe" for i in range(3)]
    for got in ranks:
        assert torch.equal(got["counts"], got["exp_counts"])  # DeepSpeed's own exp_counts
        assert torch.equal(got["counts"], got["reference"])  # recomputed from the logits
        assert got["counts"].sum(1).tolist() == [2 * (12 + 7 + 20)] * 3
    assert not torch.equal(ranks[0]["counts"], ranks[1]["counts"])
