"""One rank of the 4-process gloo scenario of test_equality.py (and its single-process reference).

Run as ``python -m tests.hf_ep.ep_worker OUT_DIR FAMILY[@IMPL][,...]`` with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set. For each family, trains the tiny model of
:mod:`tests.adapters.hf_models` with AdamW for ``STEPS`` steps, each rank on its shard of the
global batch, twice from the same seed:

- "static": ``expert_parallel`` with the identity placement throughout;
- "moved": at step ``MOVE_AT`` ``ep.apply`` moves experts between ranks and changes replica counts.

Rank 0 then trains the unmodified model in this one process on the global batch ("reference").
Writes ``OUT_DIR/rank{r}.pt``: per family and run, the losses (mean over the global batch), every
local replica's fused expert weights per (layer, expert), the dense parameters, expert bytes.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

from moeplane.agents.sdk.adapters import transformers_layout as layout_of
from moeplane.torch import PlanRejected, expert_parallel
from tests.adapters import hf_models

EXPERTS, TOP_K, LAYERS, SLOTS = 8, 2, 2, 3
STEPS, MOVE_AT, SHARD, SEQ, LR = 20, 10, 2, 12, 1e-3
SEED = 7

#: the placement change at MOVE_AT: layer 0 gives expert 5 three replicas (two on rank 0) and
#: experts 0-3 one each; layer 1 rotates the ranks' contents and keeps expert 7 replicated
MOVED = np.array([[5, 5, 1, 2, 3, 0, 4, 6, 5, 7, 6, 4],
                  np.roll(np.arange(12) % 8, 4).tolist()], dtype=np.int64)


def build(family: str):
    """``family`` or ``family@implementation`` (the experts implementation; default eager)."""
    family, _, implementation = family.partition("@")
    model = hf_models.build(family, layers=LAYERS + (family == "deepseek_v3"), experts=EXPERTS,
                            top_k=TOP_K, seed=SEED)
    if implementation:
        model.config._experts_implementation = implementation
    return model.train()


def global_batch(step: int, world: int) -> torch.Tensor:
    """``[world*SHARD, SEQ]`` token ids of step ``step``; rank r trains rows r*SHARD...

    Learnable: each row counts up from a random start with a random stride of 1 to 3.
    """
    gen = torch.Generator().manual_seed(SEED * 1000 + step)
    start = torch.randint(0, hf_models.VOCAB, (world * SHARD, 1), generator=gen)
    stride = torch.randint(1, 4, (world * SHARD, 1), generator=gen)
    return (start + stride * torch.arange(SEQ)) % hf_models.VOCAB


def expert_weights_reference(model) -> dict:
    """(layer, expert) -> [fused tensors] of the unmodified model."""
    out = {}
    for i, layer in enumerate(layout_of.moe_layers(model)):
        names = layout_of.expert_layout(layer.experts).params
        for e in range(EXPERTS):
            out[(i, e)] = [getattr(layer.experts, n)[e].detach().clone() for n in names]
    return out


def dense_weights(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()
            if ".experts." not in n}


def train_ep(family: str, moved: bool) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    model = build(family)
    ep = expert_parallel(model, slots_per_rank=SLOTS)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, reports = [], []
    for step in range(STEPS):
        if moved and step == MOVE_AT:
            try:  # bad input first: rejected on every rank, training continues
                ep.apply(MOVED[:1], optimizer=opt)
            except PlanRejected as exc:
                reports.append(("rejected", str(exc)))
            report = ep.apply(MOVED, optimizer=opt)
            reports.append(("applied", report.epoch, report.step))
        tokens = global_batch(step, world)[rank * SHARD : (rank + 1) * SHARD]
        loss = model(input_ids=tokens, labels=tokens).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        ep.sync_gradients()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    weights: dict = {}
    expert_bytes = 0
    for block in ep.blocks:
        params = block.expert_parameters()
        expert_bytes += sum(p.numel() * p.element_size() for p in params)
        for slot, e in enumerate(block.local_experts().tolist()):
            weights.setdefault((block.layer, e), []).append(
                [p[slot].detach().clone() for p in params])
    return {"losses": losses, "weights": weights, "dense": dense_weights(model),
            "phy2log": ep.phy2log(), "reports": reports, "expert_bytes": expert_bytes,
            "counter_total": int(ep.counter.sum())}


def train_reference(family: str, world: int) -> dict:
    model = build(family)
    one_expert_bytes = sum(
        p[0].numel() * p.element_size()
        for layer in layout_of.moe_layers(model) for p in layer.experts.parameters()
    ) // LAYERS
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        tokens = global_batch(step, world)
        loss = model(input_ids=tokens, labels=tokens).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return {"losses": losses, "weights": expert_weights_reference(model),
            "dense": dense_weights(model), "one_expert_bytes": one_expert_bytes}


def main(out_dir: str, families: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict = {}
    for family in families.split(","):
        result[family] = {"static": train_ep(family, False), "moved": train_ep(family, True)}
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        for family in families.split(","):
            result[family]["reference"] = train_reference(family, world)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
