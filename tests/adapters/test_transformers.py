"""attach() on real tiny transformers 5.x MoE models: exact counts, untouched outputs."""

from __future__ import annotations

import pytest
import torch

from moeplane.agents.sdk.adapters.transformers_layout import num_experts
from moeplane.torch import WatchError, attach
from tests.adapters.hf_models import FAMILIES, batch, build

pytestmark = pytest.mark.torch
LAYERS, EXPERTS, TOP_K = 3, 8, 2


def reference(model, ids: torch.Tensor) -> torch.Tensor:
    """``[L, E]`` counts recomputed from the routers' own logits (``output_router_logits``;
    DeepSeek-V3, whose model class does not return them, through a hook on its router)."""
    layers = [m for m in model.modules() if hasattr(m, "experts") and hasattr(m, "shared_experts")]
    if type(model).__name__.startswith("Deepseek"):
        logits = []
        hooks = [m.gate.register_forward_hook(lambda m, a, out: logits.append(out[0]))
                 for m in layers]
        with torch.no_grad():
            model(ids)
        for hook in hooks:
            hook.remove()
        chosen = [_deepseek_topk(m.gate, lg) for m, lg in zip(layers, logits, strict=True)]
    else:
        with torch.no_grad():
            out = model(ids, output_router_logits=True)
        k = model.config.num_experts_per_tok
        chosen = [torch.topk(lg, k, dim=-1).indices for lg in out.router_logits]
    e = num_experts(model.config)
    return torch.stack([torch.bincount(c.flatten(), minlength=e) for c in chosen])


def _deepseek_topk(gate, logits: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3's group-limited top-k on sigmoid scores plus the correction bias."""
    scores = logits.sigmoid() + gate.e_score_correction_bias
    groups = scores.view(-1, gate.num_group, gate.num_experts // gate.num_group)
    group_score = groups.topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_score).scatter_(
        1, group_score.topk(gate.topk_group, dim=-1).indices, 1).bool()
    masked = groups.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(-1, gate.num_experts)
    return masked.topk(gate.top_k, dim=-1).indices


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_counts_equal_the_routers_own_choice_and_outputs_are_untouched(family):
    model = build(family, layers=LAYERS, experts=EXPERTS, top_k=TOP_K)
    ids = batch(seed=1)
    with torch.no_grad():
        before = model(ids).logits
    want = reference(model, ids)
    watch = attach(model)
    with torch.no_grad():
        after = model(ids).logits
    counts = watch.take()
    assert torch.equal(before, after)  # bit-identical
    dense = 1 if family == "deepseek_v3" else 0
    assert watch.layers == [f"model.layers.{i}.mlp" for i in range(dense, LAYERS)]
    assert counts.dtype == torch.int64 and counts.device.type == "cpu"
    assert counts.shape == (LAYERS - dense, EXPERTS)
    assert torch.equal(counts, want)
    assert int(counts.sum()) == (LAYERS - dense) * ids.numel() * TOP_K
    assert int(watch.take().sum()) == 0  # take() resets
    watch.detach()
    with torch.no_grad():
        model(ids)
    assert int(watch.take().sum()) == 0  # detached: nothing counted


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_accumulation_counts_every_micro_batch_and_checkpointing_none_twice(reentrant):
    model = build("qwen3_moe", layers=LAYERS, experts=EXPERTS, top_k=TOP_K)
    micro = [batch(seed=s, batch_size=b, seq=n) for s, b, n in [(1, 2, 12), (2, 1, 7), (3, 3, 5)]]
    want = sum(reference(model, ids) for ids in micro)
    model.train()
    model.activation_checkpointing_enable({"use_reentrant": reentrant})
    calls = [0]
    experts = [m.experts for m in model.modules() if hasattr(m, "experts")]
    for module in experts:
        module.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    watch = attach(model)
    for ids in micro:
        model(ids, labels=ids).loss.backward()
    assert calls[0] == 2 * LAYERS * len(micro)  # every forward re-ran in backward
    assert torch.equal(watch.take(), want)


def test_training_steps_keep_counting_exactly():
    model = build("mixtral", layers=2, experts=4, top_k=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = attach(model)
    for step in range(3):
        ids = batch(seed=10 + step)
        model.eval()
        want = reference(model, ids)
        watch.take()  # drop the reference forward's counts
        model.train()
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert torch.equal(watch.take(), want)


def test_a_model_without_moe_layers_is_refused_by_name():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(WatchError, match="^Sequential: no MoE layer found"):
        attach(model)


def test_bad_index_dtype_shape_and_out_of_range_ids_name_the_module():
    model = build("olmoe", layers=2, experts=EXPERTS)
    watch = attach(model)
    experts = model.model.layers[1].mlp.experts
    hidden = torch.zeros(4, 32)
    weights = torch.full((4, TOP_K), 0.5)
    with pytest.raises(WatchError, match=r"^model\.layers\.1\.mlp\.experts: top_k_index has "
                                         r"dtype torch\.float32"):
        experts(hidden, torch.zeros(4, TOP_K), weights)
    with pytest.raises(WatchError, match=r"^model\.layers\.1\.mlp\.experts: top_k_index has "
                                         r"shape \[8\]"):
        experts(hidden, torch.zeros(8, dtype=torch.int64), weights)
    # the eager experts skip id E (transformers' masked-slot id), so the model runs; take refuses
    experts(hidden, torch.tensor([[0, 1], [2, EXPERTS], [3, 4], [5, 6]]), weights)
    with pytest.raises(WatchError, match=r"outside \[0, 8\) in model\.layers\.1\.mlp\.experts "
                                         r"\(1 ids\)"):
        watch.take()


def test_layers_changed_after_attach_are_an_error_at_take():
    model = build("qwen2_moe", layers=LAYERS, experts=EXPERTS)
    watch = attach(model)
    model.model.layers[1].mlp.experts = type(model.model.layers[1].mlp.experts)(model.config)
    with pytest.raises(WatchError, match=r"model\.layers\.1\.mlp\.experts was replaced or "
                                         "removed after attach"):
        watch.take()
    model = build("qwen2_moe", layers=LAYERS, experts=EXPERTS)
    watch = attach(model)
    model.model.layers.append(build("qwen2_moe", layers=1, experts=EXPERTS).model.layers[0])
    with pytest.raises(WatchError, match=r"model\.layers had 3 modules at attach, now 4"):
        watch.take()
