"""One rank of the DeepSpeed MoE scenario of test_deepspeed.py (CPU accelerator, gloo).

Run as ``python -m tests.adapters.ds_worker OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. Builds 3 ``deepspeed.moe.layer.MoE`` layers (8 experts, top-2 without the
second-expert sampling, expert parallel over all ranks), runs 3 forwards and a backward on this
rank's own tokens, and writes ``OUT_DIR/rank{r}.pt``: ``take()``, the sum of the ``exp_counts``
DeepSpeed returned, and the counts recomputed from each gate's logits.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from torch import nn  # noqa: E402

from moeplane.torch import attach  # noqa: E402

H, E, K, LAYERS = 16, 8, 2, 3


class Net(nn.Module):
    def __init__(self, world: int):
        super().__init__()
        self.layers = nn.ModuleList(
            MoE(hidden_size=H, expert=nn.Sequential(nn.Linear(H, H), nn.GELU()), num_experts=E,
                ep_size=world, k=K, min_capacity=256, top2_2nd_expert_sampling=False)
            for _ in range(LAYERS))
        self.exp_counts: list[torch.Tensor] = []

    def forward(self, x):
        for layer in self.layers:
            out, _, counts = layer(x)
            self.exp_counts.append(counts)
            x = x + out
        return x


def main(out: str) -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = Net(world)
    for layer in net.layers:
        layer.set_deepspeed_parallelism()
    logits = [[] for _ in range(LAYERS)]  # the gate computes F.linear(input, wg.weight)
    for i, layer in enumerate(net.layers):
        layer.deepspeed_moe.gate.register_forward_pre_hook(
            lambda m, a, i=i: logits[i].append(a[0].detach().float() @ m.wg.weight.detach().T))
    watch = attach(net)
    gen = torch.Generator().manual_seed(10 + rank)
    for tokens in (12, 7, 20):
        net(torch.randn(tokens, H, generator=gen)).sum().backward()
    reference = torch.stack([
        torch.bincount(torch.topk(torch.cat(lg), K, dim=-1).indices.flatten(), minlength=E)
        for lg in logits])
    exp_counts = torch.stack([sum(net.exp_counts[i::LAYERS]) for i in range(LAYERS)])
    torch.save({"layers": watch.layers, "counts": watch.take(), "exp_counts": exp_counts,
                "reference": reference}, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
