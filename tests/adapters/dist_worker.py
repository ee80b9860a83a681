"""One rank of the 2-process gloo data-parallel scenario of test_distributed.py.

Run as ``python -m tests.adapters.dist_worker OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. Trains a tiny transformers Qwen3-MoE under DistributedDataParallel with
``attach`` on the DDP wrapper, each rank on its own batches, two micro-batches a step, and
writes ``OUT_DIR/rank{r}.pt``: per step the rank's ``take()`` and the reference counts of its
own micro-batches, plus the counts all-reduced over the ranks and the reference of all ranks'
batches.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from moeplane.torch import attach
from tests.adapters.hf_models import batch, build

STEPS, MICRO = 2, 2


def reference(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
    return torch.stack([torch.bincount(torch.topk(lg, 2).indices.flatten(), minlength=8)
                        for lg in out.router_logits])


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build("qwen3_moe", layers=2, experts=8, top_k=2, seed=0)
    ddp = DistributedDataParallel(model)
    watch = attach(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    result = {"layers": watch.layers, "steps": []}
    for step in range(STEPS):
        micro = {r: [batch(seed=100 * step + 10 * r + m, seq=10 + r) for m in range(MICRO)]
                 for r in range(world)}
        model.eval()
        mine = sum(reference(model, ids) for ids in micro[rank])
        everyone = sum(reference(model, ids) for r in range(world) for ids in micro[r])
        watch.take()  # drop the reference forwards
        model.train()
        for m, ids in enumerate(micro[rank]):
            with ddp.no_sync() if m < MICRO - 1 else contextlib.nullcontext():
                ddp(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        counts = watch.take()
        total = counts.clone()
        dist.all_reduce(total)
        result["steps"].append({"counts": counts, "reference": mine, "total": total,
                                "reference_all": everyone})
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
