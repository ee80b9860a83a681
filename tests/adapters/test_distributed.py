"""Two real gloo ranks, data parallel: each rank counts the tokens it routed, exactly."""

from __future__ import annotations

import pytest
import torch

from tests.ranks import run_ranks

pytestmark = [pytest.mark.torch, pytest.mark.slow]
WORLD = 2


def test_each_data_parallel_rank_counts_its_own_tokens(tmp_path):
    ranks = run_ranks("tests.adapters.dist_worker", tmp_path, WORLD, timeout=240)
    assert ranks[0]["layers"] == ["module.model.layers.0.mlp", "module.model.layers.1.mlp"]
    for step in range(2):
        per_rank = [r["steps"][step] for r in ranks]
        for got in per_rank:
            assert torch.equal(got["counts"], got["reference"])
        assert not torch.equal(per_rank[0]["counts"], per_rank[1]["counts"])
        for got in per_rank:
            assert torch.equal(got["total"], got["reference_all"])
        # rank r routes 2 micro-batches of [2, 10 + r] tokens to 2 experts in 2 layers
        assert [int(g["counts"].sum()) for g in per_rank] == [2 * 2 * 2 * 2 * (10 + r)
                                                              for r in range(WORLD)]
