"""Bad input to expert_parallel and ep.apply raises a clear error before anything changes, on
every rank, and training continues on the placement it had (2 real gloo ranks)."""

from __future__ import annotations

import pytest

from tests.ranks import run_ranks

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(600)]  # a loaded 2-core box


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks("tests.hf_ep.bad_input_worker", tmp_path_factory.mktemp("bad"), 2)


@pytest.mark.parametrize(("case", "kind", "words"), [
    ("no_moe_layers", "ValueError", ["model", "Qwen3MoeForCausalLM", "no MoE layers"]),
    ("layout", "ValueError", ["model.layers.1.mlp.experts", "ListExperts", "not recognised"]),
    ("too_few_slots", "ValueError", ["slots_per_rank", "2 ranks x 3 slots < 8 experts"]),
    ("phy2log_shape", "PlacementError", ["phy2log", "shape (1, 10)", "(2, 10)"]),
    ("phy2log_unknown", "PlacementError", ["phy2log", "unknown expert id 8", "layer 1 slot 3"]),
    ("configs_differ", "ValueError", ["model.config", "ranks disagree"]),
    ("apply_old_epoch", "PlanRejected", ["plan.epoch", "epoch 1 is not newer than the running 1"]),
    ("apply_shape", "PlanRejected", ["phy2log", "shape (2, 9)"]),
    ("apply_unknown", "PlanRejected", ["phy2log", "unknown expert id 8"]),
])
def test_bad_input_raises_a_clear_error_and_changes_nothing(ranks, case, kind, words):
    for result in ranks:
        got_kind, message, unchanged = result[case]
        assert got_kind == kind, message
        for word in words:
            assert word in message
        assert unchanged, f"{case}: the model's parameters changed"


def test_training_continues_on_the_placement_it_had(ranks):
    for result in ranks:
        assert result["unchanged_class"] == "Qwen3MoeExperts"  # no layer was swapped
        assert result["submit_old_epoch"] is False
        assert "plan.epoch" in result["submit_old_report"]
        assert result["still_moved"] and result["epoch"] == 1
        assert result["loss_after"] > 0
        assert result["apply_after"] == 4  # epochs 2 and 3 were tried and rejected
