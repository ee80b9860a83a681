"""Megatron-Core 0.16.1's TopKRouter (the newest megatron-core for Python 3.11).

Its forward cannot run on a CPU-only torch: ``Router.gating`` moves the router weight to
``torch.cuda.current_device()``. On CPU the test builds the real router, attaches, and feeds the
hook ``attach`` registered with the output of Megatron's own ``routing()`` (the function its
forward calls after the gate). The whole forward is tested where CUDA is available.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from moeplane.torch import WatchError, attach

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
    warnings.simplefilter("ignore")
    router_mod = pytest.importorskip("megatron.core.transformer.moe.router")
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.transformer_config import TransformerConfig

# megatron's own TransformerConfig defaults warn (deprecated cuda_graph_scope default, ...)
pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning:megatron")]
H, E, K, LAYERS = 16, 8, 2, 3


def routers(device: str) -> nn.Module:
    config = TransformerConfig(num_layers=LAYERS, hidden_size=H, num_attention_heads=2,
                               num_moe_experts=E, moe_router_topk=K, moe_ffn_hidden_size=32,
                               moe_router_load_balancing_type="none",
                               use_cpu_initialization=device == "cpu")
    groups = ProcessGroupCollection()
    for name in ("tp", "cp", "tp_cp", "tp_dp_cp"):  # one rank: no model-parallel groups
        setattr(groups, name, None)
    torch.manual_seed(0)
    model = nn.ModuleList(nn.ModuleDict({"router": router_mod.TopKRouter(config, groups)})
                          for _ in range(LAYERS))
    return model.to(device)


def test_routing_maps_of_megatrons_own_routing_are_counted_exactly():
    model = routers("cpu")
    watch = attach(model)
    assert watch.layers == [str(i) for i in range(LAYERS)]
    want = torch.zeros(LAYERS, E, dtype=torch.int64)
    for i, block in enumerate(model):
        router = block["router"]
        (hook,) = router._forward_hooks.values()
        for tokens in (6, 11):
            logits = torch.randn(tokens, 1, E)
            probs, routing_map = router.routing(logits)
            hook(router, (logits,), {}, (probs, routing_map))
            want[i] += routing_map.sum(0)
    counts = watch.take()
    assert torch.equal(counts, want)
    assert counts.sum(1).tolist() == [(6 + 11) * K] * LAYERS
    router = model[0]["router"]
    (hook,) = router._forward_hooks.values()
    with pytest.raises(WatchError, match=r"^0\.router: router output's routing_map is "
                                         r"torch\.float32 \[4, 8\]"):
        hook(router, (), {}, (None, torch.zeros(4, E)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Megatron's router forward needs CUDA")
def test_router_forward_on_cuda_is_counted_exactly():
    model = routers("cuda")
    watch = attach(model)
    want = torch.zeros(LAYERS, E, dtype=torch.int64)
    for i, block in enumerate(model):
        _, routing_map = block["router"](torch.randn(7, 2, H, device="cuda"))
        want[i] = routing_map.sum(0).cpu()
    assert torch.equal(watch.take(), want)
