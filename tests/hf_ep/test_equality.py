"""Four real gloo processes train unmodified transformers MoE models put into expert parallelism;
the math is that of the unmodified model trained on the global batch in one process, with and
without a live placement change at step 10; each rank holds only its slots' expert weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.hf_ep import ep_worker
from tests.ranks import run_ranks

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(900)]  # a loaded 2-core box
WORLD = 4
FAMILIES = ["qwen3_moe", "qwen3_moe@grouped_mm", "mixtral", "olmoe", "deepseek_v3", "gpt_oss"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks("tests.hf_ep.ep_worker", tmp_path_factory.mktemp("hf_ep"), WORLD,
                     ",".join(FAMILIES))


def gathered(ranks: list[dict], family: str, run: str) -> dict:
    """(layer, expert) -> every replica's fused tensors, over all ranks."""
    out: dict = {}
    for result in ranks:
        for key, replicas in result[family][run]["weights"].items():
            out.setdefault(key, []).extend(replicas)
    return out


@pytest.mark.parametrize("run", ["static", "moved"])
@pytest.mark.parametrize("family", FAMILIES)
def test_training_matches_the_unmodified_model_on_the_global_batch(ranks, family, run):
    ref = ranks[0][family]["reference"]
    ep = ranks[0][family][run]
    assert len(ep["losses"]) == len(ref["losses"]) == ep_worker.STEPS
    np.testing.assert_allclose(ep["losses"], ref["losses"], rtol=1e-4, atol=0)
    assert ref["losses"][-1] < ref["losses"][0] - 0.1  # it trained: the weights moved
    weights = gathered(ranks, family, run)
    assert set(weights) == set(ref["weights"])
    for key, replicas in weights.items():
        for replica in replicas:
            for got, want in zip(replica, ref["weights"][key], strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=f"{key}")
    for name, want in ref["dense"].items():
        for result in ranks:
            torch.testing.assert_close(result[family][run]["dense"][name], want, rtol=0,
                                       atol=1e-5, msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_placement_change_moved_experts_and_changed_replica_counts(ranks, family):
    moved = ranks[0][family]["moved"]
    kinds = [r[0] for r in moved["reports"]]
    assert kinds == ["rejected", "applied"]
    assert "phy2log" in moved["reports"][0][1] and "shape" in moved["reports"][0][1]
    assert moved["reports"][1][2] == ep_worker.MOVE_AT  # the first step on the new placement
    np.testing.assert_array_equal(moved["phy2log"], ep_worker.MOVED)
    replicas = {k: len(v) for k, v in gathered(ranks, family, "moved").items()}
    want = {(layer, e): int((ep_worker.MOVED[layer] == e).sum())
            for layer in range(ep_worker.LAYERS) for e in range(ep_worker.EXPERTS)}
    assert replicas == want


@pytest.mark.parametrize("family", FAMILIES)
def test_each_rank_holds_only_its_slots_expert_bytes(ranks, family):
    one = ranks[0][family]["reference"]["one_expert_bytes"]
    assert one > 0
    for result in ranks:
        for run in ("static", "moved"):
            got = result[family][run]["expert_bytes"]
            assert got == ep_worker.LAYERS * ep_worker.SLOTS * one


@pytest.mark.parametrize("family", FAMILIES)
def test_loads_are_counted_per_layer_and_expert(ranks, family):
    # every rank counts its own tokens' choices: layers x tokens x top-k per step, unreset
    per_rank = ep_worker.LAYERS * ep_worker.SHARD * ep_worker.SEQ * ep_worker.TOP_K
    for result in ranks:
        assert result[family]["static"]["counter_total"] == per_rank * ep_worker.STEPS
