"""The torchtitan 0.3.0 scenario of test_torchtitan.py, in its own process (torchtitan's
expert-bias hook builds a device mesh, which needs a process group: one gloo rank here).

Run as ``python -m tests.adapters.titan_worker OUT`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set; writes OUT (a torch.save of the plain and the watched runs).
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist
import torchtitan.distributed.parallel_dims as titan_parallel_dims
import torchtitan.models.common.moe as titan_moe
from torch import nn
from torchtitan.components.optimizer.optimizer import register_moe_load_balancing_hook
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.models.common.linear import Linear
from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher

from moeplane.torch import attach

D, F, E, K, LAYERS = 16, 32, 8, 2, 3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.moe_enabled = True
        self.moe = titan_moe.MoE.Config(
            num_experts=E, load_balance_coeff=1e-2,
            routed_experts=titan_moe.RoutedExperts.Config(
                inner_experts=titan_moe.GroupedExperts.Config(dim=D, hidden_dim=F, num_experts=E),
                token_dispatcher=LocalTokenDispatcher.Config(num_experts=E, top_k=K)),
            router=titan_moe.TokenChoiceTopKRouter.Config(
                num_experts=E, gate=Linear.Config(in_features=D, out_features=E), top_k=K),
        ).build()

    def forward(self, x):
        return x + self.moe(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x


def train(watched: bool):
    """3 steps of 2 micro-batches with torchtitan's expert-bias optimizer pre-hook."""
    torch.manual_seed(0)
    net = Net()
    for p in net.parameters():
        nn.init.normal_(p, std=0.2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1)
    register_moe_load_balancing_hook(opt, [net], dims)
    routed: list[list[torch.Tensor]] = [[] for _ in range(LAYERS)]
    for i, block in enumerate(net.layers.values()):
        block.moe.router.register_forward_hook(lambda m, a, out, i=i: routed[i].append(out[1]))
    watch = attach(net) if watched else None
    steps, gen = [], torch.Generator().manual_seed(1)
    for _ in range(3):
        for tokens in (5, 9):
            net(torch.randn(2, tokens, D, generator=gen)).square().mean().backward()
        titan_counts = torch.stack([b.moe.tokens_per_expert_E.clone() for b in net.layers.values()])
        opt.step()  # the pre-hook reads and zeroes tokens_per_expert_E, updates expert_bias_E
        opt.zero_grad()
        reference = torch.stack([torch.bincount(torch.cat([t.flatten() for t in r]), minlength=E)
                                 for r in routed])
        for r in routed:
            r.clear()
        steps.append({"titan": titan_counts, "reference": reference,
                      "bias": torch.stack([b.moe.expert_bias_E.clone()
                                           for b in net.layers.values()]),
                      "counts": watch.take() if watched else None})
    return steps, watch



def main(out: str) -> None:
    warnings.filterwarnings("ignore", "In CPU autocast")  # its router asks for fp32 autocast
    dist.init_process_group("gloo")
    # hardware edge: torchtitan falls back to "cuda" when it finds no accelerator; its device
    # mesh is the CPU's here (gloo)
    titan_parallel_dims.device_type = "cpu"
    plain, _ = train(watched=False)
    watched, watch = train(watched=True)
    torch.save({"plain": plain, "watched": watched, "layers": watch.layers}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
