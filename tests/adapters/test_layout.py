"""transformers_layout finds the MoE blocks of real tiny transformers 5.x models."""

from __future__ import annotations

import pytest

from moeplane.agents.sdk.adapters import transformers_layout as tl
from tests.adapters.hf_models import FAMILIES, build

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_finds_every_moe_block_in_order(family):
    model = build(family, layers=3, experts=8)
    layers = tl.moe_layers(model)
    first = 1 if family == "deepseek_v3" else 0  # its first layer is dense
    assert [layer.path for layer in layers] == [f"model.layers.{i}.mlp" for i in range(first, 3)]
    router = "router" if family == "gpt_oss" else "gate"
    for layer in layers:
        assert layer.experts_path == layer.path + ".experts"
        assert layer.router_path == f"{layer.path}.{router}"
        assert layer.router is layer.block.get_submodule(router)
    assert tl.num_experts(model.config) == 8
    assert tl.top_k(model.config) == 2
    layout = tl.expert_layout(layers[0].experts)
    assert layout.num_experts == 8
    assert all(shape[0] == 8 for shape in layout.shapes)
    assert "down_proj" in layout.params
    assert layout.is_transposed == (family == "gpt_oss")
    assert layout.has_bias == (family == "gpt_oss")


def test_no_moe_layer_and_bad_config():
    from torch import nn

    assert tl.moe_layers(nn.Sequential(nn.Linear(2, 2))) == []

    class Cfg:
        num_experts = 0
        num_experts_per_tok = None

    with pytest.raises(ValueError, match="Cfg: no expert count"):
        tl.num_experts(Cfg())
    with pytest.raises(ValueError, match="Cfg: num_experts_per_tok is None"):
        tl.top_k(Cfg())
